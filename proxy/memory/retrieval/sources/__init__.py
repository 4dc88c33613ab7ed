"""The five retrieval sources (docs/retrieval.md) and the lexical search they share.

Each source is a small async function from a `SourceQuery` to ranked `Hit`s, best first.
A lexical source asks the store's full-text index for a bounded number of candidates
(never the user's whole history), keeps only relevant ones (BM25 above the relevance
floor), looks up the query's unseen identifiers on their own so a memory holding one is
found however BM25 ranks it, and — for `conversation` and `long-term` — retries with the
query's keywords when the full query finds nothing.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Generic, TypeVar

from proxy.memory.retrieval.fusion import HARD_CAP
from proxy.memory.retrieval.keywords import rank_by_shared_words, retry_terms, variants
from proxy.redaction.redact import redact
from proxy.memory.retrieval.sources.no_memory import asked_again
from proxy.memory.retrieval.trigger import TRIGGER_REASON, promote
from proxy.models import Hit, Scope
from proxy.terms import query_terms

if TYPE_CHECKING:
    from proxy.memory.vectors.query import VectorQuery

T = TypeVar("T")

# Rows asked of the index per search, per hit the source may build: bounded whatever the
# history holds, and enough that the relevance floor and the dedupe rarely leave it short.
CANDIDATES_PER_HIT = 2
IDENTIFIER_CANDIDATES = 8  # rows asked per unseen-identifier search
SPARE_HITS = 2  # hits a source builds beyond the merge's limit, for texts another source also found
# Hits a source builds beyond those, from the same candidates: a message hit said just before
# or after a better one joins that one's line (exchange.join_adjacent) and gives its slot back.
JOINED_SPARE = 6
RANK_REASON = "rank"
RETRY_REASON = "keyword retry"
FILLER = "filler"  # a Hit.parts flag: a weak hit, merged only into slots the others leave
# A text counts as shown by the words of its first and last this many chars, so comparing a
# long paste with what the request shows costs what 4,000 chars cost.
SHOWN_EDGE_CHARS = 2000
_PART = re.compile(r"[A-Za-z0-9]+")
_REDACTED = "[REDACTED:"
_MARK = re.compile(r"\[REDACTED:[a-z_]+\]")

Search = Callable[[Sequence[str], int], Awaitable[list[tuple[T, float]]]]


def bm25(score: float) -> float:
    """A score as the injection log shows it: six significant digits."""
    return float(f"{score:.6g}")


def normalised(text: str) -> str:
    """Text compared on words only: whitespace runs folded to one space, ends trimmed."""
    return " ".join(text.split())


def same_words(text: str) -> str:
    """What two texts saying the same words share: their words, case folded."""
    return normalised(text).casefold()


def edges(text: str, keep: int) -> str:
    """The text's first and last `keep` chars; a text of up to twice that, whole."""
    if len(text) <= 2 * keep:
        return text
    return f"{text[:keep]}\n…\n{text[-keep:]}"


def shown_key(text: str) -> str:
    """What a text is recognised by in the request: the words at its two ends."""
    if len(text) > 2 * SHOWN_EDGE_CHARS:
        text = f"{text[:SHOWN_EDGE_CHARS]} {text[-SHOWN_EDGE_CHARS:]}"
    return normalised(text)


def _unmarked_key(text: str) -> str:
    # Redaction changes a text's length, so its ends are compared without secrets or marks:
    # a stored (redacted) text is cut wider than its key, then its marks are taken out.
    return shown_key(_MARK.sub("", edges(text, 2 * SHOWN_EDGE_CHARS)))


def identifier_terms(identifiers: Sequence[str]) -> tuple[str, ...]:
    """Each identifier's whole-identifier index term (`internal_hbr_2291_example`), not its parts."""
    found: dict[str, None] = {}
    for value in identifiers:
        parts = set(query_terms(" ".join(_PART.findall(value))))
        whole = [term for term in query_terms(value) if term not in parts]
        for term in whole or query_terms(value)[:1]:
            found.setdefault(term, None)
    return tuple(found)


