"""Chat Completions requests: parse, read the turn's shape, insert the memory block.

Pure functions over the client's JSON. Unknown fields are kept everywhere, and the
client's objects are never changed in place.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_PART_MARKERS = {"image_url": "[image]", "input_audio": "[audio]", "file": "[file]"}
_NOT_HISTORY = frozenset({"system", "developer"})
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
# A message text longer than this is JSON-encoded in pieces this long: a 30 MB prompt is
# written again in short steps, each a brief hold of the interpreter, not one long call.
LONG_TEXT_CHARS = 1 << 16


@dataclass(frozen=True)
class ChatRequest:
    """A parsed chat request: the whole body, and the two fields memproxy relies on."""

    body: dict[str, Any]
    stream: bool
    messages: list[dict[str, Any]]


def parse_chat_request(body: bytes) -> ChatRequest | str:
    """The request, or a short reason (for the log) why memory must skip it."""
    try:
        doc = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        return "body is not UTF-8"
    except RecursionError:
        return "JSON nested too deeply"
    except ValueError as exc:  # JSONDecodeError, and ints past Python's digit limit
        return f"invalid JSON: {getattr(exc, 'msg', 'bad number')}"
    if not isinstance(doc, dict):
        return "body is not a JSON object"
    messages = doc.get("messages")
    if not isinstance(messages, list):
        return "messages is not a list"
    if not isinstance(doc.get("model"), str):
        return "model is missing or not a string"
    stream = doc.get("stream")
    if stream is not None and not isinstance(stream, bool):
        return "stream is not a boolean"
    return next(filter(None, map(_message_problem, messages)), None) or ChatRequest(
        body=doc, stream=bool(stream), messages=messages)


def _message_problem(message: Any) -> str | None:
    """Why a message is not one the provider would take (RELIABILITY B3), or None.

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


def insert_block(request: ChatRequest, block: str) -> bytes:
    """A new body with `block` in front of the last user message (SPEC section 5).

    Raises ValueError when the body is nested too deeply to serialise again here.
    """
    body = dict(request.body)
    messages = list(request.messages)
    index = last_user_index(messages)
    if index is not None:
        # Copy only the path to the change; the rest is shared, never mutated.
        messages[index] = _with_block(messages[index], block)
        body["messages"] = messages
    return _dump(body)


def _with_block(message: dict[str, Any], block: str) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": f"{block}\n\n{content}"}
    if isinstance(content, list):
        return {**message, "content": [{"type": "text", "text": f"{block}\n\n"}, *content]}
    return message  # no text to put it in front of; leave the provider's answer unchanged


def _dump(body: dict[str, Any]) -> bytes:
    long: dict[str, str] = {}
    skeleton = _long_texts_held_out(body, long)
    try:
        text = json.dumps(skeleton, ensure_ascii=False, separators=(",", ":"))
        return b"".join(piece.encode("utf-8") for piece in _long_texts_put_back(text, long))
    except RecursionError as exc:
        raise ValueError("request nested too deeply to serialise") from exc
    except UnicodeEncodeError:
        # A lone surrogate (valid as a JSON \\u escape) has no UTF-8 form: escape it again.
        return json.dumps(body, separators=(",", ":")).encode("ascii")


def _long_texts_held_out(body: dict[str, Any], long: dict[str, str]) -> dict[str, Any]:
    """The body with each long message text replaced by a unique stand-in (recorded in `long`)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not any(_has_long_text(m) for m in messages):
        return body
    token = secrets.token_hex(8)

    def held(value: str) -> str:
        stand_in = f"memproxy-long-text-{token}-{len(long)}"
        long[json.dumps(stand_in)] = value
        return stand_in

    copied = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str) and len(content) > LONG_TEXT_CHARS:
            message = {**message, "content": held(content)}
        elif isinstance(content, list) and _has_long_text(message):
            message = {**message, "content": [
                {**part, "text": held(part["text"])} if _long_part(part) else part for part in content]}
        copied.append(message)
    return {**body, "messages": copied}


def _has_long_text(message: Any) -> bool:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return len(content) > LONG_TEXT_CHARS
    return isinstance(content, list) and any(_long_part(part) for part in content)


def _long_part(part: Any) -> bool:
    return isinstance(part, dict) and isinstance(part.get("text"), str) and len(part["text"]) > LONG_TEXT_CHARS


def _long_texts_put_back(text: str, long: dict[str, str]) -> Iterator[str]:
    """The JSON text with each stand-in replaced by its long string, encoded in pieces."""
    position = 0
    for quoted, value in long.items():
        at = text.index(quoted, position)
        yield text[position:at]
        yield '"'
        # JSON escapes char by char, so the escaped pieces join into the escaped whole.
        for start in range(0, len(value), LONG_TEXT_CHARS):
            yield json.dumps(value[start:start + LONG_TEXT_CHARS], ensure_ascii=False)[1:-1]
        yield '"'
        position = at + len(quoted)
    yield text[position:]


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
