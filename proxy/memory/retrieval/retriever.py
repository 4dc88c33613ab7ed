"""Retrieval (docs/retrieval.md): five sources searched in parallel, merged by taking turns, within budget.

`Retrieval.retrieve(scope, query)` is the pipeline's Retriever. Each source is timed and
isolated: one that raises is logged and skipped while the others still answer; only when
every source fails does the error reach the pipeline, which then degrades the request
("store unavailable") and counts the failure toward its circuit breaker. The result is
deterministic: the same store state and query give the same block, byte for byte.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from proxy.memory.retrieval import exchange
from proxy.memory.retrieval.block import estimate_tokens, render
from proxy.memory.retrieval.fusion import HARD_CAP, apply_budget, round_robin
from proxy.memory.retrieval.keywords import question_terms
from proxy.memory.vectors.query import Vectors
from proxy.memory.retrieval.base import Query, Retrieved
from proxy.redaction.redact import redact
from proxy.memory.retrieval.sources import (
    JOINED_SPARE, SourceQuery, conversation, cross_session, graph, identifier_terms, long_term, reasoning,
    split_fillers,
)
from proxy.memory.retrieval.trigger import unseen_identifiers
from proxy.metrics import Metrics
from proxy.models import Hit, Scope
from proxy.settings import MemorySettings
from proxy.stores.base import RecallReads, StoreError
from proxy.terms import query_terms

log = logging.getLogger("memproxy.retrieval")

T = TypeVar("T")

# A query is searched by its start and its end: a 5 MB paste costs what 4,000 chars cost.
QUERY_HEAD_CHARS = 2000
QUERY_TAIL_CHARS = 2000
# Every term is one posting list the index walks; past this many the rest add little.
MAX_QUERY_TERMS = 64
ERROR_CHARS = 200
# Each source must answer within this share of memory.retrieval_timeout_ms; one that does
# not is skipped like one that failed, and the others' hits still make the block in the
# time that is left, instead of the whole recall running into the deadline.
SOURCE_SHARE = 0.8


def cut_query(text: str) -> str:
    """The query's first and last ~2,000 chars, cut at spaces; a short query unchanged."""
    if len(text) <= QUERY_HEAD_CHARS + QUERY_TAIL_CHARS:
        return text
    head = text[:QUERY_HEAD_CHARS]
    tail = text[-QUERY_TAIL_CHARS:]
    head = head[: head.rfind(" ")] if " " in head else head
    tail = tail[tail.find(" ") + 1:] if " " in tail else tail
    return f"{head} {tail}"


def source_query(scope: Scope, query: Query, settings: MemorySettings, *, any_term_match: bool = False) -> SourceQuery:
    """What every source is asked for this query."""
    text = cut_query(query.text)
    unseen = unseen_identifiers(text, query.visible)
    return SourceQuery(
        scope=scope,
        text=text,
        terms=tuple(question_terms(text)[:MAX_QUERY_TERMS]),
        conversation_id=query.conversation_id,
        visible=query.visible,
        identifiers=tuple(unseen),
        relevance_floor=settings.relevance_floor,
        first_person=long_term.first_person(text),
        id_terms=identifier_terms(unseen),
        any_term_match=any_term_match,
        max_memories=query.max_memories,
        new_conversation=query.new_conversation,
        said=query.text if text != query.text else "",
    )


