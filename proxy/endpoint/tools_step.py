"""Tools mode's step (docs/tools-mode.md): call the model, run its memory calls, call it again.

The client sees one answer: a JSON body (the last round's, the earlier rounds' text in
front, `X-Memory-Tool-Calls` saying how many memory calls ran) or one well-formed stream
(each round's text as it comes, never a memory call's events or a round's own start and
end). What it gets is what the relay reads and saves, as in inject mode. The wire's
tool format (proxy/wires/<wire>_tools.py) knows the shapes; this loop knows none.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from proxy.endpoint.steps import Replayed, open_upstream
from proxy.errors import ProxyError, UpstreamProtocolError, UpstreamTimeout
from proxy.memory.chat_memory import Recall
from proxy.memory.tools import NAMES, ROUNDS_USED, SCHEMAS, MemoryTools
from proxy.metrics import Metrics
from proxy.models import ToolCall
from proxy.http.responses import is_readable_sse, readable_body, stream_inflater
from proxy.http.upstream import StreamCut, Upstream, UpstreamResponse
from proxy.wires.sse import SSEDecoder
from proxy.wires.tool_rounds import CallOutcome, Round, ToolFormat

log = logging.getLogger("memproxy.tools")


@dataclass
class Loop:
    """Where one request's rounds stand."""

    body: dict[str, Any]  # the client's request with the memory tools
    offered: frozenset[str]
    rounds_allowed: int
    exchanges: list[Any]
    rounds: list[Round]  # the rounds whose memory calls were answered
    rounds_run: int = 0  # rounds whose memory calls ran
    refused: bool = False  # a round's memory calls got the error result
    forbidden: bool = False  # the next round is the last, with tool use forbidden
    calls_ran: int = 0
    last: Round | None = None  # the round that ended the step, once read
    logged: bool = False  # the rounds' queries and token totals went to the injection log


class ToolsStep:
    """The provider calls of one tools-mode request."""

    def __init__(self, upstream: Upstream, metrics: Metrics, fmt: ToolFormat, tools: MemoryTools, url: str,
                 headers: list[tuple[bytes, bytes]], tool_rounds: int, recall: Recall) -> None:
        self.upstream = upstream
        self.metrics = metrics
        self.fmt = fmt
        self.tools = tools
        self.url = url
        self.headers = headers
        self.tool_rounds = tool_rounds
        self.recall = recall  # the earlier steps' exchanges come from it, this step's go to it

    def start(self, client_body: dict[str, Any]) -> Loop:
        body, offered = self.fmt.offer(
            self.fmt.substitute(client_body, self.recall.echoes, self.recall.provider_response), NAMES, SCHEMAS)
        for name in NAMES:
            if name not in offered:
                log.info("tools mode: the client has its own %s tool; memproxy leaves its own out", name)
        return Loop(body, offered, self.tool_rounds, [], [])

    async def run(self, client_body: dict[str, Any], stream: bool) -> Any:
        """The response the client gets: JSON with every round done, or a stream that runs them as it goes."""
        loop = self.start(client_body)
        response = await self.open(loop)
        if stream and response.status == 200 and is_readable_sse(response):
            return RoundsStream(self, loop, response)
        try:
            return await self._json(loop, response)
        finally:
            self.rounds_done(loop)

    async def open(self, loop: Loop) -> UpstreamResponse:
        body = self.fmt.next_request(loop.body, loop.exchanges, loop.rounds, tools_forbidden=loop.forbidden)
        return await open_upstream(self.upstream, self.metrics, "POST", self.url, self.headers, body)

    async def _json(self, loop: Loop, response: UpstreamResponse) -> Any:
        while True:
            raw = await _read_whole(response)
            if response.status != 200:
                return Replayed(response, raw)  # the provider's error, as it came
            doc = _json_object(readable_body(response, raw))
            round_ = self.fmt.read_json(doc, loop.offered) if doc is not None else None
            if (doc is None or round_ is None) and loop.rounds:
                # The client would get a body it cannot read in place of every round's answer.
                raise UpstreamProtocolError("the provider's answer to a later round could not be read")
            if doc is None or round_ is None:
                return Replayed(response, raw)  # not an answer the loop can read: the client gets it as it is
            if not round_.memory_calls or loop.forbidden:
                self.keep_exchange(loop, round_)
                body = self.fmt.merged_json(doc, loop.rounds, loop.offered)
                return Merged(response, body, loop.calls_ran)
            await self.answer_calls(loop, round_)
            response = await self.open(loop)

    def keep_exchange(self, loop: Loop, last: Round) -> None:
        """This step's memory rounds and its last round's output, for the loop's next step to put back
        in place of the answer the client will echo (kept only with app calls: a final answer ends the
        turn)."""
        loop.last = last
        if loop.exchanges:
            self.recall.exchange = self.fmt.kept(loop.exchanges, loop.rounds, last)
            self.recall.provider_id = last.provider_id

    def rounds_done(self, loop: Loop) -> None:
        """The queries and the token totals over the rounds the provider answered, for the injection
        log: once, however the step ended (a later round refused or cut short included)."""
        if loop.logged:
            return
        loop.logged = True
        answered = [*loop.rounds, *([loop.last] if loop.last is not None else [])]
        totals: dict[str, int] = {}
        for round_ in answered:
            for name, count in round_.tokens.items():
                totals[name] = totals.get(name, 0) + count
        self.recall.rounds_done({**totals, "rounds": len(answered)})

    async def answer_calls(self, loop: Loop, round_: Round) -> None:
        """Run (or refuse) a round's memory calls and add the round's exchange for the next request."""
        if loop.rounds_run < loop.rounds_allowed:
            outcomes = [await self.run_call(call) for call in round_.memory_calls]
            loop.rounds_run += 1
            loop.calls_ran += len(outcomes)
        else:
            # Past the rounds allowed: the model is told to answer; if it asks again, tool use is forbidden.
            loop.forbidden = loop.refused
            loop.refused = True
            outcomes = [CallOutcome(call, f"Error: {ROUNDS_USED}", True) for call in round_.memory_calls]
        loop.rounds.append(round_)
        loop.exchanges += self.fmt.exchange(round_, outcomes)

    async def run_call(self, call: ToolCall) -> CallOutcome:
        """One memory call's outcome: the one place a memory call runs (through its hooks, in MemoryTools)."""
        result = await self.tools.run(call)
        self.recall.memory_called(call.name, call.arguments, result.text)
        return CallOutcome(call, result.text, result.error)


