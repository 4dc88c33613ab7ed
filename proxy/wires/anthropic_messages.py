"""The Anthropic Messages wire (`POST /v1/messages`): parse, place the block, read the answer.

The turn's prompt is the last `user` message that holds no `tool_result` block and has
words of the user's own: context a client adds in the user's role (a text block, or a
whole message, that is one element tagged with a `scope.context_tags` tag, such as
Claude Code's `<system-reminder>`) is neither searched by nor saved. Roles and block
types this module does not know pass through untouched.

Placement keeps the client's prompt cache: the block goes right after the prompt's last
block carrying `cache_control`, so the prefix the client marked is byte-identical; a
top-level (automatic) `cache_control` is moved onto the prompt's last block of the
client's own, so the breakpoint sits where it would have sat without memory. Memory
never adds a breakpoint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from proxy.errors import ProxyError
from proxy.models import AssistantMessage, ToolStep, Transcript
from proxy.wires.anthropic_answer import MessagesStreamReader, answer_from_blocks, blocks_text
from proxy.wires.base import (
    AnswerReader, Opening, Provider, WireRequest, dump_json, load_json, model_and_stream_problem, with_words,
)
from proxy.wires.context_tags import DEFAULT_TAGS, ContextTags
from proxy.wires.sse import SSEEvent

_MARKERS = {"image": "[image]", "document": "[file]"}
_CONVERSATION_ROLES = frozenset({"user", "assistant"})
_CONTEXT_LENGTH = re.compile(r"^prompt is too long|input length and `?max_tokens`? exceed context limit")
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
                504: "timeout_error"}


class AnthropicMessages:
    """The Messages wire; `context_tags` name the elements that are a client's, not the user's."""

    name = "anthropic_messages"
    provider: Provider = "anthropic"
    sse_comments = True

    def __init__(self, context_tags: Iterable[str] = DEFAULT_TAGS) -> None:
        self._context = ContextTags(context_tags)

    def parse(self, body: bytes) -> WireRequest | str:
        doc = load_json(body)
        if isinstance(doc, str):
            return doc
        messages = doc.get("messages")
        if not isinstance(messages, list):
            return "messages is not a list"
        problem = model_and_stream_problem(doc)
        if problem is not None:
            return problem
        stream = doc.get("stream")
        problem = next(filter(None, map(_message_problem, messages)), None)
        if problem is not None:
            return problem
        index = self._prompt_index(messages)
        return WireRequest(doc, bool(stream), self._transcript(messages, index), index, len(body))

    def insert_block(self, request: WireRequest, block: str) -> bytes:
        index = request.prompt_index
        if index is None:
            return dump_json(request.body, in_pieces=request.large)
        body = dict(request.body)
        messages = list(body["messages"])
        message = messages[index]
        content = message["content"]
        automatic = body.get("cache_control")
        later_step = _conversation_after(messages, index)
        if automatic is not None:
            # The automatic breakpoint sits on the last block: on the first step that would be
            # the block memory adds, so it is pinned to the prompt's own last block, and every
            # step keeps memory after the prompt, where the first step cached it.
            content = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
            if not later_step:
                del body["cache_control"]
                if "cache_control" not in content[-1]:
                    content[-1] = {**content[-1], "cache_control": automatic}
        messages[index] = {**message, "content": _with_block(content, block, later_step or automatic is not None)}
        body["messages"] = messages
        return dump_json(body, in_pieces=request.large)

    def with_prompt(self, request: WireRequest, text: str) -> WireRequest:
        if request.prompt_index is None:
            return request
        message = request.body["messages"][request.prompt_index]
        words = with_words(message["content"], text,
                           lambda block: _is_words(block) and not self._context.is_context(_str(block.get("text"))))
        return request.with_message({**message, "content": words})

    def answer_reader(self, *, keep_answer: bool) -> AnswerReader:
        return MessagesStreamReader(keep_answer=keep_answer)

    def parse_answer(self, body: bytes) -> AssistantMessage | None:
        doc = load_json(body)
        if isinstance(doc, str) or doc.get("type") != "message" or not isinstance(doc.get("content"), list):
            return None
        reason = doc.get("stop_reason")
        return answer_from_blocks(doc["content"], reason if isinstance(reason, str) else None)

    def is_context_length_error(self, status: int, body: bytes) -> bool:
        doc = load_json(body) if status == 400 else None
        error = doc.get("error") if isinstance(doc, dict) else None
        if not isinstance(error, dict) or error.get("type") != "invalid_request_error":
            return False
        message = error.get("message")
        return isinstance(message, str) and _CONTEXT_LENGTH.search(message) is not None

    def opening(self, event: SSEEvent | None) -> Opening:
        return "send"  # the context-length error comes as a 400 before any stream

    def error_body(self, error: ProxyError) -> bytes:
        kind = _ERROR_TYPES.get(error.status, "api_error")
        return json.dumps({"type": "error", "error": {"type": kind, "message": error.message}}).encode()

    def stream_error(self, message: str, code: str, type_: str = "upstream_error", after: bytes = b"") -> bytes:
        # The SDK raises on the `event: error` line alone; never a `message_stop` after it.
        payload = {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"

    def _own_blocks(self, content: Any) -> list[Any]:
        """The blocks of a user message that are the user's own (context elements left out)."""
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        return [b for b in blocks if not (b.get("type") == "text" and self._context.is_context(_str(b.get("text"))))]

    def _prompt_index(self, messages: list[dict[str, Any]]) -> int | None:
        for index in range(len(messages) - 1, -1, -1):
            message = messages[index]
            if message["role"] != "user" or _has_tool_result(message["content"]):
                continue
            if any(_is_words(block) for block in self._own_blocks(message["content"])):
                return index
        return None

    def _transcript(self, messages: list[dict[str, Any]], index: int | None) -> Transcript:
        own = self._own_blocks(messages[index]["content"]) if index is not None else []
        after = messages[index + 1:] if index is not None else messages
        results = {str(b.get("tool_use_id")): _text(b.get("content"))
                   for m in after if m["role"] == "user" and isinstance(m["content"], list)
                   for b in m["content"] if b.get("type") == "tool_result"}
        calls = [b for m in after if m["role"] == "assistant" and isinstance(m["content"], list)
                 for b in m["content"] if b.get("type") == "tool_use" and isinstance(b.get("id"), str)]
        upto = messages[: index + 1] if index is not None else []
        return Transcript(
            prompt=_text(own),
            query=_text(own, markers=False),
            shown=tuple(_text(m["content"]) for i, m in enumerate(messages) if i != index),
            tool_call_ids=tuple(dict.fromkeys(b["id"] for b in calls)),
            tool_steps=tuple(ToolStep(b["id"], _str(b.get("name")), json.dumps(b.get("input"), ensure_ascii=False),
                                      results.get(b["id"], "")) for b in calls),
            history=tuple((m["role"], _text(m["content"])) for m in upto if m["role"] in _CONVERSATION_ROLES),
            assistant_texts=tuple(text for m in messages if m["role"] == "assistant"
                                  for text in [_assistant_text(m["content"])] if text),
        )


