"""Server-sent events: bytes → events, nothing wire-specific.

The decoder follows the WHATWG event-stream rules as openai-python's `SSEDecoder` applies
them, so memproxy reads a stream as the client's SDK will. Where the SDK strays from WHATWG
(it dispatches events with no data line, keeps a BOM, raises on bad UTF-8) WHATWG wins:
those are never answer events. It only reads a copy: the forwarded bytes are never
re-serialised.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_EVENT_CHARS = 16 << 20  # one event's lines held while it is incomplete

_LINE_END = re.compile(r"\r\n|\r|\n")
_BOM = "\ufeff"


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event; `id` is the last event id seen so far, as WHATWG keeps it."""

    event: str | None
    data: str
    id: str | None = None


class SSEDecoder:
    """Incremental event-stream decoder: feed it chunks as they arrive."""

    def __init__(self, max_event_chars: int = DEFAULT_MAX_EVENT_CHARS) -> None:
        self._max_event_chars = max_event_chars
        self._oversized = 0
        self._reset()

    def _reset(self) -> None:
        # Replacement, not strict: the SDK may choke on bad bytes, the proxy must not.
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending: list[str] = []  # an incomplete line, in pieces
        self._pending_chars = 0
        self._started = False
        self._skip_lf = False  # the last chunk ended in CR: a leading LF is the same line end
        self._in_dropped_line = False  # the rest of an oversized line is still to come
        self._dropping_event = False
        self._event: str | None = None
        self._data: list[str] = []
        self._data_chars = 0
        self._last_id: str | None = None

    @property
    def oversized(self) -> int:
        """How many events were dropped for holding more than `max_event_chars`."""
        return self._oversized

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode one chunk and return the events it completes."""
        return self._feed_text(self._utf8.decode(chunk))

    def flush(self) -> list[SSEEvent]:
        """End of stream: return what is left and reset for a new stream."""
        events = self._feed_text(self._utf8.decode(b"", final=True))
        # WHATWG: an event not closed by a blank line is discarded at end of stream.
        self._reset()
        return events

    def _feed_text(self, text: str) -> list[SSEEvent]:
        if text and not self._started:
            self._started = True
            if text[0] == _BOM:
                text = text[1:]
        if text and self._skip_lf:
            self._skip_lf = False
            if text[0] == "\n":
                text = text[1:]
        if "\n" not in text and "\r" not in text:
            self._hold(text)
            return []
        if self._pending:
            self._pending.append(text)
            text = "".join(self._pending)
            self._pending.clear()
            self._pending_chars = 0
        # Most streams end their lines in LF alone: str.split is three times the regex's pace.
        lines = text.split("\n") if "\r" not in text else _LINE_END.split(text)
        tail = lines.pop()
        self._skip_lf = text[-1] == "\r"
        events = self._lines(lines)
        self._hold(tail)
        return events

    def _hold(self, text: str) -> None:
        if not text or self._in_dropped_line:
            return
        self._pending.append(text)
        self._pending_chars += len(text)
        if self._pending_chars + self._data_chars > self._max_event_chars:
            self._drop_event()
            self._in_dropped_line = True

    def _drop_event(self) -> None:
        # The proxy only reads a copy; past the limit, losing the event beats unbounded memory.
        if not self._dropping_event:
            self._oversized += 1
        self._pending.clear()
        self._pending_chars = 0
        self._data = []
        self._data_chars = 0
        self._dropping_event = True

    def _lines(self, lines: list[str]) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        for line in lines:
            if self._in_dropped_line:
                self._in_dropped_line = False
            elif not line:
                if self._data:
                    events.append(SSEEvent(self._event, "\n".join(self._data), self._last_id))
                    self._data = []
                    self._data_chars = 0
                self._event = None
                self._dropping_event = False
            elif line[0] != ":" and not self._dropping_event:
                self._field(line)
        return events

    def _field(self, line: str) -> None:
        name, _, value = line.partition(":")
        if value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._data_chars += len(value)
            if self._data_chars + self._pending_chars > self._max_event_chars:
                self._drop_event()
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._last_id = value


def json_object(data: str | bytes) -> dict[str, Any] | None:
    """An event's (or a body's) JSON object; None for anything else."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):  # ValueError covers bad UTF-8 and huge ints too
        return None
    return value if isinstance(value, dict) else None
