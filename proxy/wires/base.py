"""The Wire protocol: what the request path asks of each wire's module, and nothing more.

A wire is pure protocol code: it parses its request into a neutral Transcript, puts a
memory block into the turn's prompt, reads its answer (a JSON body or a stream's events)
into one AssistantMessage, tells its context-length error, and writes memproxy's own
errors in its own shape. No sockets, no awaits.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from proxy.errors import ProxyError
from proxy.models import AssistantMessage, Transcript
from proxy.long_json import dump_in_pieces
from proxy.wires.sse import SSEEvent

# A body longer than this gets its memory block in a thread, its long strings written in
# pieces: writing a 30 MB body again in one call would hold the event loop (and every other
# stream) for a large fraction of a second.
LARGE_BODY_BYTES = 1 << 20

Provider = Literal["openai", "anthropic", "gemini"]
# What a wire says of a stream's opening event while a request with a block waits on it:
# hold it back, send it (and all before it), or resend without the block (too long).
Opening = Literal["hold", "send", "too_long"]


@dataclass(frozen=True)
class WireRequest:
    """A parsed chat request: the client's JSON (never changed in place) and its transcript."""

    body: dict[str, Any]
    stream: bool
    transcript: Transcript
    prompt_index: int | None  # the turn's prompt message in the wire's message list
    size: int = 0  # the body's length in bytes, as the client sent it

    @property
    def large(self) -> bool:
        """True for a body written again off the event loop and in pieces (LARGE_BODY_BYTES)."""
        return self.size > LARGE_BODY_BYTES

    def with_message(self, message: dict[str, Any]) -> WireRequest:
        """A copy whose prompt message is `message` (the client's body is never changed in place)."""
        if self.prompt_index is None:
            return self
        messages = list(self.body["messages"])
        messages[self.prompt_index] = message
        return replace(self, body={**self.body, "messages": messages})


class AnswerReader(Protocol):
    """Reads a stream's events into the answer, or only watches how the stream ends."""

    @property
    def done(self) -> bool:
        """True once the wire's end event arrived."""

    @property
    def error(self) -> dict[str, Any] | None:
        """The provider's own error event, if the stream carried one."""

    @property
    def malformed(self) -> int:
        """How many data payloads were not JSON objects (skipped)."""

    @property
    def too_large(self) -> bool:
        """True when the answer passed the accumulator's bound and was not kept whole."""

    def feed(self, event: SSEEvent) -> None:
        """Take one event."""

    def message(self) -> AssistantMessage:
        """The answer so far (empty when only watching)."""


class ErrorShape(Protocol):
    """How a wire writes the errors memproxy makes itself."""

    # Whether the wire's clients skip SSE comment lines (a `: ping` while the provider is silent).
    sse_comments: bool

    def error_body(self, error: ProxyError) -> bytes:
        """The JSON body of an error answer."""

    def stream_error(self, message: str, code: str, type_: str = "upstream_error", after: bytes = b"") -> bytes:
        """The event that ends a stream memproxy must cut, so the client's SDK raises; `after`
        holds the last bytes the client got (a wire that numbers its events continues from them)."""


class Wire(ErrorShape, Protocol):
    """One provider API format."""

    name: str
    provider: Provider

    def parse(self, body: bytes) -> WireRequest | str:
        """The request, or a short reason (for the log) why memory must skip it."""

    def insert_block(self, request: WireRequest, block: str) -> bytes:
        """A new body with the block in the turn's prompt; ValueError when it cannot be written."""

    def with_prompt(self, request: WireRequest, text: str) -> WireRequest:
        """The request with its prompt's words replaced by `text` (a hook's updated_prompt)."""

    def answer_reader(self, *, keep_answer: bool) -> AnswerReader:
        """A reader for one streamed answer (`keep_answer=False`: only how it ends)."""

    def parse_answer(self, body: bytes) -> AssistantMessage | None:
        """The answer of a JSON response body; None when it is not one."""

    def is_context_length_error(self, status: int, body: bytes) -> bool:
        """True when the provider refused the request as too long for the model's context."""

    def opening(self, event: SSEEvent | None) -> Opening:
        """A streamed answer's event before any output (None: before the first): whether a
        context-length failure may still follow it (`hold`), or the stream is the answer
        (`send`), or it is that failure (`too_long`)."""


def with_words(content: Any, text: str, is_words: Callable[[dict[str, Any]], bool], part_type: str = "text") -> Any:
    """A prompt's content with its words replaced by `text`: the first text part takes it, the
    other text parts go, every other part (an image, a client's context) stays in place; with no
    text part, a new one of the wire's `part_type` comes first."""
    if not isinstance(content, list):
        return text
    parts: list[Any] = []
    placed = False
    for part in content:
        if not (isinstance(part, dict) and is_words(part)):
            parts.append(part)
        elif not placed:
            parts.append({**part, "text": text})
            placed = True
    return parts if placed else [{"type": part_type, "text": text}, *parts]


def dump_json(body: dict[str, Any], *, in_pieces: bool = False) -> bytes:
    """A request body serialised again (compact, UTF-8); ValueError when nested too deeply.

    `in_pieces`: long strings are written a piece at a time (for a large body, in a thread).
    """
    try:
        if in_pieces:
            return dump_in_pieces(body)
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except RecursionError as exc:
        raise ValueError("request nested too deeply to serialise") from exc
    except UnicodeEncodeError:
        # A lone surrogate (valid as a JSON \\u escape) has no UTF-8 form: escape it again.
        return json.dumps(body, separators=(",", ":")).encode("ascii")


def model_and_stream_problem(doc: dict[str, Any]) -> str | None:
    """Why the body's `model` or `stream` is not what every wire's chat request holds, or None."""
    if not isinstance(doc.get("model"), str):
        return "model is missing or not a string"
    stream = doc.get("stream")
    if stream is not None and not isinstance(stream, bool):
        return "stream is not a boolean"
    return None


def load_json(body: bytes) -> dict[str, Any] | str:
    """The body's JSON object, or a short reason why it is not one."""
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
    return doc
