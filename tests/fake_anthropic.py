"""Anthropic Messages payloads for the scripted upstream (tests/fake_upstream.py).

JSON answers and SSE streams with the real event sequence: message_start, per block
content_block_start / *_delta / content_block_stop (text_delta, input_json_delta for
tool_use, thinking_delta and signature_delta), ping, message_delta with the stop reason
and usage, message_stop. Errors in Anthropic's shape.
"""

from __future__ import annotations

import json
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


def default_reply(request: Received) -> Reply:
    """What the upstream answers on the Messages paths when no script is queued."""
    if request.target.split("?")[0].endswith("/count_tokens"):
        return JsonReply({"input_tokens": 42})
    try:
        streamed = bool(json.loads(request.body).get("stream"))
    except (ValueError, AttributeError, RecursionError):
        return error(400, "invalid_request_error", "bad json")
    return SSEReply(stream()) if streamed else JsonReply(message())
