"""The Gemini wire (`POST /v1beta/models/{model}:generateContent` and `:streamGenerateContent`).

The request is `contents`, a list of `{role, parts}` (`user` and `model`; a missing role is
the user's). The turn's prompt is the last user content that holds no `functionResponse`
part and has words of the user's own: a text part that is wholly a `scope.context_tags`
element (Gemini CLI's `<session_context>`) is the client's context, neither searched by nor
saved. The block goes in as a text part of that content, right before the user's words, so
the parts before them (the client's context, the cached prefix) stay as they were. Which of
the two methods a request calls is in its path, not its body: each is its own instance.
Parts and fields this module does not know pass through untouched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from proxy.errors import ProxyError
from proxy.models import AssistantMessage, ToolStep, Transcript
from proxy.wires.base import AnswerReader, Opening, Provider, WireRequest, dump_json, load_json
from proxy.wires.context_tags import DEFAULT_TAGS, ContextTags
from proxy.wires.gemini_answer import GeminiStreamReader, answer_from_chunks, call_id, parts_text
from proxy.wires.sse import SSEEvent

_ROLES = {"user": "user", "model": "assistant"}
_CONTEXT_LENGTH = re.compile(r"exceeds the maximum number of tokens")
# google.rpc.Code names by HTTP status, as Google's APIs write them.
_STATUSES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
             408: "DEADLINE_EXCEEDED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED",
             500: "INTERNAL", 501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE",
             504: "DEADLINE_EXCEEDED"}
# A cut stream ends with Google's error object as a plain JSON line, not a `data:` event: the
# Python SDK raises on either, but the JavaScript SDK (Gemini CLI's) only on a read that is
# one such object, and takes a `data:` event as an empty response.
_CUT_CODE = 500


# The Gemini API's methods on a model: a path under /v1 naming one is Gemini's (an OpenAI model id
# may hold a colon too: `GET /v1/models/ft:...`).
_MODEL_METHODS = frozenset({"generateContent", "streamGenerateContent", "countTokens", "embedContent",
                            "batchEmbedContents", "batchGenerateContent", "asyncBatchEmbedContent", "predict",
                            "predictLongRunning"})


def model_method(path: str) -> tuple[str, str] | None:
    """(model, method) of a path after the version prefix, `/models/{model}:{method}` with one of the
    Gemini API's methods; None otherwise."""
    match = re.fullmatch(r"/models/([^/:]+):([A-Za-z]+)", path)
    return (match.group(1), match.group(2)) if match and match.group(2) in _MODEL_METHODS else None


class GeminiGenerateContent:
    """The Gemini wire, for one of its two methods (`stream`: `streamGenerateContent`)."""

    name = "gemini_generate_content"
    provider: Provider = "gemini"
    sse_comments = False  # Google's SDKs read a `: ping` comment line as a broken JSON chunk

    def __init__(self, context_tags: Iterable[str] = DEFAULT_TAGS, *, stream: bool = False) -> None:
        self._context = ContextTags(context_tags)
        self.stream = stream

    def parse(self, body: bytes) -> WireRequest | str:
        doc = load_json(body)
        if isinstance(doc, str):
            return doc
        contents = doc.get("contents")
        if not isinstance(contents, list):
            return "contents is not a list"
        problem = next(filter(None, map(_content_problem, contents)), None)
        if problem is not None:
            return problem
        index = self._prompt_index(contents)
        return WireRequest(doc, self.stream, self._transcript(contents, index), index, len(body))

    def insert_block(self, request: WireRequest, block: str) -> bytes:
        index = request.prompt_index
        if index is None:
            return dump_json(request.body, in_pieces=request.large)
        contents = list(request.body["contents"])
        content = contents[index]
        parts = list(content["parts"])
        at = next(i for i, part in enumerate(parts) if self._is_own_words(part))
        parts.insert(at, {"text": f"{block}\n\n"})
        contents[index] = {**content, "parts": parts}
        return dump_json({**request.body, "contents": contents}, in_pieces=request.large)

    def with_prompt(self, request: WireRequest, text: str) -> WireRequest:
        if request.prompt_index is None:
            return request
        contents = list(request.body["contents"])
        content = contents[request.prompt_index]
        parts: list[Any] = []
        placed = False
        for part in content["parts"]:
            if not self._is_own_words(part) or "text" not in part:
                parts.append(part)
            elif not placed:
                parts.append({**part, "text": text})
                placed = True
        if not placed:
            at = next((i for i, part in enumerate(parts) if self._is_own_words(part)), len(parts))
            parts.insert(at, {"text": text})
        contents[request.prompt_index] = {**content, "parts": parts}
        return replace(request, body={**request.body, "contents": contents})

    def answer_reader(self, *, keep_answer: bool) -> AnswerReader:
        return GeminiStreamReader(keep_answer=keep_answer)

    def parse_answer(self, body: bytes) -> AssistantMessage | None:
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            return None
        return answer_from_chunks(doc if isinstance(doc, list) else [doc])

    def is_context_length_error(self, status: int, body: bytes) -> bool:
        doc = load_json(body) if status == 400 else None
        error = doc.get("error") if isinstance(doc, dict) else None
        if not isinstance(error, dict) or error.get("status") != "INVALID_ARGUMENT":
            return False
        message = error.get("message")
        return isinstance(message, str) and _CONTEXT_LENGTH.search(message) is not None

    def opening(self, event: SSEEvent | None) -> Opening:
        return "send"  # the context-length error comes as a 400 before any stream

    def error_body(self, error: ProxyError) -> bytes:
        return json.dumps(_error(error.status, error.message)).encode()

    def stream_error(self, message: str, code: str, type_: str = "upstream_error", after: bytes = b"") -> bytes:
        return json.dumps(_error(_CUT_CODE, message)).encode() + b"\n"

    def _is_own_words(self, part: Any) -> bool:
        """A part of the user's own: words (not a thought, not a context element), or a file."""
        if not isinstance(part, dict) or part.get("thought"):
            return False
        text = part.get("text")
        if isinstance(text, str):
            return bool(text.strip()) and not self._context.is_context(text)
        return "inlineData" in part or "fileData" in part

    def _prompt_index(self, contents: list[dict[str, Any]]) -> int | None:
        for index in range(len(contents) - 1, -1, -1):
            content = contents[index]
            if _role(content) != "user" or any("functionResponse" in part for part in content["parts"]):
                continue
            if any(self._is_own_words(part) for part in content["parts"]):
                return index
        return None

    def _transcript(self, contents: list[dict[str, Any]], index: int | None) -> Transcript:
        own = [part for part in contents[index]["parts"] if self._is_own_words(part)] if index is not None else []
        after = contents[index + 1:] if index is not None else contents
        upto = contents[: index + 1] if index is not None else []
        steps = _tool_steps(after)
        return Transcript(
            prompt=_text(own),
            query=_text(own, markers=False),
            shown=tuple(_text(c["parts"]) for i, c in enumerate(contents) if i != index),
            tool_call_ids=tuple(dict.fromkeys(step.call_id for step in steps)),
            tool_steps=steps,
            history=tuple((_ROLES[_role(c)], _text(c["parts"] if _role(c) == "model" else
                                                  [p for p in c["parts"] if self._is_own_words(p)]))
                          for c in upto if _role(c) in _ROLES),
            assistant_texts=tuple(text for parts in _answers(contents) for text in [parts_text(parts)] if text),
        )