def _message_problem(message: Any) -> str | None:
    """Why a message is not one the provider would take, or None (memory then skips the request)."""
    if not isinstance(message, dict):
        return "a message is not an object"
    if not isinstance(message.get("role"), str):
        return "a message has no role"
    content = message.get("content")
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return "a message's content is neither text nor a list of blocks"
    if not all(isinstance(block, dict) for block in content):
        return "a content block is not an object"
    return None


def _has_tool_result(content: Any) -> bool:
    return isinstance(content, list) and any(block.get("type") == "tool_result" for block in content)


def _is_words(block: dict[str, Any]) -> bool:
    if block.get("type") == "text":
        return bool(_str(block.get("text")).strip())
    return block.get("type") in _MARKERS


def _conversation_after(messages: list[dict[str, Any]], index: int) -> bool:
    """True when a user or assistant message follows the prompt (a tool loop's later step)."""
    return any(m["role"] in _CONVERSATION_ROLES for m in messages[index + 1:])


def _with_block(content: Any, block: str, after_prompt: bool) -> Any:
    if isinstance(content, str):
        return f"{block}\n\n{content}"
    memory = {"type": "text", "text": f"{block}\n\n"}
    marked = [i for i, part in enumerate(content) if "cache_control" in part]
    if marked:
        at = marked[-1] + 1
    elif after_prompt:
        # A client that marks its prompt (Claude Code) moves the breakpoint to the newest
        # message on a tool loop's later steps; memory stays where the first step put it,
        # after the prompt's blocks, so the prefix that step cached is read again.
        at = len(content)
    else:
        at = 0
    return [*content[:at], memory, *content[at:]]


def _text(content: Any, *, markers: bool = True) -> str:
    """The text of a message's content (or of a tool result's); other blocks noted where saved."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    pieces = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            pieces.append(_str(block.get("text")))
        elif kind == "tool_result":
            pieces.append(_text(block.get("content"), markers=markers))
        elif markers and kind in _MARKERS:
            pieces.append(_MARKERS[kind])
    return "\n".join(piece for piece in pieces if piece)


def _assistant_text(content: Any) -> str:
    """An assistant message's answer text, joined as a saved answer is (thinking left out)."""
    return content if isinstance(content, str) else blocks_text(content)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""