@dataclass(frozen=True)
class SourceQuery:
    """What every source is asked: the (cut) query, its terms, and what the request shows."""

    scope: Scope
    text: str
    terms: tuple[str, ...]
    conversation_id: str
    visible: tuple[str, ...] = ()
    identifiers: tuple[str, ...] = ()  # identifiers of the query the transcript does not show
    relevance_floor: float = 0.0
    first_person: bool = False
    id_terms: tuple[str, ...] = ()  # the whole-identifier terms of `identifiers`
    any_term_match: bool = False  # the store's text search matches a row holding any one term
    max_memories: int = HARD_CAP
    new_conversation: bool = False  # nothing of `conversation_id` is stored yet
    vectors: VectorQuery | None = field(default=None, compare=False)  # embeddings on: retrieval/hybrid.py
    said: str = ""  # the whole user message when `text` is its cut (a long paste): never its own memory

    @property
    def hits_wanted(self) -> int:
        """Hits a source builds: all the merge could take from it, and a few for repeated texts."""
        return min(self.max_memories, HARD_CAP) + SPARE_HITS

    @property
    def hits_built(self) -> int:
        """Hits a source builds: those wanted, and spares for hits that join a better one's line."""
        return self.hits_wanted + JOINED_SPARE

    @property
    def candidates(self) -> int:
        """Rows a search asks the index for."""
        return CANDIDATES_PER_HIT * self.hits_wanted

    @cached_property
    def _shown(self) -> frozenset[str]:
        return frozenset(shown_key(text) for text in (*self.visible, self.text, self.said))

    @cached_property
    def _shown_redacted(self) -> frozenset[str]:
        # Stored text was redacted before it was saved; the request shows it unredacted. The
        # texts here are recall's cut of each message (`edges`, above), so this is bounded.
        return frozenset(_unmarked_key(redact(text)) for text in (*self.visible, self.text, self.said))

    def shows(self, text: str) -> bool:
        """True when the request already shows this stored text (or it is the query itself)."""
        return shown_key(text) in self._shown or (_REDACTED in text and _unmarked_key(text) in self._shown_redacted)

    def asks_again(self, text: str) -> bool:
        """True when this stored text is a bare question whose every word the query holds: the
        question asked now, asked before (no_memory.py)."""
        return asked_again(text, self._asked)

    def says(self, text: str) -> bool:
        """True when the request already says what this stored text says: it shows it, or asks it again."""
        return self.shows(text) or self.asks_again(text)

    @cached_property
    def _asked(self) -> frozenset[str]:
        return frozenset(self.terms)

    def words(self, text: str) -> str:
        """`same_words(text)`, worked out once a recall: a candidate's text is compared in its
        source's search and again in the fusion with the vector stream."""
        found = self._words.get(text)
        if found is None:
            found = self._words[text] = same_words(text)
        return found

    @cached_property
    def _words(self) -> dict[str, str]:
        return {}

    def relevant(self, score: float) -> bool:
        """A lexical score that counts: some query term matched, and it clears the floor."""
        return score > 0 and score >= self.relevance_floor


# Not frozen: a recall makes a few hundred of these, and a frozen dataclass's __init__ costs
# two and a half times a plain one's. Nothing changes one once made: each step makes new ones.
@dataclass(slots=True)
class Found(Generic[T]):
    """A candidate a search kept, with its score, why it ranked, and the parts of its score."""

    item: T
    score: float
    reason: str = RANK_REASON
    parts: dict[str, object] = field(default_factory=dict)


