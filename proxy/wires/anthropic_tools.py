"""Tools mode on the Messages wire: `tools[]` with `input_schema`, `tool_result` blocks, event filtering.

A round's exchange is the assistant message with its blocks as the model wrote them
(thinking with its signature, verbatim) and only its memory `tool_use` blocks, then a
user message of one `tool_result` per call. The client reads one stream: the first
round's `message_start`, every round's thinking and text blocks renumbered in order,
the last round's app `tool_use` blocks, and one `message_delta` (the last round's stop
reason and full usage) and `message_stop`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from proxy.models import ToolCall
from proxy.wires.base import dump_json
from proxy.wires.sse import SSEEvent, json_object
from proxy.wires.tool_rounds import CallOutcome, MessageListRounds, Round, as_dict, named_event, tokens


def _is_memory(block: Any, offered: frozenset[str]) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") in offered


def _is_app_call(block: Any, offered: frozenset[str]) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") not in offered


def _call(block: dict[str, Any]) -> ToolCall:
    return ToolCall(str(block.get("id") or ""), str(block.get("name") or ""),
                    json.dumps(block.get("input"), ensure_ascii=False))


def _text(blocks: list[Any]) -> str:
    texts = (b.get("text") for b in blocks if isinstance(b, dict) and b.get("type") == "text")
    return "\n".join(t for t in texts if isinstance(t, str) and t)


def _round(content: list[Any], offered: frozenset[str], usage: Any = None) -> Round:
    memory = [b for b in content if _is_memory(b, offered)]
    output = {"role": "assistant", "content": [b for b in content if not _is_app_call(b, offered)]}
    answer = {"role": "assistant", "content": [b for b in content if not _is_memory(b, offered)]}
    return Round(tuple(_call(b) for b in memory), _text(content), output, answer, None,
                 tokens(usage, "input_tokens", "output_tokens"))


def _shown(round_: Round) -> list[Any]:
    """What of an earlier round the client gets: its blocks but the tool calls."""
    return [b for b in round_.output["content"] if isinstance(b, dict) and b.get("type") != "tool_use"]


@dataclass
class MessagesStreamState:
    """What the rounds of one stream share."""

    next_index: int = 0  # the client's next content-block index


@dataclass
class _BlockParts:
    kind: str  # shown | memory | app
    start: dict[str, Any]
    index: int | None = None  # the client's index (shown and app blocks)
    deltas: list[dict[str, Any]] = field(default_factory=list)  # each delta as the provider sent it
    held: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # an app call's events


class MessagesStreamRound:
    """The event filter of one round."""

    def __init__(self, state: MessagesStreamState, offered: frozenset[str], first: bool) -> None:
        self._state = state
        self._offered = offered
        self._first = first
        self._blocks: dict[int, _BlockParts] = {}
        self._usage: dict[str, Any] = {}  # the round's message_start usage
        self._delta: dict[str, Any] | None = None  # its message_delta, held
        self.failed = False
        self.ended = False

    def feed(self, event: SSEEvent) -> bytes:
        payload = json_object(event.data)
        if payload is None:
            return f"data: {event.data}\n\n".encode("utf-8")  # the relay reads (and counts) it as it is
        kind = payload.get("type", event.event)
        if kind == "error":
            self.failed = True
            return named_event("error", payload)
        if kind == "message_start":
            self._usage = as_dict(as_dict(payload.get("message")).get("usage"))
            return named_event("message_start", payload) if self._first else b""
        if kind == "message_delta":
            self._delta = payload
            return b""
        if kind == "message_stop":
            self.ended = True
            return b""
        if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
            return self._block_event(str(kind), payload)
        return named_event(str(kind), payload) if isinstance(kind, str) else b""

    def _block_event(self, kind: str, payload: dict[str, Any]) -> bytes:
        index = payload.get("index")
        if not isinstance(index, int):
            return b""
        if kind == "content_block_start":
            start = as_dict(payload.get("content_block"))
            role = "memory" if _is_memory(start, self._offered) else "app" if _is_app_call(start, self._offered) \
                else "shown"
            self._blocks[index] = _BlockParts(role, start)
            if role == "shown":
                self._blocks[index].index = self._state.next_index
                self._state.next_index += 1
        parts = self._blocks.get(index)
        if parts is None:
            return b""
        if kind == "content_block_delta":
            parts.deltas.append(as_dict(payload.get("delta")))
        if parts.kind == "memory":
            return b""
        if parts.kind == "app":
            parts.held.append((kind, payload))
            return b""
        return named_event(kind, {**payload, "index": parts.index})

    def finish(self) -> Round:
        content = [_rebuilt(parts) for _, parts in sorted(self._blocks.items())]
        return _round(content, self._offered, {**self._usage, **as_dict(as_dict(self._delta).get("usage"))})

    def tail(self) -> bytes:
        out = []
        for _, parts in sorted(self._blocks.items()):
            if parts.kind != "app":
                continue
            parts.index = self._state.next_index
            self._state.next_index += 1
            out += [named_event(kind, {**payload, "index": parts.index}) for kind, payload in parts.held]
        delta = self._delta or {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}}
        reason = as_dict(delta.get("delta")).get("stop_reason")
        if reason == "tool_use" and not any(p.kind == "app" for p in self._blocks.values()):
            delta = {**delta, "delta": {**as_dict(delta.get("delta")), "stop_reason": "end_turn"}}
        # The last round's full usage: what its message_start said, updated by its message_delta.
        out.append(named_event("message_delta", {**delta, "usage": {**self._usage, **as_dict(delta.get("usage"))}}))
        out.append(named_event("message_stop", {"type": "message_stop"}))
        return b"".join(out)


def _rebuilt(parts: _BlockParts) -> dict[str, Any]:
    """A streamed block as the JSON answer would hold it (thinking and its signature verbatim)."""
    block = dict(parts.start)
    pieces: dict[str, list[str]] = {}
    for delta in parts.deltas:
        for key, field_ in (("text", "text"), ("thinking", "thinking"), ("signature", "signature"),
                            ("partial_json", "input")):
            if isinstance(delta.get(key), str):
                pieces.setdefault(field_, []).append(delta[key])
    for field_, texts in pieces.items():
        if field_ == "input":
            try:
                block["input"] = json.loads("".join(texts) or "{}")
            except ValueError:
                block["input"] = {}
        else:
            block[field_] = str(block.get(field_) or "") + "".join(texts)
    return block


def _echoed(message: Any, echoes: dict[str, str]) -> str | None:
    """The stored exchange an assistant message echoes (by its tool_use ids), if any."""
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return None
    content = message.get("content")
    ids = [b.get("id") for b in content if isinstance(b, dict) and b.get("type") == "tool_use"] \
        if isinstance(content, list) else []
    return next((echoes[i] for i in ids if isinstance(i, str) and i in echoes), None)


class MessagesTools(MessageListRounds):
    """The Messages tool format."""

    tool_choice_none = {"type": "none"}
    echoed = staticmethod(_echoed)

    def offer(self, body: dict[str, Any], names: tuple[str, ...],
              schemas: dict[str, tuple[str, dict[str, Any]]]) -> tuple[dict[str, Any], frozenset[str]]:
        tools = body.get("tools")
        tools = tools if isinstance(tools, list) else []
        taken = {as_dict(tool).get("name") for tool in tools}
        offered = tuple(name for name in names if name not in taken)
        added = [{"name": name, "description": schemas[name][0], "input_schema": schemas[name][1]}
                 for name in offered]
        return {**body, "tools": [*tools, *added]}, frozenset(offered)

    def exchange(self, round_: Round, outcomes: list[CallOutcome]) -> list[Any]:
        results = [{"type": "tool_result", "tool_use_id": o.call.id, "content": o.text,
                    **({"is_error": True} if o.error else {})} for o in outcomes]
        return [round_.output, {"role": "user", "content": results}]

    def read_json(self, doc: dict[str, Any], offered: frozenset[str]) -> Round | None:
        content = doc.get("content")
        if doc.get("type") != "message" or not isinstance(content, list):
            return None
        return _round(content, offered, doc.get("usage"))

    def merged_json(self, last: dict[str, Any], earlier: list[Round], offered: frozenset[str]) -> bytes:
        content = [b for b in last.get("content") or [] if not _is_memory(b, offered)]
        shown = [block for round_ in earlier for block in _shown(round_)]
        merged = {**last, "content": [*shown, *content]}
        if last.get("stop_reason") == "tool_use" and not any(_is_app_call(b, offered) for b in content):
            merged["stop_reason"] = "end_turn"
        return dump_json(merged)

    def stream_state(self) -> MessagesStreamState:
        return MessagesStreamState()

    def stream_round(self, state: MessagesStreamState, offered: frozenset[str], *,
                     first: bool) -> MessagesStreamRound:
        return MessagesStreamRound(state, offered, first)

