"""Combining ranked candidates: the merge across sources, the budget.

Sources take turns in the merge (a source's lexical and vector streams are fused in
memory/retrieval/hybrid.py); the rendered block, header and graph note included, fits `memory.max_tokens`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import lru_cache

from proxy.memory.retrieval.block import (
    DATE_END,
    DEFAULT_HEADER,
    ELLIPSIS,
    GRAPH_NOTE,
    NAME_END,
    SOURCES,
    neutralise,
)
from proxy.models import Hit
from proxy.terms import CACHED_TOKEN_CHARS, terms

HARD_CAP = 12  # max_memories is capped at 12 whatever is configured: a block stays short
PER_HIT_SHARE = 3  # no single memory may take more than a third of the budget
MIN_SNIPPET_CHARS = 40  # a shorter piece of a memory says nothing useful
_MAX_MATCHES = 200  # matches considered when choosing a snippet window
# Where a snippet starts is looked for in a memory's first this many chars: every word is
# tokenised to compare it with the query, on the event loop.
_SCAN_CHARS = 20_000
# The start of a line that says what the memory is, kept whole when the rest is cut: a
# message's `role (date): `, an entity's `name — `.
_HEADS = {"conversation": DATE_END, "cross-session": DATE_END, "long-term": NAME_END}
_HEAD_MAX_CHARS = 80

_WORD = re.compile(r"\S+")


def round_robin(
    sources: Mapping[str, Sequence[Hit]], limit: int, order: Sequence[str] = SOURCES,
    fillers: Mapping[str, Sequence[Hit]] | None = None, cap: int = HARD_CAP,
) -> list[Hit]:
    """One hit from each source in turn, each keeping its order, the same text never twice; at most `cap`.

    `fillers` are weak hits (relevant, but less than a source's floor for a full turn):
    they take turns only for the slots the other hits leave.
    """
    limit = max(0, min(limit, cap))
    seen: set[str] = set()
    merged: list[Hit] = []
    for tier in (sources, fillers or {}):
        names = [*order, *sorted(set(tier) - set(order))]
        _take_turns([iter(tier[name]) for name in names if tier.get(name)], merged, seen, limit)
    return merged


def _take_turns(queues: list[Iterator[Hit]], merged: list[Hit], seen: set[str], limit: int) -> None:
    while queues and len(merged) < limit:
        for queue in list(queues):
            hit = _next_unseen(queue, seen)
            if hit is None:
                queues.remove(queue)
            elif len(merged) < limit:
                merged.append(hit)


def _next_unseen(queue: Iterator[Hit], seen: set[str]) -> Hit | None:
    for hit in queue:
        key = " ".join(neutralise(hit.content).casefold().split())
        if key and key not in seen:
            seen.add(key)
            return hit
    return None


def apply_budget(
    hits: Sequence[Hit], max_tokens: int, header: str = DEFAULT_HEADER, query_terms: Iterable[str] = ()
) -> tuple[list[Hit], bool]:
    """The hits whose block fits `max_tokens`, long ones as snippets, and whether anything was cut."""
    wanted = _wanted(query_terms)
    limit = max_tokens * 4  # ceil(chars / 4) <= max_tokens  <=>  chars <= 4 * max_tokens
    per_hit = max(MIN_SNIPPET_CHARS, limit // PER_HIT_SHARE)
    kept: list[Hit] = []
    used, has_graph, cut = len(header), False, False
    for hit in hits:
        text = neutralise(hit.content)
        if not text:
            continue  # render would skip it; keeping it would miscount what was injected
        # The chars `render` adds around this content: its line prefix, and the graph note
        # when this is the first graph hit. Counted, not rendered, to stay O(hits).
        prefix = len(f"\n{len(kept) + 1}. [{hit.source}] ")
        note = len(GRAPH_NOTE) + 1 if has_graph or hit.source == "graph" else 0
        content = _fit(text, min(per_hit, limit - used - prefix - note), wanted, _head(hit.source, text))
        cut = cut or content != text
        if content:
            kept.append(hit if content == hit.content else replace(hit, content=content))
            used += prefix + len(content)
            has_graph = has_graph or hit.source == "graph"
    return kept, cut


def _fit(text: str, room: int, wanted: frozenset[str], head: str = "") -> str:
    """The text, or its head and a snippet of the rest, in `room` chars; '' when not even a snippet fits."""
    if len(text) <= room:
        return text
    if head and room - len(head) >= MIN_SNIPPET_CHARS:
        return head + _snippet(text[len(head):], wanted, room - len(head))
    return _snippet(text, wanted, room) if room >= MIN_SNIPPET_CHARS else ""


def _head(source: str, text: str) -> str:
    """The part of a memory's line that says what it is (`role (YYYY-MM-DD): `), or ''."""
    mark = _HEADS.get(source)
    end = text.find(mark, 0, _HEAD_MAX_CHARS) if mark else -1
    return text[:end + len(mark)] if mark and end > 0 else ""


def snippet(text: str, query_terms: Iterable[str], max_chars: int) -> str:
    """At most `max_chars` of the text around its best match with the query, `…` where cut."""
    return _snippet(text, _wanted(query_terms), max_chars)


def _wanted(query_terms: Iterable[str]) -> frozenset[str]:
    # Run through `terms` so raw words and already-stemmed query terms both match.
    if isinstance(query_terms, str):
        query_terms = [query_terms]
    return frozenset(term for word in query_terms for term in terms(word))


def _snippet(text: str, wanted: frozenset[str], max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    width = max(1, max_chars - 2 * len(ELLIPSIS))
    start = max(0, min(_best_start(text, wanted, width), len(text) - width))
    end = start + width
    if start > 0 and not text[start - 1].isspace():  # don't begin mid-word
        space = text.find(" ", start, end)
        start = space + 1 if space != -1 else start
    if end < len(text) and not text[end].isspace():  # don't end mid-word
        space = text.rfind(" ", start, end)
        end = space if space > start else end
    piece = text[start:end].strip()
    return (ELLIPSIS if start > 0 else "") + piece + (ELLIPSIS if end < len(text) else "")


def _word_terms(word: str) -> frozenset[str]:
    if len(word) > CACHED_TOKEN_CHARS:  # a pasted blob, not cached: it would stay in memory
        return frozenset(terms(word))
    return _cached_word_terms(word)


@lru_cache(maxsize=65536)
def _cached_word_terms(word: str) -> frozenset[str]:
    return frozenset(terms(word))


def _best_start(text: str, wanted: frozenset[str], width: int) -> int:
    """Where a window of `width` chars shows the most distinct query terms; 0 with no match."""
    matches = list(itertools.islice(
        ((word.start(), word.end(), found)
         for word in _WORD.finditer(text, 0, _SCAN_CHARS)
         if (found := wanted.intersection(_word_terms(word.group())))),
        _MAX_MATCHES))
    best, best_count = 0, 0
    for anchor, _, _ in matches:
        start = max(0, anchor - width // 3)  # some lead-in before the match reads better
        inside: set[str] = set()
        for s, e, found in matches:
            if s >= start and e <= start + width:
                inside |= found
        if len(inside) > best_count:
            best, best_count = start, len(inside)
    return best
