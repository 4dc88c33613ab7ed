"""Anthropic Messages answers: stream events or a JSON body → one AssistantMessage.

A stream is `message_start`, then per content block `content_block_start`, its deltas and
`content_block_stop`, then `message_delta` (the stop reason) and `message_stop`, which
completes it; `ping` and event types not known here may come anywhere. Thinking is kept
apart from the answer's text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from proxy.models import AssistantMessage, ToolCall
from proxy.wires.sse import SSEEvent, json_object

DEFAULT_MAX_CHARS = 1 << 20  # text kept per stream: the accumulator is bounded
_STEP_ENDS = frozenset({"tool_use", "pause_turn"})  # the turn goes on: no answer to save yet


def blocks_text(blocks: Any) -> str:
    """The text blocks of an answer joined by newlines: how an answer is saved and recognised."""
    if not isinstance(blocks, list):
        return ""
    texts = (block.get("text") for block in blocks if isinstance(block, dict) and block.get("type") == "text")
    return "\n".join(text for text in texts if isinstance(text, str) and text)


def answer_from_blocks(blocks: list[Any], stop_reason: str | None) -> AssistantMessage:
    """The answer of a complete `message` (its content blocks and stop reason)."""
    calls = tuple(ToolCall(_str(b.get("id")), _str(b.get("name")), json.dumps(b.get("input"), ensure_ascii=False))
                  for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use")
    thinking = (b.get("thinking") for b in blocks if isinstance(b, dict) and b.get("type") == "thinking")
    return AssistantMessage(
        content=blocks_text(blocks), tool_calls=calls, finish_reason=stop_reason,
        reasoning="\n".join(t for t in thinking if isinstance(t, str) and t),
        continues=stop_reason in _STEP_ENDS and not calls,
    )


@dataclass
class _Block:
    type: str
    id: str = ""
    name: str = ""
    input: Any = None
    parts: list[str] = field(default_factory=list)  # text, thinking, or the tool input's JSON


class MessagesStreamReader:
    """Reads a Messages stream: how it ends and, with `keep_answer`, the answer itself."""

    def __init__(self, *, keep_answer: bool, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self._keep = keep_answer
        self._max_chars = max_chars
        self._chars = 0
        self._blocks: dict[int, _Block] = {}
        self._stop_reason: str | None = None
        self.done = False
        self.error: dict[str, Any] | None = None
        self.malformed = 0
        self.too_large = False

    def feed(self, event: SSEEvent) -> None:
        """Take one event; events after `message_stop` are ignored."""
        if self.done:
            return
        if not self._keep and event.event is not None and event.event not in ("message_stop", "error"):
            return  # only how the stream ends matters, and the event line says what this one is
        payload = json_object(event.data)
        if payload is None:
            self.malformed += 1
            return
        kind = payload.get("type", event.event)
        if kind == "message_stop":
            self.done = True
        elif kind == "error":
            error = payload.get("error")
            self.error = error if isinstance(error, dict) else {"message": str(error)}
        elif self._keep:
            self._answer_event(kind, payload)

    def message(self) -> AssistantMessage:
        """The answer so far, in block order."""
        blocks = [self._blocks[i] for i in sorted(self._blocks)]
        calls = tuple(ToolCall(b.id, b.name, "".join(b.parts) or json.dumps(b.input, ensure_ascii=False))
                      for b in blocks if b.type == "tool_use")
        texts = ("".join(b.parts) for b in blocks if b.type == "text")
        thinking = ("".join(b.parts) for b in blocks if b.type == "thinking")
        return AssistantMessage(
            content="\n".join(t for t in texts if t), tool_calls=calls, finish_reason=self._stop_reason,
            reasoning="\n".join(t for t in thinking if t),
            continues=self._stop_reason in _STEP_ENDS and not calls,
        )

    def _answer_event(self, kind: Any, payload: dict[str, Any]) -> None:
        if kind == "content_block_start":
            start = payload.get("content_block")
            if isinstance(start, dict) and isinstance(payload.get("index"), int):
                self._blocks[payload["index"]] = _Block(_str(start.get("type")), _str(start.get("id")),
                                                        _str(start.get("name")), start.get("input"))
                self._add(self._blocks[payload["index"]], start.get("text") or start.get("thinking"))
        elif kind == "content_block_delta":
            block = self._blocks.get(payload.get("index"))  # type: ignore[arg-type]
            delta = payload.get("delta")
            if block is not None and isinstance(delta, dict):
                self._add(block, delta.get("text") or delta.get("partial_json") or delta.get("thinking"))
        elif kind in ("message_delta", "message_start"):
            holder = payload.get("delta") if kind == "message_delta" else payload.get("message")
            reason = holder.get("stop_reason") if isinstance(holder, dict) else None
            if isinstance(reason, str):
                self._stop_reason = reason

    def _add(self, block: _Block, text: Any) -> None:
        if not isinstance(text, str) or not text or self.too_large:
            return
        self._chars += len(text)
        if self._chars > self._max_chars:
            self.too_large = True
            return
        block.parts.append(text)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""