async def lexical(
    q: SourceQuery,
    search: Search[T],
    *,
    key: Callable[[T], str],
    text: Callable[[T], str],
    keep: Callable[[T], bool] = lambda item: True,
    order: Callable[[T, float], tuple[object, ...]] | None = None,
    retry: bool = False,
    limit: int | None = None,
) -> list[Found[T]]:
    """Relevant candidates, best first: identifier matches, then the full query (or its retry)."""
    limit = limit or q.candidates
    if q.id_terms:
        by_terms, by_identifier = await asyncio.gather(
            _search(search, q.terms, limit), _search(search, q.id_terms, IDENTIFIER_CANDIDATES)
        )
    else:  # the common case, without a task per search
        by_terms, by_identifier = await _search(search, q.terms, limit), []
    tie_break = order or (lambda item, score: (key(item),))
    ranked = [Found(item, score, parts={"bm25": bm25(score)}) for item, score in _kept(q, by_terms, keep, tie_break)]
    # Where the index matches any one term (SQLite: the terms OR'ed), a search with some of
    # the query's words finds nothing the full query did not, unless that was cut at `limit`.
    if not ranked and retry and (not q.any_term_match or len(by_terms) >= limit):
        ranked = await _retry(q, search, key, text, keep, limit)
    front = [
        Found(item, score, TRIGGER_REASON, {"bm25": bm25(score), "identifier_search": True})
        for item, score in _kept(q, by_identifier, keep, tie_break)
    ]
    return _distinct([*front, *ranked], key, lambda item: q.words(text(item)))


def _distinct(found: list[Found[T]], key: Callable[[T], str], words_of: Callable[[T], str]) -> list[Found[T]]:
    """Each item once, and each text once: the same words said twice are one memory."""
    ids: set[str] = set()
    texts: set[str] = set()
    kept = []
    for f in found:
        item_id, words = key(f.item), words_of(f.item)
        if item_id not in ids and words not in texts:
            ids.add(item_id)
            texts.add(words)
            kept.append(f)
    return kept


async def _search(search: Search[T], terms: Sequence[str], limit: int) -> list[tuple[T, float]]:
    return await search(terms, limit) if terms else []


def _kept(
    q: SourceQuery, rows: list[tuple[T, float]], keep: Callable[[T], bool],
    order: Callable[[T, float], tuple[object, ...]],
) -> list[tuple[T, float]]:
    floor = q.relevance_floor  # q.relevant, inlined: it is asked of every candidate
    kept = [(item, score) for item, score in rows if score > 0 and score >= floor and keep(item)]
    # Scores rounded so float noise cannot reorder equals; the tie-break makes it deterministic.
    return sorted(kept, key=lambda row: (-round(row[1], 9), *order(*row)))


async def _retry(
    q: SourceQuery, search: Search[T], key: Callable[[T], str], text: Callable[[T], str],
    keep: Callable[[T], bool], limit: int,
) -> list[Found[T]]:
    """The keyword retry: each long word as typed and Title Case, ranked by shared words."""
    searches: dict[tuple[str, ...], None] = {}
    for word in retry_terms(q.text):
        for variant in variants(word):
            if terms := tuple(query_terms(variant)):
                searches.setdefault(terms, None)  # the index folds case: variants often coincide
    results = await asyncio.gather(*(search(terms, limit) for terms in searches))
    found: dict[str, tuple[T, float]] = {}
    for rows in results:
        for item, score in rows:
            if q.relevant(score) and keep(item) and key(item) not in found:
                found[key(item)] = (item, score)
    ranked = rank_by_shared_words(((k, text(item)) for k, (item, _) in found.items()), q.text)
    return [
        Found(found[k][0], found[k][1], RETRY_REASON, {"bm25": bm25(found[k][1]), "retry_rank": n})
        for n, k in enumerate(ranked, start=1)
    ]


def split_fillers(hits: Sequence[Hit]) -> tuple[list[Hit], list[Hit]]:
    """(hits that take full turns in the merge, weak hits that only fill what is left)."""
    return [h for h in hits if not h.parts.get(FILLER)], [h for h in hits if h.parts.get(FILLER)]


def to_hits(q: SourceQuery, found: Sequence[Found[T]], hit: Callable[[Found[T]], Hit]) -> list[Hit]:
    """The best candidates as Hits, as many as the merge can take, those holding an unseen identifier first.

    Only what the merge can use is built: a hit's line costs more than its row.
    """
    hits = [hit(Found(f.item, f.score, f.reason, {**f.parts, "rank": n}))
            for n, f in enumerate(found[:q.hits_built], start=1)]
    return promote(hits, q.identifiers) if q.identifiers else hits
