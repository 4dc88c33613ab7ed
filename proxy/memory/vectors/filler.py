"""Filling in vectors: with each write, in the background, and on `memproxy reindex`.

With the embedded model (in-process, tens of microseconds a text) a new message, fact or
entity has its vector by the time the next request, on any process, looks. The messages a
batch saves (a turn's question and answer) are embedded before it commits
(`before_commit`), and the store saves each vector in the batch's own transaction, of
exactly the text saved: no read of the items back, no second transaction. Whatever else
the batch wrote (a fact's entity, a reasoning trace, a memory stored, a message whose
embedding failed or timed out) is embedded and saved right behind the commit
(`after_commit`, a page at most per kind; more waits for the background), before the
writer tells anyone it is committed. That runs once the background task has caught up
with the store, so a large history being filled in never holds up a write. One exception:
a message the store keeps otherwise than it was embedded (PostgreSQL cannot hold a NUL and
saves U+FFFD) is saved without the vector `before_commit` gave it and counted as embedded
here; the background task's next pass (`idle_poll_s`) embeds the text as stored.

With a provider's model nothing waits for a vector: a message is saved and answered
first, and the background task later finds the items (messages, entities, reasoning
traces) that have no vector for the configured model, embeds them in batches and saves
them through the store. An item
edited meanwhile keeps no stale vector (the store checks its text on save). A failing
endpoint backs off; a batch the endpoint rejects outright (a 400 for its texts) is
skipped until the next full pass.

Each kind is read from a cursor (the last item seq done), so a pass over a large history
is paged and an idle poll reads only new items; every `rescan_s` the cursors go back to
the start, which picks up items whose vectors an edit dropped and any committed out of
seq order by another replica.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from proxy.memory.background_task import BackgroundTask
from proxy.memory.vectors.embedder import Embed, EmbeddingFailed, encodable
from proxy.metrics import Metrics
from proxy.stores.base import (
    EMBEDDING_KINDS,
    DropHookContext,
    EmbeddingKind,
    EmbeddingQueue,
    ExtractionFailed,
    FinishTurn,
    ItemVector,
    NewEmbedding,
    QueueHookContext,
    RecordFacts,
    RecordResponse,
    RecordToolCalls,
    SaveBlock,
    SaveHookStart,
    SetTurnStatus,
    StartTurn,
    StoreError,
    WriteOp,
)
from proxy.stores.vector_sql import EMBED_CHARS

log = logging.getLogger("memproxy.embeddings")


@dataclass(frozen=True)
class FillLimits:
    """How often the worker looks, how it backs off, and when it starts a full pass again."""

    idle_poll_s: float = 1.0
    retry_first_s: float = 1.0
    retry_max_s: float = 120.0
    rescan_s: float = 300.0


@dataclass
class FillCounts:
    """What a pass did, per kind: vectors saved, items skipped (rejected texts or edited meanwhile)."""

    saved: dict[str, int] = field(default_factory=lambda: dict.fromkeys(EMBEDDING_KINDS, 0))
    skipped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(EMBEDDING_KINDS, 0))
    rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(EMBEDDING_KINDS, 0))  # of skipped


class Filler:
    """Embeds one page of one kind's unembedded items and saves the vectors."""

    def __init__(self, store: EmbeddingQueue, embed: Embed, model: str, *, batch: int, timeout_s: float) -> None:
        self.store = store
        self.embed = embed
        self.model = model
        self.batch = batch
        self.timeout_s = timeout_s

    async def page(self, kind: EmbeddingKind, after: int, counts: FillCounts, *, user: str | None = None,
                   upto: int | None = None) -> tuple[int, bool]:
        """Embed the next page after `after` (up to seq `upto`): (the cursor to go on from, whether the
        kind is done).

        Raises EmbeddingFailed when the endpoint may answer later (the page is not skipped)."""
        items = await self.store.unembedded(self.model, kind, after=after, limit=self.batch, user=user, upto=upto)
        if not items:
            return after, True
        try:
            vectors = await self.embed([item.text for item in items], self.timeout_s)
        except EmbeddingFailed as exc:
            if exc.retry:
                raise
            log.warning("embeddings: skipped %d %s items the endpoint rejects (%s)", len(items), kind, exc)
            counts.skipped[kind] += len(items)
            counts.rejected[kind] += len(items)
            return items[-1].seq, len(items) < self.batch
        saved = await self.store.save_embeddings(self.model, [
            NewEmbedding(item.scope.user, item.kind, item.item_id, item.text, vector)
            for item, vector in zip(items, vectors)])
        counts.saved[kind] += saved
        counts.skipped[kind] += len(items) - saved
        return items[-1].seq, len(items) < self.batch

    async def fill_all(self, *, user: str | None = None, counts: FillCounts | None = None) -> FillCounts:
        """Every missing vector (of `user`, or everyone), kind by kind (`memproxy reindex`).

        `counts` is filled as it goes, so a caller still has them when the endpoint fails."""
        counts = counts if counts is not None else FillCounts()
        for kind in EMBEDDING_KINDS:
            after, done = 0, False
            while not done:
                after, done = await self.page(kind, after, counts, user=user)
        return counts