def _error(status: int, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": _STATUSES.get(status, "UNKNOWN")}}


def _role(content: dict[str, Any]) -> str:
    role = content.get("role")
    return role if isinstance(role, str) and role else "user"


def _content_problem(content: Any) -> str | None:
    """Why a content is not one the provider would take, or None (memory then skips the request)."""
    if not isinstance(content, dict):
        return "a content is not an object"
    if "role" in content and not isinstance(content["role"], str):
        return "a content's role is not a string"
    parts = content.get("parts")
    if not isinstance(parts, list):
        return "a content's parts is not a list"
    if not all(isinstance(part, dict) for part in parts):
        return "a part is not an object"
    return None


def _answers(contents: list[dict[str, Any]]) -> list[list[Any]]:
    """The parts of each model answer in the history: a run of consecutive `model` contents is one
    answer (Google's Python SDK keeps a streamed answer in a chat's history as a content per chunk)."""
    answers: list[list[Any]] = []
    after_model = False
    for content in contents:
        is_model = _role(content) == "model"
        if is_model and after_model:
            answers[-1].extend(content["parts"])
        elif is_model:
            answers.append(list(content["parts"]))
        after_model = is_model
    return answers


def _tool_steps(after: list[dict[str, Any]]) -> tuple[ToolStep, ...]:
    """The calls the model made after the prompt with their results: a result naming a call's own
    `id` is that call's; one without (or naming none of them) is the next call of its name not yet
    answered."""
    calls: list[tuple[str, str | None, str, str]] = []  # (memproxy's id, the call's own, name, arguments)
    for parts in _answers(after):
        seen: dict[str, int] = {}
        for part in parts:
            call = part.get("functionCall")
            if isinstance(call, dict):
                name = _str(call.get("name"))
                own = call.get("id")
                calls.append((call_id(part, seen.get(name, 0)), own if isinstance(own, str) else None, name,
                              json.dumps(call.get("args"), ensure_ascii=False)))
                seen[name] = seen.get(name, 0) + 1
    results: dict[str, str] = {}
    for content in after:
        for part in content["parts"] if _role(content) != "model" else []:
            response = part.get("functionResponse")
            if not isinstance(response, dict):
                continue
            target = next((key for key, own, _, _ in calls if own is not None and own == response.get("id")),
                          None) or next((key for key, _, name, _ in calls
                                         if name == response.get("name") and key not in results), None)
            if target is not None:
                results[target] = json.dumps(response.get("response"), ensure_ascii=False)
    return tuple(ToolStep(key, name, arguments, results.get(key, "")) for key, _, name, arguments in calls)


def _text(parts: list[Any], *, markers: bool = True) -> str:
    """The text of a content's parts (thoughts left out); files noted where saved."""
    pieces = []
    for part in parts:
        if not isinstance(part, dict) or part.get("thought"):
            continue
        if isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif markers and ("inlineData" in part or "fileData" in part):
            pieces.append(_marker(part))
        elif isinstance(part.get("functionResponse"), dict):
            pieces.append(json.dumps(part["functionResponse"].get("response"), ensure_ascii=False))
    return "\n".join(piece for piece in pieces if piece)


def _marker(part: dict[str, Any]) -> str:
    data = part.get("inlineData") or part.get("fileData")
    mime = data.get("mimeType") if isinstance(data, dict) else None
    return "[image]" if isinstance(mime, str) and mime.startswith("image/") else "[file]"


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""
