"""Chat Completions answers: chunk events → the assistant message, a JSON body → the same,
and the error event that ends a cut stream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from proxy.models import AssistantMessage, ToolCall
from proxy.wires.sse import SSEEvent, json_object

DONE = "[DONE]"
DEFAULT_MAX_CHARS = 1 << 20  # text kept per stream : a copy on the side must not grow without bound


def is_done(event: SSEEvent) -> bool:
    """True for the `[DONE]` sentinel that ends a chat-completion stream."""
    # The SDK stops at any payload that *starts with* [DONE]; agree with it.
    return event.data.startswith(DONE)


class StreamEnd:
    """How a stream ended, without parsing every chunk: [DONE] seen, or an error event.

    For streams whose answer nobody reads (memory off), this replaces the accumulator:
    only an event that mentions "error" is parsed.
    """

    malformed = 0
    too_large = False

    def __init__(self) -> None:
        self.done = False
        self.error: dict[str, Any] | None = None

    def message(self) -> AssistantMessage:
        """Nothing is kept: an empty message."""
        return AssistantMessage()

    def feed(self, event: SSEEvent) -> None:
        """Look at one event."""
        if is_done(event):
            self.done = True
        elif '"error"' in event.data:
            payload = json_object(event.data)
            if payload is not None and payload.get("error"):
                self.error = payload["error"] if isinstance(payload["error"], dict) else {"message": payload["error"]}


@dataclass
class _ToolCallParts:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class _ChoiceParts:
    content: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    tool_calls: dict[int, _ToolCallParts] = field(default_factory=dict)
    finish_reason: str | None = None


def _int_or(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


class ChatStreamAccumulator:
    """Rebuilds every choice's message from the chat.completion.chunk events of a stream.

    `only_choice`: rebuild that choice alone (the proxy saves choice 0), so the
    other choices neither take memory nor count toward `max_chars`.
    """

    def __init__(self, max_chars: int = DEFAULT_MAX_CHARS, *, only_choice: int | None = None) -> None:
        self._choices: dict[int, _ChoiceParts] = {}
        self._only = only_choice
        self._max_chars = max_chars
        self._chars = 0
        self._too_large = False
        self._done = False
        self._error: dict[str, Any] | None = None
        self._malformed = 0
        self._usage: dict[str, Any] | None = None

    @property
    def done(self) -> bool:
        """True once `[DONE]` arrived."""
        return self._done

    @property
    def error(self) -> dict[str, Any] | None:
        """The `error` object of an error event, if the stream carried one."""
        return self._error

    @property
    def malformed(self) -> int:
        """How many data payloads were not JSON objects (skipped)."""
        return self._malformed

    @property
    def usage(self) -> dict[str, Any] | None:
        """The last `usage` object seen."""
        return self._usage

    @property
    def too_large(self) -> bool:
        """True when the text passed `max_chars` and accumulation stopped."""
        return self._too_large

    def feed(self, event: SSEEvent) -> None:
        """Take one event; events after `[DONE]` are ignored, as the SDK ignores them."""
        if self._done:
            return
        if is_done(event):
            self._done = True
            return
        chunk = json_object(event.data)
        if chunk is None:
            self._malformed += 1
            return
        # The SDK raises on any event whose JSON has a truthy `error`.
        error = chunk.get("error")
        if error:
            self._error = error if isinstance(error, dict) else {"message": str(error)}
            return
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = usage
        choices = chunk.get("choices")
        if isinstance(choices, list):
            for position, choice in enumerate(choices):
                if isinstance(choice, dict):
                    self._feed_choice(position, choice)

    def message(self, index: int = 0) -> AssistantMessage:
        """The message of choice `index` so far (empty if the choice never appeared)."""
        parts = self._choices.get(index)
        if parts is None:
            return AssistantMessage()
        calls = tuple(
            ToolCall(id=c.id, name=c.name, arguments="".join(c.arguments))
            for _, c in sorted(parts.tool_calls.items())
        )
        return AssistantMessage("".join(parts.content), "".join(parts.refusal), calls, parts.finish_reason)

    def _feed_choice(self, position: int, choice: dict[str, Any]) -> None:
        index = _int_or(choice.get("index"), position)
        if self._only is not None and index != self._only:
            return
        parts = self._choices.setdefault(index, _ChoiceParts())
        reason = choice.get("finish_reason")
        if isinstance(reason, str):
            parts.finish_reason = reason
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        self._add_text(parts.content, delta.get("content"))
        self._add_text(parts.refusal, delta.get("refusal"))
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for call_position, call in enumerate(calls):
                if isinstance(call, dict):
                    self._feed_tool_call(parts, call_position, call)

    def _feed_tool_call(self, parts: _ChoiceParts, position: int, call: dict[str, Any]) -> None:
        index = _int_or(call.get("index"), position)
        acc = parts.tool_calls.setdefault(index, _ToolCallParts())
        call_id = call.get("id")
        # id and name are atomic in OpenAI's stream; some compatible servers repeat them
        # on every delta, so the first value wins instead of being concatenated.
        if isinstance(call_id, str) and not acc.id:
            acc.id = call_id
        called = called_tool(call)
        if called is None:
            return
        part, text_key = called
        name = part.get("name")
        if isinstance(name, str) and not acc.name:
            acc.name = name
        self._add_text(acc.arguments, part.get(text_key))

    def _add_text(self, into: list[str], text: Any) -> None:
        if not isinstance(text, str) or not text or self._too_large:
            return
        self._chars += len(text)
        if self._chars > self._max_chars:
            self._too_large = True
            return
        into.append(text)


def parse_completion(body: bytes) -> AssistantMessage | None:
    """Choice 0 of a non-streamed chat.completion body; None if it is not one."""
    doc = json_object(body)
    choices = doc.get("choices") if doc is not None else None
    if not isinstance(choices, list):
        return None
    choice = next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), {})
    message = choice.get("message")
    if not isinstance(message, dict):
        return None
    calls = message.get("tool_calls")
    calls = calls if isinstance(calls, list) else []
    reason = choice.get("finish_reason")
    return AssistantMessage(
        content=_str(message.get("content")),
        refusal=_str(message.get("refusal")),
        tool_calls=tuple(_tool_call(c) for c in calls if isinstance(c, dict)),
        finish_reason=reason if isinstance(reason, str) else None,
    )


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def called_tool(call: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The part of a tool call naming the tool, and the key of its input: a `function` call's
    `arguments`, a `custom` tool's free-form `input`."""
    for kind, text_key in (("function", "arguments"), ("custom", "input")):
        part = call.get(kind)
        if isinstance(part, dict):
            return part, text_key
    return None


def _tool_call(call: dict[str, Any]) -> ToolCall:
    part, text_key = called_tool(call) or ({}, "arguments")
    return ToolCall(id=_str(call.get("id")), name=_str(part.get("name")), arguments=_str(part.get(text_key)))


def error_event(message: str, code: str, type_: str = "upstream_error") -> bytes:
    """An SSE error event the SDK raises on (never a fake `[DONE]`: the SDK would keep a truncated answer)."""
    error = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return b"data: " + json.dumps(error, separators=(",", ":")).encode() + b"\n\n"
