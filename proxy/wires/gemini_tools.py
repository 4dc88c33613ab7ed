"""Tools mode on the Gemini wire: `functionDeclarations`, `functionResponse` parts, response filtering.

A round's exchange is the model's content with its parts as the model wrote them (thoughts
and their signatures verbatim) and only its memory `functionCall` parts, then a user
content of one `functionResponse` per call (with the call's own `id` where it had one).
The client reads one answer: every round's text and thoughts in order, the rounds' text
apart by a blank line, the last round's app calls, and one last response with the last
round's finish reason and usage. Which calls are memproxy's is known by name.
"""

from __future__ import annotations

import json
import re
from urllib.parse import unquote_plus
from dataclasses import dataclass, field
from typing import Any

from proxy.errors import UnsupportedInToolsMode
from proxy.wires.base import dump_json
from proxy.wires.gemini_answer import call_id, candidate, candidate_parts, is_last, parts_text, tool_calls
from proxy.wires.sse import SSEEvent, json_object
from proxy.wires.tool_rounds import ROUND_SEPARATOR, CallOutcome, Round, as_dict, compact_json, tokens

_FORBIDDEN = {"functionCallingConfig": {"mode": "NONE"}}


def _call_name(part: Any) -> str | None:
    call = part.get("functionCall") if isinstance(part, dict) else None
    name = call.get("name") if isinstance(call, dict) else None
    return name if isinstance(name, str) else None


def _is_memory(part: Any, offered: frozenset[str]) -> bool:
    return _call_name(part) in offered


def _is_app_call(part: Any, offered: frozenset[str]) -> bool:
    name = _call_name(part)
    return name is not None and name not in offered


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + compact_json(payload).encode("utf-8") + b"\r\n\r\n"


def _with_parts(doc: dict[str, Any], parts: list[Any], *, last: bool) -> dict[str, Any]:
    """A response of the provider's with candidate 0's parts replaced (its finish reason only when `last`)."""
    first = {**candidate(doc), "content": {**as_dict(candidate(doc).get("content")), "role": "model",
                                           "parts": parts}}
    if not last:
        first.pop("finishReason", None)
    candidates = doc.get("candidates")
    rest = candidates[1:] if isinstance(candidates, list) else []
    return {**doc, "candidates": [first, *rest]}


def _round(parts: list[Any], offered: frozenset[str], usage: Any = None) -> Round:
    memory = [p for p in parts if _is_memory(p, offered)]
    output = {"role": "model", "parts": [p for p in parts if not _is_app_call(p, offered)]}
    answer = {"role": "model", "parts": [p for p in parts if not _is_memory(p, offered)]}
    return Round(tool_calls(memory), parts_text(parts), output, answer, None,
                 tokens(usage, "promptTokenCount", "candidatesTokenCount"))


def _shown(round_: Round) -> list[Any]:
    """What of an earlier round the client gets: its parts but the calls."""
    return [p for p in round_.output["parts"] if isinstance(p, dict) and "functionCall" not in p]


def _joined(rounds: list[list[Any]]) -> list[Any]:
    """The rounds' shown parts in order, a separator part between two rounds' text."""
    out: list[Any] = []
    text_before = False
    for parts in rounds:
        if text_before and parts_text(parts):
            out.append({"text": ROUND_SEPARATOR})
        out += parts
        text_before = text_before or bool(parts_text(parts))
    return out


@dataclass
class GeminiStreamState:
    """What the rounds of one stream share."""

    text_sent: bool = False  # an earlier round's text went out: the next round's starts with a separator
    response_id: Any = None  # the first round's `responseId`: the client reads one response throughout

    def same_id(self, payload: dict[str, Any]) -> dict[str, Any]:
        """`payload` with the stream's response id (the first one seen, kept from then on)."""
        if self.response_id is None:
            self.response_id = payload.get("responseId")
        return payload if self.response_id is None else {**payload, "responseId": self.response_id}


