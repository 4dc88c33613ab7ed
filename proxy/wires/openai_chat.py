"""The Chat Completions wire: parse, read the turn's shape, insert the memory block.

Pure functions over the client's JSON. Unknown fields are kept everywhere, and the
client's objects are never changed in place.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from proxy.errors import ProxyError
from proxy.models import AssistantMessage, ToolStep, Transcript
from proxy.wires import openai_chat_answer
from proxy.wires.base import (
    AnswerReader, Opening, Provider, WireRequest, dump_json, load_json, model_and_stream_problem, with_words,
)
from proxy.wires.sse import SSEEvent

_PART_MARKERS = {"image_url": "[image]", "input_audio": "[audio]", "file": "[file]"}
_NOT_HISTORY = frozenset({"system", "developer"})
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


@dataclass(frozen=True)
class ChatRequest:
    """A parsed chat request: the whole body, and the two fields memproxy relies on."""

    body: dict[str, Any]
    stream: bool
    messages: list[dict[str, Any]]


def parse_chat_request(body: bytes) -> ChatRequest | str:
    """The request, or a short reason (for the log) why memory must skip it."""
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
    return next(filter(None, map(_message_problem, messages)), None) or ChatRequest(
        body=doc, stream=bool(stream), messages=messages)


def _message_problem(message: Any) -> str | None:
    """Why a message is not one the provider would take (then memory skips it), or None.

    Memory skips such a request whole: it goes upstream unchanged, the provider's own 400
    comes back, and nothing of it is saved.
    """
    if not isinstance(message, dict):
        return "a message is not an object"
    if message.get("role") not in _ROLES:
        return "a message has an unknown role"
    content = message.get("content")
    if content is not None and not isinstance(content, (str, list)):
        return "a message's content is neither text nor a list of parts"
    return None


def message_text(content: Any, *, markers: bool = True) -> str:
    """The text of a message's content; non-text parts become `[image]`, `[audio]`, `[file]`
    (noted where a message is saved), or nothing (`markers=False`: what recall searches by)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    pieces = (_part_text(part, markers) for part in content if isinstance(part, dict))
    return "\n".join(piece for piece in pieces if piece is not None)


def _part_text(part: dict[str, Any], markers: bool) -> str | None:
    kind = part.get("type")
    if kind in ("text", "refusal"):
        text = part.get(kind)
        return text if isinstance(text, str) else None
    if isinstance(kind, str) and markers:
        return _PART_MARKERS.get(kind)
    return None


def last_user_index(messages: list[dict[str, Any]]) -> int | None:
    """Index of the last message whose role is `user`."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return index
    return None


def _after_last_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # With no user message at all, the whole list counts as "after" it.
    index = last_user_index(messages)
    return messages if index is None else messages[index + 1 :]


def tool_call_ids_after_last_user(messages: list[dict[str, Any]]) -> list[str]:
    """Ids of the assistant tool calls after the last user message: a later tool-loop step."""
    ids: dict[str, None] = {}
    for message in _after_last_user(messages):
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        if not isinstance(calls, list):
            continue
        for call in calls:
            call_id = call.get("id") if isinstance(call, dict) else None
            if isinstance(call_id, str) and call_id:
                ids[call_id] = None
    return list(ids)


def tool_results_after_last_user(messages: list[dict[str, Any]]) -> dict[str, str]:
    """tool_call_id → result text of the `tool` messages after the last user message."""
    results: dict[str, str] = {}
    for message in _after_last_user(messages):
        call_id = message.get("tool_call_id")
        if message.get("role") == "tool" and isinstance(call_id, str) and call_id:
            results[call_id] = message_text(message.get("content"))
    return results


def assistant_texts(messages: list[dict[str, Any]]) -> list[str]:
    """The non-empty text of every assistant message, in order."""
    texts = (message_text(m.get("content")) for m in messages if m.get("role") == "assistant")
    return [text for text in texts if text]


def history_material(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(role, text) of the messages up to the last user one, system and developer left out."""
    index = last_user_index(messages)
    if index is None:
        return []
    return [
        (_role(m), message_text(m.get("content")))
        for m in messages[: index + 1]
        if m.get("role") not in _NOT_HISTORY
    ]


def _role(message: dict[str, Any]) -> str:
    role = message.get("role")
    return role if isinstance(role, str) else ""


def insert_block(request: ChatRequest, block: str, *, in_pieces: bool = False) -> bytes:
    """A new body with `block` in front of the last user message (docs/retrieval.md).

    Raises ValueError when the body is nested too deeply to serialise again here.
    `in_pieces`: long strings are written a piece at a time (base.dump_json).
    """
    body = dict(request.body)
    messages = list(request.messages)
    index = last_user_index(messages)
    if index is not None:
        # Copy only the path to the change; the rest is shared, never mutated.
        messages[index] = _with_block(messages[index], block)
        body["messages"] = messages
    return dump_json(body, in_pieces=in_pieces)