class EmbeddingWorker:
    """Owns the background task that keeps every item's vector filled in."""

    def __init__(self, filler: Filler, metrics: Metrics, limits: FillLimits = FillLimits(), *,
                 with_writes: bool = False) -> None:
        self.filler = filler
        self.metrics = metrics
        self.limits = limits
        self.with_writes = with_writes  # the writer waits for the vectors of each commit (in-process model)
        self._task = BackgroundTask("memproxy-embeddings", self._run)
        self._cursors: dict[EmbeddingKind, int] = dict.fromkeys(EMBEDDING_KINDS, 0)
        self._filling = asyncio.Lock()  # one page at a time: the writer's and the background's share cursors
        self._caught_up = False

    async def before_commit(self, ops: Sequence[WriteOp]) -> list[WriteOp]:
        """`ops`, the messages they save with their vectors (see the module doc); never raises."""
        if not self.with_writes:
            return list(ops)
        out = list(ops)
        texts = [(n, encodable(text)[:EMBED_CHARS]) for n, text in enumerate(map(_message_text, ops)) if text]
        texts = texts[:self.filler.batch]  # more waits for the filler, as after a commit
        if not texts:
            return out
        try:
            vectors = await self.filler.embed([text for _, text in texts], self.filler.timeout_s)
            for (n, text), vector in zip(texts, vectors, strict=True):
                op = out[n]
                if isinstance(op, (StartTurn, FinishTurn)):
                    out[n] = dataclasses.replace(op, vector=ItemVector(self.filler.model, text, vector))
        except Exception as exc:  # memory never fails a write: the filler embeds what is left
            self.metrics.embedding_calls.labels("background", "failed").inc()
            log.warning("embeddings: the messages of a commit were left to the filler (%s)", exc)
        else:
            self.metrics.embedding_calls.labels("background", "ok").inc()
        return out

    async def after_commit(self, ops: Sequence[WriteOp]) -> None:
        """The vectors of what the writer just committed and `before_commit` did not give (see the
        module doc); never raises."""
        if all(_embedded(op) for op in ops):
            self.metrics.embedded.inc(sum(getattr(op, "vector", None) is not None for op in ops))
            return
        if not self._caught_up:
            return
        try:
            await self.fill_once()
        except Exception as exc:  # memory never fails a write: the background task tries again
            log.warning("embeddings: the vectors of a commit were left to the background (%s)", exc)

    def start(self) -> None:
        """Begin filling (inside the running loop)."""
        self._task.start()

    async def stop(self) -> None:
        """Stop at once: a batch in flight is simply done again later."""
        await self._task.stop()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = self.limits.retry_first_s
        rescan_at = loop.time() + self.limits.rescan_s
        while True:
            try:
                busy = await self.fill_once()
                self._caught_up = not busy
                backoff = self.limits.retry_first_s
                pause = 0.0 if busy else self.limits.idle_poll_s
            except (EmbeddingFailed, StoreError) as exc:
                if isinstance(exc, EmbeddingFailed):
                    self.metrics.embedding_calls.labels("background", "failed").inc()
                log.warning("embeddings: background fill failed (%s); retrying in %.0fs", exc, backoff)
                pause, backoff = backoff, min(backoff * 2, self.limits.retry_max_s)
            except Exception:  # the task's outermost boundary: a bug must not end filling for good
                log.exception("embeddings: unexpected error; retrying in %.0fs", backoff)
                pause, backoff = backoff, min(backoff * 2, self.limits.retry_max_s)
            if loop.time() >= rescan_at:
                self._cursors = dict.fromkeys(EMBEDDING_KINDS, 0)
                rescan_at = loop.time() + self.limits.rescan_s
            await asyncio.sleep(pause)

    async def fill_once(self) -> bool:
        """One page of each kind not yet caught up; True when any kind may have more."""
        async with self._filling:
            return await self._page_each_kind()

    async def _page_each_kind(self) -> bool:
        counts = FillCounts()
        more = False
        # Read before the pages: a kind found with nothing to embed past its cursor moves the
        # cursor up to here, so the next look (after every commit, with the embedded model)
        # reads only what is newer instead of walking the whole table again.
        newest = await self.filler.store.newest_seqs()
        for kind in EMBEDDING_KINDS:
            # Newest items deleted: SQLite gives their seqs to the next ones, so look from there.
            self._cursors[kind] = min(self._cursors[kind], newest[kind])
            if self._cursors[kind] == newest[kind]:
                continue  # nothing past the cursor: no read (most commits add one or two kinds)
            rejected, saved = counts.rejected[kind], counts.saved[kind]
            # Up to the newest read above: after a commit, a few rows by their seq (an item
            # committed since is the next look's).
            after, done = await self.filler.page(kind, self._cursors[kind], counts, upto=newest[kind])
            # Counted page by page: a page saved is counted even when a later kind's fails
            # or the worker is stopped before the next one.
            self.metrics.embedded.inc(counts.saved[kind] - saved)
            if after != self._cursors[kind]:  # a call was made: answered, or its texts refused
                outcome = "skipped" if counts.rejected[kind] > rejected else "ok"
                self.metrics.embedding_calls.labels("background", outcome).inc()
            self._cursors[kind] = max(after, newest[kind]) if done else after
            more = more or not done
        return more


# Ops that save no item with a text to embed.
_NO_ITEMS = (SaveBlock, SaveHookStart, SetTurnStatus, RecordToolCalls, RecordResponse, QueueHookContext,
             DropHookContext, ExtractionFailed)


def _message_text(op: WriteOp) -> str:
    """The text of the message `op` saves that has no vector yet ('' for none)."""
    if isinstance(op, StartTurn) and op.persist and op.vector is None:
        return op.user_text or ""
    if isinstance(op, FinishTurn) and op.vector is None:
        return op.answer
    return ""


def _embedded(op: WriteOp) -> bool:
    """Whether every item `op` may have saved came with its vector (or has no text to embed)."""
    if isinstance(op, StartTurn):
        return not (op.persist and op.user_text) or op.vector is not None
    if isinstance(op, FinishTurn):
        return not op.steps and (not op.answer or op.vector is not None)
    if isinstance(op, RecordFacts):  # one that only takes its message off the queue
        return not (op.entities or op.relationships or op.user_node or op.user_alias)
    return isinstance(op, _NO_ITEMS)
