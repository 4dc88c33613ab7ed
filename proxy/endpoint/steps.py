"""Steps: the provider calls one chat request makes. Inject mode is one step.

A step sends the body with the block, and when the provider refuses it as too long for the
context, sends the client's own body once more: memory never turns an accepted request
into an error. Where that refusal can come inside a stream (the Responses wire's
`response.failed` after `response.created`), the stream's opening events are held back
until the first output (or the failure) arrives, so the request can still be resent.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from proxy.errors import ProxyError, UpstreamProtocolError, UpstreamTimeout
from proxy.memory.chat_memory import Recall
from proxy.metrics import Metrics
from proxy.http.responses import is_plain_sse, readable_body
from proxy.http.upstream import StreamCut, Upstream, UpstreamResponse
from proxy.wires.base import Wire
from proxy.wires.sse import SSEDecoder


async def open_upstream(upstream: Upstream, metrics: Metrics, method: str, url: str,
                        headers: list[tuple[bytes, bytes]], content: Any) -> UpstreamResponse:
    """The provider's response (headers read), its latency counted whether it came or failed."""
    started = time.perf_counter()
    try:
        return await upstream.open(method, url, headers, content)
    finally:
        metrics.upstream_seconds.observe(time.perf_counter() - started)


class InjectStep:
    """One provider call with the block in the prompt."""

    def __init__(self, upstream: Upstream, metrics: Metrics, wire: Wire, url: str,
                 headers: list[tuple[bytes, bytes]]) -> None:
        self.upstream = upstream
        self.metrics = metrics
        self.wire = wire
        self.url = url
        self.headers = headers

    async def run(self, body: bytes, original: bytes, recall: Recall) -> Any:
        """The provider's response to `body` (or to `original`, when the block made it too long)."""
        try:
            response = await open_upstream(self.upstream, self.metrics, "POST", self.url, self.headers, body)
            if recall.block and response.status == 400:
                response = await self._without_block(response, original, recall)
            elif recall.block and self._may_fail_late(response):
                response = await self._held_opening(response, original, recall)
        except ProxyError as error:
            recall.failed("upstream_failed")
            error.headers = {k.decode(): v.decode() for k, v in recall.headers()}
            raise
        return response

    async def _without_block(self, response: UpstreamResponse, original: bytes, recall: Recall) -> Any:
        try:
            body = b"".join([chunk async for chunk in response.chunks()])
        except StreamCut as cut:  # nothing has gone to the client yet: answer as for no answer
            if cut.code == "upstream_idle_timeout":
                raise UpstreamTimeout(cut.message) from cut
            raise UpstreamProtocolError(cut.message) from cut
        finally:
            await response.aclose()
        # Read as memproxy reads an answer: a provider may gzip its errors (and the client's
        # accept-encoding goes along when the answer is not saved).
        if not self.wire.is_context_length_error(400, readable_body(response, body)):
            return Replayed(response, body)
        recall.dropped_block()
        return await open_upstream(self.upstream, self.metrics, "POST", self.url, self.headers, original)

    def _may_fail_late(self, response: UpstreamResponse) -> bool:
        """True for a stream whose wire may still refuse the request as too long inside it."""
        return response.status == 200 and is_plain_sse(response) and self.wire.opening(None) == "hold"

    async def _held_opening(self, response: UpstreamResponse, original: bytes, recall: Recall) -> Any:
        """The stream with its opening events held until the wire says it is the answer; the
        client's own body's response when it opened with a context-length failure."""
        decoder = SSEDecoder()
        chunks = response.chunks()
        held: list[bytes] = []
        while True:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                return Held(response, held, None)
            except StreamCut as cut:
                return Held(response, held, None, cut)  # relayed as any cut stream
            held.append(chunk)
            # The first event that is not opening decides (a chunk may hold the whole stream).
            verdict = next((v for v in map(self.wire.opening, decoder.feed(chunk)) if v != "hold"), "hold")
            if verdict == "too_long":
                await chunks.aclose()
                await response.aclose()
                recall.dropped_block()
                return await open_upstream(self.upstream, self.metrics, "POST", self.url, self.headers, original)
            if verdict == "send":
                return Held(response, held, chunks)


class Held:
    """A stream whose opening chunks were read ahead: they go first, then the rest as it comes."""

    def __init__(self, response: UpstreamResponse, held: list[bytes], rest: AsyncGenerator[bytes, None] | None,
                 cut: StreamCut | None = None) -> None:
        self._upstream = response
        self.response = response.response
        self.status = response.status
        self.content_type = response.content_type
        self._held = held
        self._rest = rest
        self._cut = cut

    async def chunks(self) -> AsyncIterator[bytes]:
        for chunk in self._held:
            yield chunk
        if self._cut is not None:
            raise self._cut
        if self._rest is not None:
            async for chunk in self._rest:
                yield chunk

    async def aclose(self) -> None:
        if self._rest is not None:
            await self._rest.aclose()
        await self._upstream.aclose()


class Replayed:
    """A response whose body was already read, replayed to the client as it came."""

    def __init__(self, response: Any, body: bytes) -> None:
        self.response = response.response
        self.status = response.status
        self.content_type = response.content_type
        self._body = body

    async def chunks(self) -> Any:
        yield self._body

    async def aclose(self) -> None:
        return None
