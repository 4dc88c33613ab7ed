"""Anthropic Messages payloads for the scripted upstream (tests/fake_upstream.py).

JSON answers and SSE streams with the real event sequence: message_start, per block
content_block_start / *_delta / content_block_stop (text_delta, input_json_delta for
tool_use, thinking_delta and signature_delta), ping, message_delta with the stop reason
and usage, message_stop. Errors in Anthropic's shape.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests.fake_upstream import JsonReply, Received, Reply, SSEReply

USAGE = {"input_tokens": 12, "output_tokens": 7, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def message(text: str | None = "Hello from Claude", tool_uses: list[dict[str, Any]] | None = None,
            thinking: str | None = None, stop_reason: str | None = None) -> dict[str, Any]:
    """A `message` body: optional thinking, the text, then tool_use blocks."""
    content: list[dict[str, Any]] = []
    if thinking is not None:
        content.append({"type": "thinking", "thinking": thinking, "signature": "sig-abc"})
    if text is not None:
        content.append({"type": "text", "text": text})
    for use in tool_uses or []:
        content.append({"type": "tool_use", "id": use["id"], "name": use["name"], "input": use["input"]})
    reason = stop_reason or ("tool_use" if tool_uses else "end_turn")
    return {"id": "msg_01", "type": "message", "role": "assistant", "model": "claude-test", "content": content,
            "stop_reason": reason, "stop_sequence": None, "usage": USAGE}


def event(kind: str, payload: dict[str, Any]) -> bytes:
    """One SSE event as Anthropic writes it: an `event:` line, then its data."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n".encode()


def stream(text: str = "Hello from Claude", tool_uses: list[dict[str, Any]] | None = None,
           thinking: str | None = None, stop_reason: str | None = None, pieces: int = 3,
           end: bool = True) -> list[bytes]:
    """The events of a streamed message; `end=False` leaves out message_delta and message_stop."""
    start = {**message(None), "content": [], "stop_reason": None, "usage": {**USAGE, "output_tokens": 1}}
    events = [event("message_start", {"message": start})]
    index = 0
    if thinking is not None:
        events.append(event("content_block_start", {"index": index,
                                                    "content_block": {"type": "thinking", "thinking": ""}}))
        events.append(event("content_block_delta", {"index": index,
                                                    "delta": {"type": "thinking_delta", "thinking": thinking}}))
        events.append(event("content_block_delta", {"index": index,
                                                    "delta": {"type": "signature_delta", "signature": "sig-abc"}}))
        events.append(event("content_block_stop", {"index": index}))
        index += 1
    events.append(event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}}))
    events.append(event("ping", {}))
    size = max(1, -(-len(text) // pieces))
    for i in range(0, len(text), size):
        events.append(event("content_block_delta", {"index": index,
                                                    "delta": {"type": "text_delta", "text": text[i:i + size]}}))
    events.append(event("content_block_stop", {"index": index}))
    for use in tool_uses or []:
        index += 1
        block = {"type": "tool_use", "id": use["id"], "name": use["name"], "input": {}}
        events.append(event("content_block_start", {"index": index, "content_block": block}))
        arguments = json.dumps(use["input"])
        half = len(arguments) // 2
        for part in (arguments[:half], arguments[half:]):
            events.append(event("content_block_delta", {"index": index,
                                                        "delta": {"type": "input_json_delta", "partial_json": part}}))
        events.append(event("content_block_stop", {"index": index}))
    if not end:
        return events
    reason = stop_reason or ("tool_use" if tool_uses else "end_turn")
    events.append(event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": None},
                                          "usage": {"output_tokens": 7}}))
    return events + [event("message_stop", {})]


def error(status: int, kind: str, text: str) -> JsonReply:
    """An error answer in Anthropic's shape."""
    return JsonReply({"type": "error", "error": {"type": kind, "message": text}}, status=status)


def too_long() -> JsonReply:
    """The Messages wire's context-length error."""
    return error(400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum")


def missing_tool_results(messages: list[dict[str, Any]]) -> list[str]:
    """Ids of tool_use blocks whose tool_result is not in the next user message (the real API's 400)."""
    for position, turn in enumerate(messages):
        content = turn.get("content") if isinstance(turn.get("content"), list) else []
        uses = [b["id"] for b in content if turn.get("role") == "assistant" and b.get("type") == "tool_use"]
        if not uses:
            continue
        following = messages[position + 1] if position + 1 < len(messages) else {}
        after = following.get("content") if isinstance(following.get("content"), list) else []
        answered = {b.get("tool_use_id") for b in after if b.get("type") == "tool_result"}
        missing = [use for use in uses if use not in answered]
        if missing:
            return missing
    return []


def model_round(text: str | None = "Hello from Claude", tool_uses: list[dict[str, Any]] | None = None,
                thinking: str | None = None, answer_id: str = "msg_01",
                usage: dict[str, int] | None = None) -> Callable[[Received], Reply]:
    """A scripted Messages answer for one round, JSON or streamed as the request asks; like the real
    API, a 400 for a history whose tool_use blocks lack their results."""
    def reply(request: Received) -> Reply:
        body = request.json()
        missing = missing_tool_results(body.get("messages", []))
        if missing:
            return error(400, "invalid_request_error", "tool_use ids were found without tool_result blocks "
                         "immediately after: " + ", ".join(missing))
        if body.get("stream"):
            events = stream(text or "", tool_uses=tool_uses, thinking=thinking)
            events = [e.replace(b'"msg_01"', json.dumps(answer_id).encode()) for e in events]
            if usage is not None:
                events = [e.replace(b'"usage": {"output_tokens": 7}', b'"usage": ' + json.dumps(usage).encode())
                          for e in events]
            return SSEReply(events)
        doc = message(text, tool_uses, thinking)
        doc["id"] = answer_id
        if usage is not None:
            doc["usage"] = usage
        return JsonReply(doc)
    return reply


def default_reply(request: Received) -> Reply:
    """What the upstream answers on the Messages paths when no script is queued."""
    if request.target.split("?")[0].endswith("/count_tokens"):
        return JsonReply({"input_tokens": 42})
    try:
        streamed = bool(json.loads(request.body).get("stream"))
    except (ValueError, AttributeError, RecursionError):
        return error(400, "invalid_request_error", "bad json")
    return SSEReply(stream()) if streamed else JsonReply(message())
