"""The Responses wire (`POST /v1/responses`): Codex CLI and the OpenAI Agents SDK.

`input` is a string (one user message) or a list of items: messages (`input_text`,
`input_image`, `input_file` parts), the calls the client runs and their `*_call_output`
items, `reasoning` items, and item types this module does not know, which pass through
untouched. `instructions` and `prompt_cache_key` are never changed.

The turn's prompt is the last user message with words of the user's own: Codex sends its
`<environment_context>` as a user message of its own before the prompt, and that is
context (`scope.context_tags`), neither searched by nor saved. A tool-loop step is
recognised by the `call_id`s of the client-run calls and outputs after the prompt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from proxy.errors import ProxyError
from proxy.models import AssistantMessage, ToolStep, Transcript
from proxy.wires.base import (
    AnswerReader, Opening, Provider, WireRequest, dump_json, load_json, model_and_stream_problem, with_words,
)
from proxy.wires.context_tags import DEFAULT_TAGS, ContextTags
from proxy.wires.openai_responses_answer import (
    CLIENT_CALLS, ResponsesStreamReader, call_arguments, call_name, parse_response,
)
from proxy.wires.sse import SSEEvent, json_object

_MARKERS = {"input_image": "[image]", "input_file": "[file]", "input_audio": "[audio]"}
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
_CONVERSATION_ROLES = frozenset({"user", "assistant"})
_SEQUENCE_NUMBER = re.compile(rb'"sequence_number"\s*:\s*(\d+)')
_OPENING = frozenset({"response.created", "response.in_progress", "response.queued"})  # no output yet


class OpenAIResponses:
    """The Responses wire; `context_tags` name the messages that are a client's, not the user's."""

    name = "openai_responses"
    provider: Provider = "openai"
    sse_comments = True

    def __init__(self, context_tags: Iterable[str] = DEFAULT_TAGS) -> None:
        self._context = ContextTags(context_tags)

    def parse(self, body: bytes) -> WireRequest | str:
        doc = load_json(body)
        if isinstance(doc, str):
            return doc
        items = doc.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        if not isinstance(items, list):
            return "input is neither text nor a list of items"
        problem = model_and_stream_problem(doc)
        if problem is not None:
            return problem
        stream = doc.get("stream")
        for name in ("previous_response_id", "user"):
            if doc.get(name) is not None and not isinstance(doc[name], str):
                return f"{name} is not a string"
        problem = next(filter(None, map(_item_problem, items)), None)
        if problem is not None:
            return problem
        index = self._prompt_index(items)
        return WireRequest(doc, bool(stream), self._transcript(doc, items, index), index, len(body))

    def insert_block(self, request: WireRequest, block: str) -> bytes:
        index = request.prompt_index
        if index is None:
            return dump_json(request.body, in_pieces=request.large)
        body = dict(request.body)
        if isinstance(body["input"], str):
            body["input"] = f"{block}\n\n{body['input']}"
            return dump_json(body, in_pieces=request.large)
        items = list(body["input"])
        content = items[index]["content"]
        if isinstance(content, str):
            content = f"{block}\n\n{content}"
        else:
            content = [{"type": "input_text", "text": f"{block}\n\n"}, *content]
        items[index] = {**items[index], "content": content}
        body["input"] = items
        return dump_json(body, in_pieces=request.large)

    def with_prompt(self, request: WireRequest, text: str) -> WireRequest:
        index = request.prompt_index
        if index is None:
            return request
        if isinstance(request.body["input"], str):
            return replace(request, body={**request.body, "input": text})
        items = list(request.body["input"])
        words = with_words(items[index]["content"], text, self._is_own_text, part_type="input_text")
        items[index] = {**items[index], "content": words}
        return replace(request, body={**request.body, "input": items})

    def answer_reader(self, *, keep_answer: bool) -> AnswerReader:
        return ResponsesStreamReader(keep_answer=keep_answer)

    def parse_answer(self, body: bytes) -> AssistantMessage | None:
        doc = load_json(body)
        return None if isinstance(doc, str) else parse_response(doc)

    def is_context_length_error(self, status: int, body: bytes) -> bool:
        doc = load_json(body) if status == 400 else None
        error = doc.get("error") if isinstance(doc, dict) else None
        return isinstance(error, dict) and error.get("code") == "context_length_exceeded"

    def opening(self, event: SSEEvent | None) -> Opening:
        # A context-length failure comes as `response.failed` after `response.created`.
        if event is None:
            return "hold"
        payload = json_object(event.data)
        kind = payload.get("type", event.event) if payload is not None else event.event
        if kind in _OPENING:
            return "hold"
        if kind == "response.failed" and payload is not None and _error_code(payload) == "context_length_exceeded":
            return "too_long"
        return "send"

    def error_body(self, error: ProxyError) -> bytes:
        return error.body()

    def stream_error(self, message: str, code: str, type_: str = "upstream_error", after: bytes = b"") -> bytes:
        # The top-level `error` object is what makes the `openai` SDK raise; never a
        # `response.completed` after it. Its number follows the last event's, as the provider's would.
        numbers = _SEQUENCE_NUMBER.findall(after)
        payload = {"type": "error", "code": code, "message": message,
                   "sequence_number": int(numbers[-1]) + 1 if numbers else 0,
                   "error": {"message": message, "type": type_, "code": code}}
        return b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"

    def _own_parts(self, content: Any) -> list[Any]:
        """The parts of a user message that are the user's own (context elements left out)."""
        parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
        return [p for p in parts
                if not (p.get("type") == "input_text" and self._context.is_context(_str(p.get("text"))))]

    def _is_own_text(self, part: dict[str, Any]) -> bool:
        """True for a text part of the user's own words (not a client's context element)."""
        return part.get("type") == "input_text" and not self._context.is_context(_str(part.get("text")))

    def _prompt_index(self, items: list[dict[str, Any]]) -> int | None:
        for index in range(len(items) - 1, -1, -1):
            item = items[index]
            if _is_message(item) and item["role"] == "user" and any(map(_is_words, self._own_parts(item["content"]))):
                return index
        return None

    def _transcript(self, body: dict[str, Any], items: list[dict[str, Any]], index: int | None) -> Transcript:
        own = self._own_parts(items[index]["content"]) if index is not None else []
        after = items[index + 1:] if index is not None else items
        calls = [i for i in after if i.get("type") in CLIENT_CALLS and isinstance(i.get("call_id"), str)]
        outputs = {i["call_id"]: _output_text(i.get("output")) for i in after
                   if _is_call_output(i) and isinstance(i.get("call_id"), str)}
        called = {call["call_id"] for call in calls}
        steps = [ToolStep(c["call_id"], call_name(c), call_arguments(c), outputs.get(c["call_id"], "")) for c in calls]
        # With previous_response_id the calls stay on the provider: only their outputs come back.
        steps += [ToolStep(call_id, "", "", result) for call_id, result in outputs.items() if call_id not in called]
        upto = items[: index + 1] if index is not None else []
        user = body.get("user")
        conversation = body.get("conversation")
        conversation = conversation.get("id") if isinstance(conversation, dict) else conversation
        return Transcript(
            prompt=_text(own),
            query=_text(own, markers=False),
            shown=tuple(text for i, item in enumerate(items) if i != index for text in [_item_text(item)] if text),
            tool_call_ids=tuple(dict.fromkeys(step.call_id for step in steps)),
            tool_steps=tuple(steps),
            history=tuple((m["role"], _text(m["content"])) for m in upto
                          if _is_message(m) and m["role"] in _CONVERSATION_ROLES),
            assistant_texts=_assistant_texts(items),
            body_user=user if isinstance(user, str) else None,
            previous_response=body.get("previous_response_id") or None,
            conversation_ref=conversation if isinstance(conversation, str) else None,
        )


