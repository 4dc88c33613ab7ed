"""Responses answers: a `response` object or a stream's events → one AssistantMessage.

A stream is `response.created`, `response.in_progress`, then per output item
`response.output_item.added`, its parts and deltas and `response.output_item.done`, and
last `response.completed` (which carries the whole response), `response.failed` or
`response.incomplete`; the provider's own `error` event may come instead. Event types not
known here may come anywhere. The answer is read from `response.completed`'s `output`;
the items seen done (and the text deltas) are only a fallback for one that carries none.
"""

from __future__ import annotations

import json
from typing import Any

from proxy.models import AssistantMessage, ToolCall
from proxy.wires.sse import SSEEvent, json_object

DEFAULT_MAX_CHARS = 1 << 20  # text kept per stream: the accumulator is bounded

# Calls the client runs: the turn goes on with their `*_output` items on the next request.
CLIENT_CALLS = frozenset({"function_call", "custom_tool_call", "local_shell_call", "shell_call",
                          "apply_patch_call", "computer_call"})
_ENDS = {"response.completed": None, "response.failed": "failed", "response.incomplete": "incomplete"}


def output_text(items: Any) -> str:
    """The `output_text` parts of an output's assistant messages joined by newlines: how an
    answer is saved, and how a message the client sends back is recognised."""
    if not isinstance(items, list):
        return ""
    texts = [part.get("text") for item in items if isinstance(item, dict) and item.get("type", "message") == "message"
             and item.get("role") == "assistant" and isinstance(item.get("content"), list)
             for part in item["content"] if isinstance(part, dict) and part.get("type") == "output_text"]
    return "\n".join(text for text in texts if isinstance(text, str) and text)


def call_arguments(item: dict[str, Any]) -> str:
    """What a client-run call asks for, as text: a function's arguments, a tool's input, an action."""
    for key in ("arguments", "input"):
        if isinstance(item.get(key), str):
            return item[key]
    for key in ("action", "operation"):
        if key in item:
            return json.dumps(item[key], ensure_ascii=False)
    return ""


def call_name(item: dict[str, Any]) -> str:
    name = item.get("name")
    return name if isinstance(name, str) and name else str(item.get("type", ""))


def answer_from_output(items: list[Any], response_id: str | None = None) -> AssistantMessage:
    """The answer of a completed response's `output`: its text, the calls the client runs,
    its reasoning summaries. Calls the provider ran itself are part of the answer."""
    calls = tuple(ToolCall(_str(item.get("call_id")), call_name(item), call_arguments(item))
                  for item in items if isinstance(item, dict) and item.get("type") in CLIENT_CALLS)
    summaries = [part.get("text") for item in items if isinstance(item, dict) and item.get("type") == "reasoning"
                 and isinstance(item.get("summary"), list)
                 for part in item["summary"] if isinstance(part, dict)]
    refusals = [part.get("refusal") for item in items if isinstance(item, dict) and item.get("type") == "message"
                and isinstance(item.get("content"), list)
                for part in item["content"] if isinstance(part, dict) and part.get("type") == "refusal"]
    return AssistantMessage(
        content=output_text(items), refusal="\n".join(r for r in refusals if isinstance(r, str) and r),
        tool_calls=calls, finish_reason="tool_calls" if calls else "stop",
        reasoning="\n".join(s for s in summaries if isinstance(s, str) and s), response_id=response_id,
    )


def parse_response(body: dict[str, Any]) -> AssistantMessage | None:
    """The answer of a JSON `response` body; None when it is not a completed response."""
    if body.get("object") != "response" or body.get("status") != "completed":
        return None
    output = body.get("output")
    return answer_from_output(output, _id(body)) if isinstance(output, list) else None


class ResponsesStreamReader:
    """Reads a Responses stream: how it ends and, with `keep_answer`, the answer itself."""

    def __init__(self, *, keep_answer: bool, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self._keep = keep_answer
        self._max_chars = max_chars
        self._chars = 0
        self._final: list[Any] | None = None  # response.completed's output
        self._items: dict[int, Any] = {}  # output items seen done, by output_index
        self._deltas: dict[int, list[str]] = {}  # output text deltas, by output_index
        self._response_id: str | None = None
        self.done = False
        self.error: dict[str, Any] | None = None
        self.malformed = 0
        self.too_large = False

    def feed(self, event: SSEEvent) -> None:
        """Take one event; events after the stream's end are ignored."""
        if self.done:
            return
        if not self._keep and event.event is not None and event.event not in (*_ENDS, "error"):
            return  # only how the stream ends matters, and the event line says what this one is
        payload = json_object(event.data)
        if payload is None:
            self.malformed += 1
            return
        kind = payload.get("type", event.event)
        if kind in _ENDS:
            self.done = True
            response = payload.get("response")
            response = response if isinstance(response, dict) else {}
            self._response_id = _id(response) or self._response_id
            if _ENDS[kind] is not None:  # failed or incomplete: the provider ended it, no answer
                error = response.get("error") or response.get("incomplete_details")
                self.error = error if isinstance(error, dict) else {"message": kind}
            elif self._keep and isinstance(response.get("output"), list) and response["output"]:
                self._final = response["output"]
                self._chars = 0  # the whole answer replaces what the events showed
                self._count(output_text(self._final))
        elif kind == "error":
            error = payload.get("error")
            self.error = error if isinstance(error, dict) else payload
        elif self._keep:
            self._answer_event(kind, payload)

    def message(self) -> AssistantMessage:
        """The answer: the completed response's output, else what the events showed."""
        if self._final is not None:
            return answer_from_output(self._final, self._response_id)
        items = [self._items[i] for i in sorted(self._items)]
        pending = [{"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": "".join(self._deltas[i])}]}
                   for i in sorted(self._deltas) if i not in self._items]
        return answer_from_output(items + pending, self._response_id)

    def _answer_event(self, kind: Any, payload: dict[str, Any]) -> None:
        if kind == "response.created" and isinstance(payload.get("response"), dict):
            self._response_id = _id(payload["response"])
        index = payload.get("output_index")
        if not isinstance(index, int):
            return
        if kind == "response.output_item.done" and isinstance(payload.get("item"), dict):
            self._items[index] = payload["item"]
            self._count(output_text([payload["item"]]))
        elif kind == "response.output_text.delta" and isinstance(payload.get("delta"), str):
            self._deltas.setdefault(index, []).append(payload["delta"])
            self._count(payload["delta"])

    def _count(self, text: str) -> None:
        self._chars += len(text)
        if self._chars > self._max_chars:
            self.too_large = True


def _id(response: dict[str, Any]) -> str | None:
    value = response.get("id")
    return value if isinstance(value, str) and value else None


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""
