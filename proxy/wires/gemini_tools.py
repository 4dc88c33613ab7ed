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
from urllib.parse import unquote_plus
from dataclasses import dataclass, field
from typing import Any

from proxy.errors import UnsupportedInToolsMode
from proxy.wires.base import dump_json
from proxy.wires.gemini_answer import call_id, candidate, candidate_parts, parts_text, tool_calls
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
        parts = [p for p in candidate_parts(payload) if isinstance(p, dict)]
        self.parts += parts
        if "usageMetadata" in payload:
            self.usage = payload["usageMetadata"]
        shown = self._shown_now([p for p in parts if "functionCall" not in p])
        if isinstance(candidate(payload).get("finishReason"), str):
            # The round's end (and the last round's app calls) wait for `tail`; its text goes now.
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
        for content in contents:
            stored = _echoed(content, echoes)
            out += _contents(stored) if stored is not None else [content]
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
        if not isinstance(doc.get("candidates"), list):
            return None
        return _round(candidate_parts(doc), offered, doc.get("usageMetadata"))

    def merged_json(self, last: dict[str, Any], earlier: list[Round], offered: frozenset[str]) -> bytes:
        own = [p for p in candidate_parts(last) if not _is_memory(p, offered)]
        return dump_json(_with_parts(last, _joined([*(_shown(r) for r in earlier), own]), last=True))

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


def _echoed(content: Any, echoes: dict[str, str]) -> str | None:
    """The stored exchange a model content echoes (by its calls' ids), if any."""
    if not isinstance(content, dict) or content.get("role") != "model" or not isinstance(content.get("parts"), list):
        return None
    ids = [call.id for call in tool_calls(content["parts"])]
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


def unsupported_stream(query: bytes) -> UnsupportedInToolsMode | None:
    """Why tools mode cannot serve a `streamGenerateContent`, if it cannot: without `alt=sse` the
    answer is one JSON array, which the rounds cannot filter as it comes (memory calls would reach
    the client)."""
    if any(_is_alt_sse(pair) for pair in query.split(b"&")):
        return None
    return UnsupportedInToolsMode(
        "streamGenerateContent without alt=sse is not supported in tools mode (X-Memory-Mode: tools, or "
        "memory.mode: tools): add alt=sse, as Google's SDKs do, or send X-Memory-Mode: inject", param="alt")