class RoundsStream:
    """One client stream over every round: the rounds run as the client reads it."""

    def __init__(self, step: ToolsStep, loop: Loop, first: UpstreamResponse) -> None:
        self._step = step
        self._loop = loop
        self._current = first
        # The client gets the rounds' events plain, whatever encoding the provider used anyway.
        self.response = _Head(httpx.Headers([(k, v) for k, v in first.response.headers.raw
                                             if k.lower() not in (b"content-encoding", b"content-length")]))
        self.status = first.status
        self.content_type = first.content_type

    async def chunks(self) -> AsyncIterator[bytes]:
        fmt, loop = self._step.fmt, self._loop
        state = fmt.stream_state()
        first = True
        while True:
            filtered = fmt.stream_round(state, loop.offered, first=first)
            decoder = SSEDecoder()
            inflate = stream_inflater(self._current)
            async for chunk in self._current.chunks():
                if inflate is not None:
                    chunk = inflate(chunk)
                    if inflate.failed:
                        raise StreamCut("upstream_error", "the provider's compressed stream could not be read")
                out = b"".join(filtered.feed(event) for event in decoder.feed(chunk))
                if out:
                    yield out
            out = b"".join(filtered.feed(event) for event in decoder.feed(b"\n\n"))
            if out:
                yield out
            if not filtered.ended and not filtered.failed:
                # Nothing of the round's end went out: the client's stream ends with the wire's error.
                raise StreamCut("stream_truncated", "upstream stream ended before completion")
            if filtered.failed:
                return  # the provider ended the stream with its own error: forwarded as it stands
            round_ = filtered.finish()
            if not round_.memory_calls or loop.forbidden:
                self._step.keep_exchange(loop, round_)
                yield filtered.tail()
                return
            await self._step.answer_calls(loop, round_)
            await self._current.aclose()
            try:
                self._current = await self._step.open(loop)
            except ProxyError as error:  # the stream is under way: it ends with the wire's error event
                raise StreamCut(error.code, str(error)) from error
            if self._current.status != 200 or not is_readable_sse(self._current):
                raise StreamCut("upstream_error", await _error_text(self._current))
            first = False

    async def aclose(self) -> None:
        # The endpoint closes the stream in its `finally`, however the stream ended: the log is written here.
        self._step.rounds_done(self._loop)
        await self._current.aclose()


class _Head:
    """Response headers, as the relay reads them off a provider response."""

    def __init__(self, headers: httpx.Headers) -> None:
        self.headers = headers


class Merged:
    """The client's JSON answer, merged from the rounds."""

    def __init__(self, last: UpstreamResponse, body: bytes, calls_ran: int) -> None:
        kept = [(k, v) for k, v in last.response.headers.raw
                if k.lower() not in (b"content-length", b"content-encoding")]
        kept += [(b"content-length", str(len(body)).encode()), (b"x-memory-tool-calls", str(calls_ran).encode())]
        self.response = _Head(httpx.Headers(kept))
        self.status = last.status
        self.content_type = last.content_type
        self._body = body

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self._body

    async def aclose(self) -> None:
        return None


async def _read_whole(response: UpstreamResponse) -> bytes:
    """A round's whole body; a cut one is answered as for no answer (nothing went to the client yet)."""
    try:
        return b"".join([chunk async for chunk in response.chunks()])
    except StreamCut as cut:
        if cut.code == "upstream_idle_timeout":
            raise UpstreamTimeout(cut.message) from cut
        raise UpstreamProtocolError(cut.message) from cut
    finally:
        await response.aclose()


async def _error_text(response: UpstreamResponse) -> str:
    """What a later round's refusal says, for the error event that ends the client's stream."""
    try:
        raw = await _read_whole(response)
    except (UpstreamTimeout, UpstreamProtocolError) as exc:
        return str(exc)
    doc = _json_object(readable_body(response, raw))
    error = doc.get("error") if doc is not None else None
    message = error.get("message") if isinstance(error, dict) else None
    return f"the provider refused a later round ({response.status}): {message or 'no message'}"


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None