def _error_code(payload: dict[str, Any]) -> Any:
    response = payload.get("response")
    error = response.get("error") if isinstance(response, dict) else None
    return error.get("code") if isinstance(error, dict) else None


def _is_message(item: dict[str, Any]) -> bool:
    return item.get("type", "message") == "message" and "role" in item


def _is_call_output(item: dict[str, Any]) -> bool:
    kind = item.get("type")
    return isinstance(kind, str) and kind.endswith("_output") and kind.removesuffix("_output") in CLIENT_CALLS


def _item_problem(item: Any) -> str | None:
    """Why an item is not one the provider would take, or None (memory then skips the request)."""
    if not isinstance(item, dict):
        return "an input item is not an object"
    if not _is_message(item):
        return None if isinstance(item.get("type"), str) else "an input item has no type"
    if not isinstance(item["role"], str):
        return "a message's role is not a string"
    content = item.get("content")
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return "a message's content is neither text nor a list of parts"
    if not all(isinstance(part, dict) for part in content):
        return "a content part is not an object"
    return None


def _is_words(part: dict[str, Any]) -> bool:
    if part.get("type") == "input_text":
        return bool(_str(part.get("text")).strip())
    return part.get("type") in _MARKERS


def _text(content: Any, *, markers: bool = True) -> str:
    """The text of a message's content; other parts noted where saved (`[image]`)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    pieces = []
    for part in content:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            pieces.append(_str(part.get(_TEXT_PARTS[kind])))
        elif markers and kind in _MARKERS:
            pieces.append(_MARKERS[kind])
    return "\n".join(piece for piece in pieces if piece)


def _output_text(output: Any) -> str:
    """A call output's text: a string, text parts, or the JSON as sent."""
    if isinstance(output, (str, list)):
        return _text(output)
    return json.dumps(output, ensure_ascii=False) if output is not None else ""


def _item_text(item: dict[str, Any]) -> str:
    if _is_message(item):
        return _text(item["content"])
    return _output_text(item.get("output")) if _is_call_output(item) else ""


def _assistant_texts(items: list[dict[str, Any]]) -> tuple[str, ...]:
    """Each answer the client sends back, as it was saved: the assistant messages of one
    response joined (other items between them, such as reasoning, do not split it)."""
    answers: list[str] = []
    run: list[str] = []
    for item in [*items, {"role": "user", "content": ""}]:
        if _is_message(item) and item["role"] == "assistant":
            run.append(_text(item["content"], markers=False))
        elif (_is_message(item) or _is_call_output(item)) and run:
            answers.append("\n".join(text for text in run if text))
            run = []
    return tuple(answer for answer in answers if answer)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""