@dataclass
class GeminiStreamRound:
    """The response filter of one round: text and thoughts go at once, calls and the end wait."""

    state: GeminiStreamState
    offered: frozenset[str]
    parts: list[Any] = field(default_factory=list)  # every part of the round, as the provider sent it
    last: dict[str, Any] | None = None  # the response carrying the finish reason, held
    usage: Any = None
    failed: bool = False
    ended: bool = False
    _round_text: bool = False

    def feed(self, event: SSEEvent) -> bytes:
        payload = json_object(event.data)
        if payload is None:
            return f"data: {event.data}\r\n\r\n".encode("utf-8")  # the relay reads (and counts) it as it is
        if "error" in payload:
            self.failed = True
            return _event(payload)
        payload = self.state.same_id(payload)
        parts = [p for p in candidate_parts(payload) if isinstance(p, dict)]
        self.parts += parts
        if "usageMetadata" in payload:
            self.usage = payload["usageMetadata"]
        shown = self._shown_now([p for p in parts if "functionCall" not in p])
        if is_last(payload):
            # The round's end (and the last round's app calls) wait for `tail`; its text goes now.
            # A prompt Google blocks ends it too: one response with no candidate, forwarded as it is.
            self.ended = True
            self.last = payload
        return _event(_with_parts(payload, shown, last=False)) if shown else b""

    def _shown_now(self, parts: list[Any]) -> list[Any]:
        if parts and parts_text(parts) and not self._round_text:
            self._round_text = True
            if self.state.text_sent:
                parts = [{"text": ROUND_SEPARATOR}, *parts]
            self.state.text_sent = True
        return parts

    def finish(self) -> Round:
        return _round(self.parts, self.offered, self.usage)

    def tail(self) -> bytes:
        last = self.last or {"candidates": [{"content": {"role": "model", "parts": []}, "finishReason": "STOP",
                                             "index": 0}]}
        calls = [p for p in self.parts if _is_app_call(p, self.offered)]
        if not calls and not last.get("candidates"):
            return _event(last)  # no answer to end (the prompt was blocked): the provider's response alone
        return _event(_with_parts(last, calls, last=True))


class GeminiTools:
    """The Gemini tool format."""

    def offer(self, body: dict[str, Any], names: tuple[str, ...],
              schemas: dict[str, tuple[str, dict[str, Any]]]) -> tuple[dict[str, Any], frozenset[str]]:
        tools = body.get("tools")
        tools = tools if isinstance(tools, list) else []
        taken = {as_dict(d).get("name") for tool in tools
                 for d in (as_dict(tool).get("functionDeclarations") or []) if isinstance(d, dict)}
        offered = tuple(name for name in names if name not in taken)
        declarations = [{"name": name, "description": schemas[name][0], "parametersJsonSchema": schemas[name][1]}
                        for name in offered]
        added = [{"functionDeclarations": declarations}] if declarations else []
        return {**body, "tools": [*tools, *added]}, frozenset(offered)

    def substitute(self, body: dict[str, Any], echoes: dict[str, str], provider_response: str | None
                   ) -> dict[str, Any]:
        contents = body.get("contents")
        if not echoes or not isinstance(contents, list):
            return body
        out: list[Any] = []
        for run in _runs(contents):
            stored = _echoed(run, echoes)
            out += _contents(stored) if stored is not None else run
        return {**body, "contents": out}

    def kept(self, exchanges: list[Any], earlier: list[Round], last: Round) -> str:
        return compact_json([*exchanges, last.answer])

    def next_request(self, body: dict[str, Any], exchanges: list[Any], rounds: list[Round], *,
                     tools_forbidden: bool) -> bytes:
        contents = body.get("contents")
        out = {**body, "contents": [*(contents if isinstance(contents, list) else []), *exchanges]}
        if tools_forbidden:
            out["toolConfig"] = {**as_dict(body.get("toolConfig")), **_FORBIDDEN}
        return dump_json(out)

    def exchange(self, round_: Round, outcomes: list[CallOutcome]) -> list[Any]:
        own_ids = _own_ids(round_.output["parts"])
        responses = []
        for outcome in outcomes:
            response: dict[str, Any] = {"name": outcome.call.name,
                                        "response": {"error" if outcome.error else "result": outcome.text}}
            if own_ids.get(outcome.call.id):
                response["id"] = own_ids[outcome.call.id]
            responses.append({"functionResponse": response})
        return [round_.output, {"role": "user", "parts": responses}]

    def read_json(self, doc: dict[str, Any], offered: frozenset[str]) -> Round | None:
        if not isinstance(doc.get("candidates"), list) and not is_last(doc):
            return None  # neither an answer nor a prompt Google blocked (a round with no candidate)
        return _round(candidate_parts(doc), offered, doc.get("usageMetadata"))

    def merged_json(self, last: dict[str, Any], earlier: list[Round], offered: frozenset[str]) -> bytes:
        own = [p for p in candidate_parts(last) if not _is_memory(p, offered)]
        parts = _joined([*(_shown(r) for r in earlier), own])
        if not parts and not last.get("candidates"):
            return dump_json(last)  # a blocked prompt with nothing before it: Google's response alone
        return dump_json(_with_parts(last, parts, last=True))

    def stream_state(self) -> GeminiStreamState:
        return GeminiStreamState()

    def stream_round(self, state: GeminiStreamState, offered: frozenset[str], *, first: bool) -> GeminiStreamRound:
        return GeminiStreamRound(state, offered)