def _with_block(message: dict[str, Any], block: str) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": f"{block}\n\n{content}"}
    if isinstance(content, list):
        return {**message, "content": [{"type": "text", "text": f"{block}\n\n"}, *content]}
    return message  # no text to put it in front of; leave the provider's answer unchanged


def text_hash(text: str) -> str:
    """sha256 hex of the text's UTF-8 bytes: how an assistant message is recognised later."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def is_context_length_error(status: int, body: bytes) -> bool:
    """True for a 400 whose JSON error code is `context_length_exceeded`."""
    if status != 400:
        return False
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return False
    error = doc.get("error") if isinstance(doc, dict) else None
    return isinstance(error, dict) and error.get("code") == "context_length_exceeded"


def transcript(request: ChatRequest) -> Transcript:
    """What memory needs of the request, in one pass: the prompt is the last `user` message."""
    messages = request.messages
    index = last_user_index(messages)
    shown: list[str] = []
    history: list[tuple[str, str]] = []
    answers: list[str] = []
    calls: list[tuple[str, str, str]] = []
    results: dict[str, str] = {}
    for position, message in enumerate(messages):
        role = message.get("role")
        text = message_text(message.get("content"))
        if position != index:
            shown.append(text)
        if role == "assistant" and text:
            answers.append(text)
        if index is not None and position <= index:
            if role not in _NOT_HISTORY:
                history.append((_role(message), text))
        elif role == "assistant":
            calls += _calls(message.get("tool_calls"))
        elif role == "tool" and isinstance(message.get("tool_call_id"), str) and message["tool_call_id"]:
            results[message["tool_call_id"]] = text
    prompt = messages[index].get("content") if index is not None else None
    user = request.body.get("user")
    return Transcript(
        prompt=message_text(prompt), query=message_text(prompt, markers=False), shown=tuple(shown),
        tool_call_ids=tuple(dict.fromkeys(call_id for call_id, _, _ in calls if isinstance(call_id, str) and call_id)),
        tool_steps=tuple(ToolStep(str(call_id), name, arguments, results.get(str(call_id), ""))
                         for call_id, name, arguments in calls),
        history=tuple(history), assistant_texts=tuple(answers),
        body_user=user if isinstance(user, str) else None,
    )


def _calls(tool_calls: Any) -> list[tuple[Any, str, str]]:
    """(id as sent, name, arguments) of an assistant message's tool calls."""
    if not isinstance(tool_calls, list):
        return []
    found = []
    for call in tool_calls:
        if not isinstance(call, dict):
            continue
        part, text_key = openai_chat_answer.called_tool(call) or ({}, "arguments")
        found.append((call.get("id"), str(part.get("name", "")), str(part.get(text_key, ""))))
    return found


class OpenAIChat:
    """The Chat Completions wire (`POST /v1/chat/completions`)."""

    name = "openai_chat"
    provider: Provider = "openai"
    sse_comments = True

    def parse(self, body: bytes) -> WireRequest | str:
        request = parse_chat_request(body)
        if isinstance(request, str):
            return request
        return WireRequest(request.body, request.stream, transcript(request), last_user_index(request.messages),
                           len(body))

    def insert_block(self, request: WireRequest, block: str) -> bytes:
        chat = ChatRequest(request.body, request.stream, request.body["messages"])
        return insert_block(chat, block, in_pieces=request.large)

    def with_prompt(self, request: WireRequest, text: str) -> WireRequest:
        if request.prompt_index is None:
            return request
        message = request.body["messages"][request.prompt_index]
        words = with_words(message.get("content"), text, lambda part: part.get("type") == "text")
        return request.with_message({**message, "content": words})

    def answer_reader(self, *, keep_answer: bool) -> AnswerReader:
        if keep_answer:
            return openai_chat_answer.ChatStreamAccumulator(only_choice=0)
        return openai_chat_answer.StreamEnd()

    def parse_answer(self, body: bytes) -> AssistantMessage | None:
        return openai_chat_answer.parse_completion(body)

    def is_context_length_error(self, status: int, body: bytes) -> bool:
        return is_context_length_error(status, body)

    def opening(self, event: SSEEvent | None) -> Opening:
        return "send"  # the context-length error comes as a 400 before any stream

    def error_body(self, error: ProxyError) -> bytes:
        return error.body()

    def stream_error(self, message: str, code: str, type_: str = "upstream_error", after: bytes = b"") -> bytes:
        return openai_chat_answer.error_event(message, code, type_)