@dataclass
class SourceRuns:
    """Per-source results, times and errors of one retrieval, and the one deadline they share.

    The deadline is one timer (`expire`, set by `Retrieval.retrieve`), not a timeout scope per
    source and one more for the exchanges: each scope costs a timer and the task lookups around
    it, and they all enforced the same instant. Work still running when it fires is cancelled
    and raises TimeoutError, as under asyncio.timeout; the sources that answered stand."""

    metrics: Metrics
    deadline: float  # event-loop time by which every source must have answered
    hits: dict[str, list[Hit]] = field(default_factory=dict)
    ms: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    failures: list[Exception] = field(default_factory=list)
    expired: bool = False  # the deadline passed
    _running: set[asyncio.Task[Any]] = field(default_factory=set)  # tasks inside `within`, cancelled at the deadline
    _expiring: set[asyncio.Task[Any]] = field(default_factory=set)  # those the deadline cancelled

    async def run(self, source: str, work: Callable[[], Awaitable[T]]) -> T | None:
        """The source's result, timed; None (logged, recorded) when it raised or ran past the deadline."""
        started = time.perf_counter()
        try:
            return await self.within(work)
        except Exception as exc:  # a failing or hanging source is skipped; the others still answer
            self._failed(source, exc)
            return None
        finally:
            seconds = time.perf_counter() - started
            self.ms[source] = round(seconds * 1000, 3)
            self.metrics.retrieval_seconds.labels(source).observe(seconds)

    async def within(self, work: Callable[[], Awaitable[T]]) -> T:
        """`work()` before the deadline; TimeoutError when it passes first. Begun past it, `work` still
        counts if it answers without waiting, as under asyncio.timeout."""
        task = asyncio.current_task()
        assert task is not None  # retrieval runs in a task
        self._running.add(task)
        if self.expired:  # cancelled on the loop's next pass, if still running then
            asyncio.get_running_loop().call_soon(self.expire)
        try:
            return await work()
        except asyncio.CancelledError:
            # The deadline's cancellation is a timeout; any other (the client gone, the recall's own
            # deadline) goes on up, as asyncio.timeout would let it.
            if task in self._expiring:
                self._expiring.discard(task)
                if task.uncancel() == 0:
                    raise TimeoutError() from None
            raise
        finally:
            self._running.discard(task)

    def expire(self) -> None:
        """The deadline: the work still running is cancelled, and work begun after it once it waits."""
        self.expired = True
        for task in self._running - self._expiring:
            self._expiring.add(task)
            task.cancel()

    def _failed(self, source: str, exc: Exception) -> None:
        self.failures.append(exc)
        reason = str(exc) or ("no answer before the deadline" if isinstance(exc, TimeoutError) else "")
        self.errors[source] = f"{type(exc).__name__}: {redact(reason)[:ERROR_CHARS]}"
        log.warning("retrieval: source %s failed (%s)", source, self.errors[source])

    def raise_if_all_failed(self) -> None:
        """Re-raise when no source answered: the store is down, not merely empty."""
        if self.failures and len(self.failures) == len(self.ms):
            raise next((e for e in self.failures if isinstance(e, StoreError)), self.failures[0])