def _own_ids(parts: list[Any]) -> dict[str, str]:
    """memproxy's id of each call in a round's parts → the call's own id, where it has one."""
    seen: dict[str, int] = {}
    found: dict[str, str] = {}
    for part in parts:
        name = _call_name(part)
        if name is None:
            continue
        own = part["functionCall"].get("id")
        if isinstance(own, str) and own:
            found[call_id(part, seen.get(name, 0))] = own
        seen[name] = seen.get(name, 0) + 1
    return found


def _is_model(content: Any) -> bool:
    return isinstance(content, dict) and content.get("role") == "model" and isinstance(content.get("parts"), list)


def _runs(contents: list[Any]) -> list[list[Any]]:
    """The contents, a run of consecutive model contents together: one answer (Google's Python SDK
    keeps a streamed answer in a chat's history as a content per chunk), every other content alone."""
    runs: list[list[Any]] = []
    for content in contents:
        if _is_model(content) and runs and _is_model(runs[-1][-1]):
            runs[-1].append(content)
        else:
            runs.append([content])
    return runs


def _echoed(run: list[Any], echoes: dict[str, str]) -> str | None:
    """The stored exchange a run of model contents echoes whole (by its calls' ids), if any."""
    if not _is_model(run[0]):
        return None
    ids = [call.id for call in tool_calls([part for content in run for part in content["parts"]])]
    return next((echoes[i] for i in ids if i in echoes), None)


def _contents(stored: str) -> list[Any]:
    """The contents a stored exchange holds."""
    value = json.loads(stored)
    return value if isinstance(value, list) else [value]


def _is_alt_sse(pair: bytes) -> bool:
    """A query parameter asking for server-sent events: `alt=sse`, or Google's system-parameter
    spelling `$alt` (`%24alt` escaped)."""
    name, _, value = (unquote_plus(piece) for piece in pair.decode("latin-1").partition("="))
    return name in ("alt", "$alt") and value == "sse"


def _field(doc: Any, name: str) -> Any:
    """A request field in either spelling Google's JSON takes (`cachedContent` or `cached_content`)."""
    if not isinstance(doc, dict):
        return None
    return doc[name] if name in doc else doc.get(re.sub(r"([A-Z])", r"_\1", name).lower())


def _count(value: Any) -> float | None:
    """A number as Google's JSON reads an integer field: a JSON number, or a string holding one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    try:
        return float(value) if isinstance(value, str) else None
    except ValueError:
        return None


def unsupported(body: dict[str, Any]) -> UnsupportedInToolsMode | None:
    """Why tools mode cannot serve a request, if it cannot.

    Several candidates (`candidateCount` > 1) are refused: the rounds run on one candidate's memory
    calls, so every other candidate would answer a conversation it did not have, or end in memory
    calls no one runs (which the client would see).
    """
    count = _count(_field(_field(body, "generationConfig"), "candidateCount"))
    if count is not None and count > 1:
        return UnsupportedInToolsMode(
            "candidateCount > 1 is not supported in tools mode (X-Memory-Mode: tools, or memory.mode: tools): the "
            "memory calls run on one candidate; send candidateCount: 1, or X-Memory-Mode: inject for several "
            "candidates", param="generationConfig.candidateCount")
    return None


def without_tools(body: dict[str, Any]) -> str | None:
    """Why a request Google takes as it is cannot also take the memory tools, if it cannot: Google
    refuses function declarations beside a cached content (whose tools are the cache's), and Gemini
    2.5 beside structured output or a built-in tool (Google Search, code execution...)."""
    if _field(body, "cachedContent") is not None:
        return "no memory tools with cachedContent"
    mime = _field(_field(body, "generationConfig"), "responseMimeType")
    if isinstance(mime, str) and mime != "text/plain":
        return "no memory tools with structured output (responseMimeType)"
    tools = body.get("tools")
    declared = ("functionDeclarations", "function_declarations")
    if isinstance(tools, list) and any(value is not None and key not in declared
                                       for tool in tools for key, value in as_dict(tool).items()):
        return "no memory tools beside a built-in tool"
    return None


def unsupported_stream(query: bytes) -> UnsupportedInToolsMode | None:
    """Why tools mode cannot serve a `streamGenerateContent`, if it cannot: without `alt=sse` the
    answer is one JSON array, which the rounds cannot filter as it comes (memory calls would reach
    the client)."""
    if any(_is_alt_sse(pair) for pair in query.split(b"&")):
        return None
    return UnsupportedInToolsMode(
        "streamGenerateContent without alt=sse is not supported in tools mode (X-Memory-Mode: tools, or "
        "memory.mode: tools): add alt=sse, as Google's SDKs do, or send X-Memory-Mode: inject", param="alt")
