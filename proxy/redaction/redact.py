"""Secrets out before anything is saved or logged: each becomes `[REDACTED:<kind>]`.

Best-effort defence in depth, not a security boundary: `proxy.redaction.secret_shapes` says
what a secret looks like; this module finds every one in a text, in linear time.

The text is read in windows of WINDOW_CHARS, each rule scanning a window for its needle
and matching from there, so no single step of the work holds the interpreter for long:
redaction of a long text run in a thread (the pipeline does so past INLINE_REDACT_CHARS)
leaves the event loop free between steps. Every rule's matches are collected as spans,
overlapping spans are joined (the first rule's kind wins), and the text is rebuilt once.

A text that is not all ASCII is read a second time as it reads (`visible_ascii_mapped`): invisible
characters out and look-alikes folded, so `pass\u200bword=`, `ｐａｓｓｗｏｒｄ=` or a
Cyrillic `а` hide nothing; what that reading finds is cut from the text as written.

A text with JSON escapes is also read as they spell it (`proxy.redaction.json_escapes`), a few
levels deep: a tool call's arguments say `pass\\u200bword=` or `{\\"password\\": ...}` with
them, and what they say is redacted as a user's message is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from proxy.redaction.confusables import visible_ascii_mapped
from proxy.redaction.json_escapes import unescaped_mapped
from proxy.redaction.secret_shapes import (
    LOOKBEHIND_CHARS, MAX_PEM_CHARS, REACH_CHARS, RULES, is_credential_name, is_placeholder, kind_for_key, lowered,
    mark,
)

WINDOW_CHARS = 1 << 18  # 256 KiB: one rule's scan of a window takes well under a millisecond
SHORT_CHARS = 4096
TINY_CHARS = 64
_NEEDLES = tuple(enumerate(rule.needle for rule in RULES))
_ANY_NEEDLE = re.compile("|".join(re.escape(rule.needle) for rule in RULES))
# Past this many chars the pipeline redacts in a thread: what is shorter costs less than the hop.
INLINE_REDACT_CHARS = 65_536
# JSON escapes read through: a tool call's arguments (1), a JSON document in one of their
# strings (2), a string literal in that (3).
UNESCAPE_LEVELS = 3
_SPELLED_RANK = len(RULES)  # a span found in what escapes spell yields, on a tie, to one found as written
# Text read before and after a window to find the escapes a span's end may fall inside: a char
# three levels deep is at most 6 ** 3 chars as written, and a surrogate pair twice that.
_ESCAPE_CONTEXT = 512


def redact(text: str) -> str:
    """The text with every secret found replaced by `[REDACTED:<kind>]`."""
    if len(text) <= TINY_CHARS and "\\" not in text and _ANY_NEEDLE.search(
            (text if text.isascii() else visible_ascii_mapped(text)[0]).lower()) is None:
        return text  # most log fields: one regex call
    spans = secret_spans(text)
    if not spans:
        return text  # the common case: no copy
    pieces: list[str] = []
    pos = 0
    for start, end, kind in spans:
        pieces += (text[pos:start], mark(kind))
        pos = end
    pieces.append(text[pos:])
    return "".join(pieces)


def restored(redacted: str, source: str) -> str:
    """`redacted` with its marks given back the secrets of `source`, when `source` holds secrets
    of exactly those kinds in that order (a text redacted when stored, and the client's own
    words it was made from, resent); otherwise `redacted` as it is."""
    secrets = [(kind, source[start:end]) for start, end, kind in secret_spans(source)]
    if not secrets:
        return redacted
    marks = re.compile("|".join(re.escape(mark(kind)) for kind in {kind for kind, _ in secrets}))
    found = list(marks.finditer(redacted))
    if [m.group() for m in found] != [mark(kind) for kind, _ in secrets]:
        return redacted
    pieces: list[str] = []
    pos = 0
    for m, (_, secret) in zip(found, secrets):
        pieces += (redacted[pos:m.start()], secret)
        pos = m.end()
    pieces.append(redacted[pos:])
    return "".join(pieces)


def secret_spans(text: str, levels: int = UNESCAPE_LEVELS) -> list[tuple[int, int, str]]:
    """(start, end, kind) of every secret in the text, in order, none overlapping; also of those
    its JSON escapes spell, `levels` deep."""
    found = _found(text)
    if not text.isascii():
        found += _found_as_it_reads(text)
    if levels and "\\" in text:
        found += _found_as_spelled(text, levels)
    spans = [(start, _before_escaped_quote(text, start, end), kind) for start, end, kind in _joined(found)]
    if levels and "\\" in text:
        spans = _whole_escapes(text, spans, levels)
    return spans


def _whole_escapes(text: str, spans: list[tuple[int, int, str]], levels: int) -> list[tuple[int, int, str]]:
    """The spans narrowed to whole escapes at every level, those left with none dropped: a rule
    reading the text as written starts inside `\\t` or `\\u0027`, or stops inside the `\\\\\\"`
    that closes a string two levels down, and cutting there would leave a lone backslash
    (invalid JSON) or take one of the string's own. What the escapes spell is found whole by
    the reading of it. A window at a time, as the rules read."""
    points = np.array([edge for start, end, _ in spans for edge in (start, end)], dtype=np.int64)
    forward = np.arange(len(points)) % 2 == 0  # a start moves forward, an end back
    windows = points // WINDOW_CHARS
    for window in np.unique(windows):
        mine = windows == window
        base = max(0, int(window) * WINDOW_CHARS - _ESCAPE_CONTEXT)
        while base and text[base - 1] == "\\":  # a run of backslashes is read from its start
            base -= 1
        stop = (int(window) + 1) * WINDOW_CHARS + _ESCAPE_CONTEXT
        points[mine] = base + _narrowed(text[base:stop], points[mine] - base, forward[mine], levels)
    edges = points.tolist()
    return [(edges[2 * n], edges[2 * n + 1], kind) for n, (_, _, kind) in enumerate(spans)
            if edges[2 * n] < edges[2 * n + 1]]


def _narrowed(text: str, points: np.ndarray, forward: np.ndarray, levels: int) -> np.ndarray:
    """Each point of `text` moved to the nearest boundary of a char that the text's escapes
    spell, `levels` deep: forward where `forward` says so, else back."""
    if not levels or "\\" not in text:
        return points
    view, starts = unescaped_mapped(text)
    index = np.where(forward, np.searchsorted(starts, points), np.searchsorted(starts, points, side="right") - 1)
    return starts[_narrowed(view, index, forward, levels - 1)]


def _before_escaped_quote(text: str, start: int, end: int) -> int:
    """`end`, less the backslash that escapes the quote right after it: a secret inside a JSON
    string (a tool call's arguments) ends before `\\"`, and the text stays valid JSON."""
    if end < len(text) and text[end] in "\"'" and text[end - 1] == "\\":
        backslashes = end - start - len(text[start:end].rstrip("\\"))
        if backslashes % 2:
            return end - 1
    return end


def _found_as_it_reads(text: str) -> list[tuple[int, int, int, str]]:
    """What the rules find in the text as it reads, where that differs, as spans of the text.

    Read a window at a time (each with the reach of a match past it), so the per-character
    map back to the text stays a few MB however long the text.
    """
    found: list[tuple[int, int, int, str]] = []
    for start in range(0, len(text), WINDOW_CHARS):
        # With what the rules look back at before it, and as far past it as a match (a private
        # key block the longest) may reach: what a window shares with the next is found twice
        # and joined.
        base = max(0, start - LOOKBEHIND_CHARS)
        window = text[base:start + WINDOW_CHARS + max(REACH_CHARS, MAX_PEM_CHARS + LOOKBEHIND_CHARS)]
        if window.isascii():
            continue
        view, origins = visible_ascii_mapped(window)
        if view == window:
            continue
        for first, rank, last, kind in _found(view):
            found.append((base + int(origins[first]), rank, base + int(origins[last - 1]) + 1, kind))
    return found


def _found_as_spelled(text: str, levels: int) -> list[tuple[int, int, int, str]]:
    """What the rules find in the text as its JSON escapes spell it, as spans of the text: a
    window at a time, as `_found_as_it_reads` reads, up to the window that reaches the end
    (the rules find every match in it, also those past its first WINDOW_CHARS)."""
    found: list[tuple[int, int, int, str]] = []
    for start in range(0, len(text), WINDOW_CHARS):
        base = max(0, start - LOOKBEHIND_CHARS)
        stop = start + WINDOW_CHARS + max(REACH_CHARS, MAX_PEM_CHARS + LOOKBEHIND_CHARS)
        window = text[base:stop]
        if "\\" in window:
            view, starts = unescaped_mapped(window)
            if view != window:
                found += [(base + int(starts[first]), _SPELLED_RANK, base + int(starts[last]), kind)
                          for first, last, kind in secret_spans(view, levels - 1)]
        if stop >= len(text):
            break
    return found


def _found(text: str) -> list[tuple[int, int, int, str]]:
    """(start, rule's rank, end, kind) of every match of every rule, overlaps and all."""
    found: list[tuple[int, int, int, str]] = []  # (start, rule's rank, end, kind)
    resume = [0] * len(RULES)  # where each rule's scan goes on: after its last match
    for start in range(0, len(text), WINDOW_CHARS):
        end = min(start + WINDOW_CHARS, len(text))
        base = max(0, start - LOOKBEHIND_CHARS)
        low = lowered(text[base:end + REACH_CHARS])
        # A short text (a log field, most messages) is searched by the few rules whose needle
        # it holds; in a long one the regex engine finds a needle faster than `in` rules it out.
        if len(low) > SHORT_CHARS:
            ranks: Sequence[int] = range(len(RULES))
        else:
            ranks = [rank for rank, needle in _NEEDLES if needle in low]
        for rank in ranks:
            for secret, stop in RULES[rank].find(text, low, base, max(start, resume[rank]), end):
                resume[rank] = stop
                if secret is not None:
                    found.append((secret[0], rank, secret[1], secret[2]))
    return found


def _joined(found: list[tuple[int, int, int, str]]) -> list[tuple[int, int, str]]:
    """Overlapping spans as one, with the kind of the first (the earlier rule's on a tie)."""
    spans: list[tuple[int, int, str]] = []
    for start, _, end, kind in sorted(found):
        if spans and start < spans[-1][1]:
            first, last, named = spans[-1]
            spans[-1] = (first, max(last, end), named)
        else:
            spans.append((start, end, kind))
    return spans


def redact_mapping(obj: Any) -> Any:
    """A copy of a log record with every string redacted and credential-named fields blanked."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {key: _redact_field(key, value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_mapping(item) for item in obj)
    return obj


def _redact_field(key: Any, value: Any) -> Any:
    """A field named like a credential loses its whole string value, whatever it looks like."""
    if not (isinstance(key, str) and isinstance(value, str) and value) or is_placeholder(value):
        return redact_mapping(value)
    low = key.lower()
    if low in ("authorization", "proxy-authorization"):
        return mark("authorization")
    if low in ("cookie", "set-cookie"):
        return mark("cookie")
    if is_credential_name(key):
        return mark(kind_for_key(key))
    return redact(value)