class Retrieval:
    """The retriever over one Store."""

    def __init__(self, store: RecallReads, settings: MemorySettings, metrics: Metrics, vectors: Vectors | None = None
                 ) -> None:
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.vectors = vectors  # None: lexical retrieval only (no embeddings configured)
        # A store whose text search ORs the terms says so: a keyword retry that cannot find
        # anything new is then skipped.
        self.any_term_match = store.matches_any_term

    async def retrieve(self, scope: Scope, query: Query) -> Retrieved:
        """The memory block for this query and the injection log entry that explains it."""
        started = time.perf_counter()
        q = source_query(scope, query, self.settings, any_term_match=self.any_term_match)
        if self.vectors is not None:
            q = dataclasses.replace(q, vectors=await self.vectors.query(scope, q.text))
        runs = SourceRuns(self.metrics, self._sources_deadline(query))
        deadline = asyncio.get_running_loop().call_at(runs.deadline, runs.expire)
        try:
            return await self._searched(q, query, runs, started)
        finally:
            deadline.cancel()

    async def _searched(self, q: SourceQuery, query: Query, runs: SourceRuns, started: float) -> Retrieved:
        """The sources searched and their hits made a block, within `runs`' deadline."""
        await asyncio.gather(
            self._entities_and_graph(q, runs),
            self._source(runs, conversation.SOURCE, lambda: conversation.search(self.store, q)),
            self._source(runs, cross_session.SOURCE,
                         lambda: cross_session.search(self.store, q, self.settings.cross_session_limit)),
            self._source(runs, reasoning.SOURCE, lambda: reasoning.search(self.store, q)),
        )
        runs.raise_if_all_failed()
        runs.hits[conversation.SOURCE], runs.hits[cross_session.SOURCE] = conversation.one_copy_each(
            runs.hits.get(conversation.SOURCE, []), runs.hits.get(cross_session.SOURCE, []))
        header = self.settings.block_header
        full, fillers = {}, {}
        for source, hits in runs.hits.items():
            full[source], fillers[source] = split_fillers(hits)
        limit = min(query.max_memories, HARD_CAP)
        # Spares in the merge: a hit said next to a better one joins its line and gives its slot back.
        merged = round_robin(full, limit + JOINED_SPARE, fillers=fillers, cap=HARD_CAP + JOINED_SPARE)
        neighbours = await self._neighbours(q, exchange.message_hits(merged[:limit]), runs, {})
        joined = exchange.join_adjacent(merged, neighbours, limit, self.settings.max_tokens)
        if unread := exchange.unread(joined, neighbours):  # a join gave a slot to a spare: read its turns too
            neighbours = await self._neighbours(q, unread, runs, neighbours)
            joined = exchange.join_adjacent(merged, neighbours, limit, self.settings.max_tokens)
        kept, cut = apply_budget(joined, self.settings.max_tokens, header, q.terms)
        kept = exchange.carry(kept, neighbours, self.settings.max_tokens, header, q.says)
        block = render(kept, header)
        entry = injection_log(kept if block else [], runs, budget_cut=cut)
        entry["retrieval_ms"] = round((time.perf_counter() - started) * 1000, 3)
        return Retrieved(block, len(kept) if block else 0, entry, tuple(kept) if block else ())

    def _sources_deadline(self, query: Query) -> float:
        """When the sources must have answered: SOURCE_SHARE of the budget from now, and never so late
        that the block could not be built by the recall's own deadline (`query.answer_by`), which
        counts the turn lookup and the wait for the recall's turn before retrieval began."""
        budget_s = self.settings.retrieval_timeout_ms / 1000
        deadline = asyncio.get_running_loop().time() + budget_s * SOURCE_SHARE
        if query.answer_by is not None:
            deadline = min(deadline, query.answer_by - budget_s * (1 - SOURCE_SHARE))
        return deadline

    def forget(self, user: str) -> None:
        """Drop what is cached of a deleted user (the vectors held in memory)."""
        if self.vectors is not None:
            self.vectors.index.forget(user)

    async def _source(self, runs: SourceRuns, source: str, work: Callable[[], Awaitable[list[Hit]]]) -> None:
        # The search starts inside this task, so a cancellation before it runs leaves no
        # coroutine behind that was never awaited.
        runs.hits[source] = await runs.run(source, work) or []

    async def _neighbours(self, q: SourceQuery, ids: list[str], runs: SourceRuns, known: exchange.Neighbours
                          ) -> exchange.Neighbours:
        """`known` and the turns around each of these messages (exchange.py); only `known` when the
        store fails or the deadline passes: the hits alone still make a whole block."""
        if not ids:
            return known
        try:
            read = await runs.within(lambda: self.store.neighbours(q.scope, ids))
            return {**known, **{i: read.get(i, (None, None)) for i in ids}}  # a lone message: read, none
        except Exception as exc:  # the hits alone still make a block
            log.warning("retrieval: exchanges not read (%s: %s)", type(exc).__name__, redact(str(exc))[:ERROR_CHARS])
            return known

    async def _entities_and_graph(self, q: SourceQuery, runs: SourceRuns) -> None:
        """`long-term`, then `graph` from its entity hits (the user's node first)."""
        matches = await runs.run(long_term.SOURCE, lambda: long_term.find(self.store, q))
        if matches is None:
            return  # no entity hits to expand: graph has nothing to do
        runs.hits[long_term.SOURCE] = long_term.hits(q, matches)
        limit = self.settings.graph_expansion_limit
        if limit > 0 and matches.to_expand(limit):
            runs.hits[graph.SOURCE] = await runs.run(graph.SOURCE,
                                                     lambda: graph.expand(self.store, q, matches, limit)) or []


def injection_log(hits: list[Hit], runs: SourceRuns, *, budget_cut: bool) -> dict[str, Any]:
    """The injection log entry: each hit's source, id, reason, score parts and token cost.

    A message hit that carries the turns around it names them under `exchange`.
    """
    return {
        "hits": [log_hit(n, hit) for n, hit in enumerate(hits, start=1)],
        "budget_cut": budget_cut,
        "candidates": {source: len(found) for source, found in sorted(runs.hits.items())},
        "sources_ms": dict(sorted(runs.ms.items())),
        "errors": dict(sorted(runs.errors.items())),
        "cache": False,
    }


def log_hit(n: int, hit: Hit) -> dict[str, Any]:
    """One hit of the injection log, the `n`th line of the block."""
    score = {part: value for part, value in hit.parts.items() if part != exchange.EXCHANGE}
    entry = {"source": hit.source, "id": hit.id, "reason": hit.reason, "score": score,
             "tokens": estimate_tokens(f"{n}. [{hit.source}] {hit.content}")}
    if hit.parts.get(exchange.EXCHANGE):
        entry["exchange"] = hit.parts[exchange.EXCHANGE]
    return entry
