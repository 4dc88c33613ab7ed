"""One request's query vector: embedded once, shared by every source, with its deadline.

`Vectors.query` starts embedding the request's query and reading the store's marks of the
user's newest vectors beside it; each source then asks the `VectorQuery` for its nearest
items (proxy.memory.retrieval.sources.hybrid fuses them with the lexical ones). A failing
embeddings endpoint is left alone for a while, doubling, so it does not add its timeout to
every request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from proxy.memory.vectors.embedder import Embedder, EmbeddingFailed
from proxy.memory.vectors.index import RowFilter, Spread, VectorIndex, row_filter, unit
from proxy.metrics import Metrics
from proxy.models import Scope
from proxy.settings import EmbeddingsSettings
from proxy.stores.base import EmbeddingKind, StoreError, VectorMark

log = logging.getLogger("memproxy.vectors")

T = TypeVar("T")

QUIET_FIRST_S = 1.0  # after a failed query embedding, the endpoint is left alone this long, doubling
QUIET_MAX_S = 60.0


@dataclass
class _Quiet:
    """When the query endpoint failed last, and how long to leave it alone."""

    until: float = 0.0
    pause: float = QUIET_FIRST_S


@dataclass
class Vectors:
    """Vector search for one app: the embeddings call, the cached matrices, the fusion settings."""

    embed: Embedder
    index: VectorIndex
    settings: EmbeddingsSettings
    metrics: Metrics
    _quiet: _Quiet = field(default_factory=_Quiet)

    async def query(self, scope: Scope, text: str) -> VectorQuery | None:
        """Start embedding this request's query; None while the endpoint is being left alone.

        What is answered without waiting (an in-process model's vector, a store's marks read on the
        event loop) is had here, before the sources start; the rest runs in a task beside them."""
        loop = asyncio.get_running_loop()
        if loop.time() < self._quiet.until or not text.strip() or self.settings.vector_weight <= 0:
            if text.strip():
                self.metrics.embedding_calls.labels("query", "skipped").inc()
            return None
        timeout_s = self.settings.query_timeout_ms / 1000
        deadline = loop.time() + timeout_s
        embedding = self._embed(text, timeout_s)
        task = (await _had(loop, embedding) if self.embed.in_process
                else loop.create_task(embedding, name="memproxy-query-embedding"))
        marks = self.index.marks(scope)
        read = (await _had(loop, marks) if self.index.store.lookups_on_loop
                else loop.create_task(marks, name="memproxy-vector-marks"))
        return VectorQuery(self, scope, task, read, deadline)

    async def _embed(self, text: str, timeout_s: float) -> np.ndarray | None:
        try:
            (vector,) = await self.embed([text], timeout_s)
        except EmbeddingFailed as exc:
            self.metrics.embedding_calls.labels("query", "failed").inc()
            loop = asyncio.get_running_loop()
            log.warning("embeddings: the query could not be embedded (%s); lexical retrieval only for %.0fs",
                        exc, self._quiet.pause)
            self._quiet.until = loop.time() + self._quiet.pause
            self._quiet.pause = min(self._quiet.pause * 2, QUIET_MAX_S)
            return None
        self.metrics.embedding_calls.labels("query", "ok").inc()
        self._quiet.pause = QUIET_FIRST_S
        return unit(vector)


async def _had(loop: asyncio.AbstractEventLoop, work: Awaitable[T]) -> asyncio.Future[T]:
    """`work` awaited now, its outcome held as a finished future, as a task's would be."""
    done: asyncio.Future[T] = loop.create_future()
    try:
        done.set_result(await work)
    except Exception as exc:  # read where the task's would be: VectorQuery.nearest
        done.set_exception(exc)
    return done


@dataclass
class VectorQuery:
    """One request's query vector (computed once, shared by the sources) and its deadline."""

    vectors: Vectors
    scope: Scope
    task: asyncio.Future[np.ndarray | None]
    marks: asyncio.Future[dict[EmbeddingKind, VectorMark]]  # the store's newest vectors when the request began
    deadline: float  # loop time past which the vector stream gives up

    async def nearest(self, kind: EmbeddingKind, limit: int, **conversations: Any
                      ) -> tuple[list[tuple[str, float]], Spread]:
        """(item id, cosine) of the user's nearest items of `kind`, best first, and the spread of the
        query's cosines; nothing when that cannot be had. Nothing is read from the store but the marks."""
        where: RowFilter = row_filter(self.scope, kind, **conversations)
        try:
            async with asyncio.timeout_at(self.deadline):
                query = await asyncio.shield(self.task)
                if query is None:
                    return [], Spread()
                marks = await asyncio.shield(self.marks)
                return await self.vectors.index.nearest(self.scope, kind, query, where, mark=marks.get(kind),
                                                        floor=-1.0, limit=limit)
        except Exception as exc:
            return self._failed(kind, exc)

    def nearest_now(self, kind: EmbeddingKind, limit: int, **conversations: Any
                    ) -> tuple[list[tuple[str, float]], Spread] | None:
        """What `nearest` answers, when nothing is left to wait for (the query embedded, the marks read,
        the matrix current and small): then no task nor deadline is set up for it. None otherwise."""
        task, marks = self.task, self.marks
        if not (task.done() and marks.done()) or task.cancelled() or marks.cancelled():
            return None
        try:
            query = task.result()
            if query is None:
                return [], Spread()
            return self.vectors.index.nearest_now(self.scope, kind, query, row_filter(self.scope, kind, **conversations),
                                                  mark=marks.result().get(kind), floor=-1.0, limit=limit)
        except Exception as exc:
            return self._failed(kind, exc)

    def catches_up(self, kind: EmbeddingKind) -> bool:
        """Whether `nearest` has only a few rows read on the event loop to wait for (the matrix is behind
        the marks by this user's latest saves): then a source awaits it in turn, without a task."""
        task, marks = self.task, self.marks
        return (task.done() and marks.done() and not task.cancelled() and not marks.cancelled()
                and self.vectors.index.catches_up_on_loop(self.scope, kind))

    def _failed(self, kind: EmbeddingKind, exc: Exception) -> tuple[list[tuple[str, float]], Spread]:
        """Nothing from the vector stream: it ran past its deadline, or could not be had."""
        if isinstance(exc, TimeoutError):
            return [], Spread()
        if isinstance(exc, StoreError):
            log.warning("vectors: the %s vectors could not be read (%s)", kind, exc)
        else:  # the vector stream's boundary: whatever breaks it, the lexical stream stands
            log.error("vectors: the %s search failed", kind, exc_info=exc)
        return [], Spread()

    async def items(self, kind: EmbeddingKind, item_ids: Sequence[str]) -> dict[str, Any]:
        """The items among `item_ids` that still hold a vector (read back: one deleted or edited since
        is never shown), by id; none when they cannot be read in time."""
        if not item_ids:
            return {}
        index = self.vectors.index
        try:
            async with asyncio.timeout_at(self.deadline):
                found = await index.store.embedded_items(self.scope, kind, item_ids, index.model)
        except TimeoutError:
            return {}
        except StoreError as exc:
            log.warning("vectors: the %s items could not be read (%s)", kind, exc)
            return {}
        return {item.id: item for item in found}
