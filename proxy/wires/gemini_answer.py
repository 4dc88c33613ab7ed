"""Gemini answers: `GenerateContentResponse` chunks → one AssistantMessage.

An answer is `candidates[0].content.parts`: text parts (the answer, joined as they come,
as Google's SDKs join them), thought parts (`"thought": true`, kept for the trace) and
`functionCall` parts. A stream (`alt=sse`, or the JSON array `streamGenerateContent`
sends without it) is a run of such responses, each holding the next parts; there is no
end event: the response carrying the candidate's `finishReason` (or a prompt's
`promptFeedback.blockReason`) is the last, and a stream that stops before it was cut.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from proxy.models import AssistantMessage, ToolCall
from proxy.wires.sse import SSEEvent, json_object

DEFAULT_MAX_CHARS = 1 << 20  # text kept per stream: the accumulator is bounded


def call_id(part: dict[str, Any], ordinal: int) -> str:
    """The id memproxy knows a function call by: its name, its arguments and its place among the
    calls of that name in one answer. Never the call's own `id`: the provider may give none, and
    a client then writes one of its own into the history it sends back (Gemini CLI does), so the
    answer and the request returning its result would name the call differently. Calls are
    thereby matched by name, in order."""
    call = part.get("functionCall")
    call = call if isinstance(call, dict) else {}
    name = _str(call.get("name"))
    args = json.dumps(call.get("args"), ensure_ascii=False, sort_keys=True)
    digest = hashlib.sha256(json.dumps([name, args, ordinal]).encode("utf-8", "surrogatepass")).hexdigest()
    return f"{name}#{digest[:16]}"


def tool_calls(parts: list[Any]) -> tuple[ToolCall, ...]:
    """The `functionCall` parts of one answer, with their ids (see `call_id`)."""
    seen: dict[str, int] = {}
    calls = []
    for part in parts:
        if not isinstance(part, dict) or not isinstance(part.get("functionCall"), dict):
            continue
        name = _str(part["functionCall"].get("name"))
        ordinal = seen.get(name, 0)
        seen[name] = ordinal + 1
        calls.append(ToolCall(call_id(part, ordinal), name,
                              json.dumps(part["functionCall"].get("args"), ensure_ascii=False)))
    return tuple(calls)


def parts_text(parts: Any) -> str:
    """The answer's text: its text parts that are not thoughts, joined as they come."""
    if not isinstance(parts, list):
        return ""
    return "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)
                   and not p.get("thought"))


def thought_text(parts: list[Any]) -> str:
    return "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)
                   and p.get("thought"))


def candidate(doc: dict[str, Any]) -> dict[str, Any]:
    """The response's first candidate (an empty one when it has none)."""
    candidates = doc.get("candidates")
    first = candidates[0] if isinstance(candidates, list) and candidates else None
    return first if isinstance(first, dict) else {}


def candidate_parts(doc: dict[str, Any]) -> list[Any]:
    content = candidate(doc).get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    return parts if isinstance(parts, list) else []


def is_last(doc: dict[str, Any]) -> bool:
    """True for the response that ends an answer: a finish reason, or the prompt refused."""
    if isinstance(candidate(doc).get("finishReason"), str):
        return True
    feedback = doc.get("promptFeedback")
    return isinstance(feedback, dict) and isinstance(feedback.get("blockReason"), str)


def answer_from_chunks(chunks: list[Any]) -> AssistantMessage | None:
    """The answer of a JSON body: one response, or the array a stream without `alt=sse` sends."""
    docs = [chunk for chunk in chunks if isinstance(chunk, dict)]
    if not docs or len(docs) != len(chunks) or any("error" in doc for doc in docs):
        return None
    if not any("candidates" in doc or "promptFeedback" in doc for doc in docs):
        return None
    parts = [part for doc in docs for part in candidate_parts(doc)]
    reasons = [candidate(doc).get("finishReason") for doc in docs]
    reason = next((r for r in reversed(reasons) if isinstance(r, str)), None)
    return _message(parts, reason)


def _message(parts: list[Any], reason: str | None) -> AssistantMessage:
    calls = tool_calls(parts)
    return AssistantMessage(content=parts_text(parts), tool_calls=calls, finish_reason=reason,
                            reasoning=thought_text(parts))


class GeminiStreamReader:
    """Reads a Gemini stream's responses: how it ends and, with `keep_answer`, the answer itself."""

    def __init__(self, *, keep_answer: bool, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self._keep = keep_answer
        self._max_chars = max_chars
        self._chars = 0
        self._parts: list[dict[str, Any]] = []
        self._reason: str | None = None
        self.done = False
        self.error: dict[str, Any] | None = None
        self.malformed = 0
        self.too_large = False

    def feed(self, event: SSEEvent) -> None:
        """Take one event; events after the last response are ignored."""
        if self.done:
            return
        payload = json_object(event.data)
        if payload is None:
            self.malformed += 1
            return
        error = payload.get("error")
        if error is not None:
            self.error = error if isinstance(error, dict) else {"message": str(error)}
            return
        if self._keep:
            for part in candidate_parts(payload):
                if isinstance(part, dict):
                    self._add(part)
        reason = candidate(payload).get("finishReason")
        if isinstance(reason, str):
            self._reason = reason
        self.done = is_last(payload)

    def message(self) -> AssistantMessage:
        """The answer so far, its parts in the order they came."""
        return _message(self._parts, self._reason)

    def _add(self, part: dict[str, Any]) -> None:
        text = part.get("text")
        if isinstance(text, str) and not self.too_large:
            self._chars += len(text)
            if self._chars > self._max_chars:
                self.too_large = True
                return
        if "functionCall" in part or isinstance(text, str):
            self._parts.append(part)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""
