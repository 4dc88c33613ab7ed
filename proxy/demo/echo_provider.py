"""An upstream that says whether a user message reached it with memproxy's block, and keeps
the messages it received for the tour to print.

Its answer never repeats the block: memproxy saves answers, and a block inside one would
come back as a memory of its own. It speaks the two wires the tour and a curious user reach
for, JSON and streams: OpenAI Chat Completions and Anthropic Messages. It calls nothing.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from proxy.memory.retrieval.block import DEFAULT_HEADER

WITH_BLOCK = "(echo provider) Your message reached me with memproxy's memory block in front of it."
WITHOUT_BLOCK = "(echo provider) Your message reached me as you wrote it, with no memory block."


def last_user_text(messages: Any) -> str:
    """The text of the last user message of a Chat Completions or Messages request."""
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "\n".join(part.get("text", "") for part in content
                                 if isinstance(part, dict) and part.get("type") in ("text", "input_text"))
    return ""


def _sse(events: list[tuple[str | None, dict[str, Any] | str]]) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        for name, data in events:
            text = data if isinstance(data, str) else json.dumps(data)
            yield ((f"event: {name}\n" if name else "") + f"data: {text}\n\n").encode()

    return StreamingResponse(body(), media_type="text/event-stream")


def _answer(request: Request, body: dict[str, Any]) -> str:
    said = last_user_text(body.get("messages"))
    request.app.state.received.append(said)
    return WITH_BLOCK if said.startswith(DEFAULT_HEADER) else WITHOUT_BLOCK


async def chat_completions(request: Request) -> Response:
    body = await request.json()
    answer = _answer(request, body)
    model = str(body.get("model", "echo"))
    if not body.get("stream"):
        return JSONResponse({"id": "chatcmpl-echo", "object": "chat.completion", "created": 0, "model": model,
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": answer}}],
                             "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})
    chunk = {"id": "chatcmpl-echo", "object": "chat.completion.chunk", "created": 0, "model": model}
    return _sse([(None, {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": answer},
                                               "finish_reason": None}]}),
                 (None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
                 (None, "[DONE]")])


async def messages(request: Request) -> Response:
    body = await request.json()
    answer = _answer(request, body)
    model = str(body.get("model", "echo"))
    usage = {"input_tokens": 0, "output_tokens": 0}
    if not body.get("stream"):
        return JSONResponse({"id": "msg_echo", "type": "message", "role": "assistant", "model": model,
                             "content": [{"type": "text", "text": answer}], "stop_reason": "end_turn",
                             "stop_sequence": None, "usage": usage})
    start: dict[str, Any] = {"id": "msg_echo", "type": "message", "role": "assistant", "model": model, "content": [],
             "stop_reason": None, "stop_sequence": None, "usage": usage}
    return _sse([("message_start", {"type": "message_start", "message": start}),
                 ("content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "text", "text": ""}}),
                 ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "text_delta", "text": answer}}),
                 ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                 ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                                                       "stop_sequence": None},
                                    "usage": {"output_tokens": 0}}),
                 ("message_stop", {"type": "message_stop"})])


def echo_provider() -> Starlette:
    """The echo provider's app; its base URL is `http://host:port/v1` for both wires.
    `app.state.received` holds each user message it was sent, as it arrived."""
    app = Starlette(routes=[Route("/v1/chat/completions", chat_completions, methods=["POST"]),
                            Route("/v1/messages", messages, methods=["POST"])])
    app.state.received = []
    return app
