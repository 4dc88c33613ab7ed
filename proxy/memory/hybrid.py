"""The vector stream of a source and its fusion with the lexical one (docs/retrieval.md).

With embeddings configured, each request's query is embedded once (`Vectors.query`),
within `embeddings.query_timeout_ms` of the start of retrieval; every lexical source then
also ranks the user's vectors of its kind by cosine (proxy.memory.vectors), keeping its own
filters, and the two ranked lists are combined by weighted reciprocal rank fusion (k = 60,
normalised over the streams that returned something, a bonus for a candidate both found).
When the query cannot be embedded in time, or the endpoint fails (it is then left alone
for a while), or the vectors cannot be read, the lexical stream stands alone. With no
embeddings configured none of this runs: `SourceQuery.vectors` is None.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from proxy.memory.embeddings import Embed, EmbeddingFailed
from proxy.memory.fusion import rrf
from proxy.memory.sources import Found, SourceQuery, normalised
from proxy.memory.vectors import RowFilter, VectorIndex, row_filter, unit
from proxy.metrics import Metrics
from proxy.models import Scope
from proxy.settings import EmbeddingsSettings
from proxy.stores.base import EmbeddingKind, StoreError

log = logging.getLogger("memproxy.vectors")

T = TypeVar("T")
VECTOR_REASON = "vector"
LEXICAL, VECTOR = "lexical", "vector"
QUIET_FIRST_S = 1.0  # after a failed query embedding, the endpoint is left alone this long, doubling
QUIET_MAX_S = 60.0
MAX_CANDIDATES = 500  # vector candidates asked per source, at most


@dataclass
class _Quiet:
    """When the query endpoint failed last, and how long to leave it alone."""

    until: float = 0.0
    pause: float = QUIET_FIRST_S


@dataclass
class Vectors:
    """Vector search for one app: the embeddings call, the cached matrices, the fusion weights."""

    embed: Embed
    index: VectorIndex
    settings: EmbeddingsSettings
    metrics: Metrics
    _quiet: _Quiet = field(default_factory=_Quiet)

    @property
    def weights(self) -> dict[str, float]:
        return {LEXICAL: self.settings.lexical_weight, VECTOR: self.settings.vector_weight}

    def query(self, scope: Scope, text: str) -> VectorQuery | None:
        """Start embedding this request's query; None while the endpoint is being left alone."""
        loop = asyncio.get_running_loop()
        if loop.time() < self._quiet.until or not text.strip() or self.settings.vector_weight <= 0:
            if text.strip():
                self.metrics.embedding_calls.labels("query", "skipped").inc()
            return None
        timeout_s = self.settings.query_timeout_ms / 1000
        task = loop.create_task(self._embed(text, timeout_s), name="memproxy-query-embedding")
        return VectorQuery(self, scope, task, loop.time() + timeout_s)

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


@dataclass
class VectorQuery:
    """One request's query vector (computed once, shared by the sources) and its deadline."""

    vectors: Vectors
    scope: Scope
    task: asyncio.Task[np.ndarray | None]
    deadline: float  # loop time past which the vector stream gives up

    @property
    def weights(self) -> dict[str, float]:
        return self.vectors.weights

    async def search(self, kind: EmbeddingKind, limit: int, **conversations: Any) -> list[tuple[Any, float]]:
        """(item, cosine) of the user's nearest relevant items of `kind`, best first; [] when that cannot be had."""
        where: RowFilter = row_filter(self.scope, kind, **conversations)
        index = self.vectors.index
        try:
            async with asyncio.timeout_at(self.deadline):
                query = await asyncio.shield(self.task)
                if query is None:
                    return []
                near = await index.nearest(self.scope, kind, query, where, floor=self.vectors.settings.min_cosine,
                                           limit=limit)
                if not near:
                    return []
                items = await index.store.embedded_items(self.scope, kind, [item_id for item_id, _ in near],
                                                         index.model)
        except TimeoutError:
            return []
        except StoreError as exc:
            log.warning("vectors: the %s vectors could not be read (%s)", kind, exc)
            return []
        except Exception:  # the vector stream's boundary: whatever breaks it, the lexical stream stands
            log.exception("vectors: the %s search failed", kind)
            return []
        by_id = {item.id: item for item in items}
        return [(by_id[item_id], score) for item_id, score in near if item_id in by_id]


async def with_vectors(
    q: SourceQuery, lexical: Awaitable[list[Found[T]]], kind: EmbeddingKind, *, key: Callable[[T], str],
    text: Callable[[T], str], keep: Callable[[T], bool] = lambda item: True, **conversations: Any,
) -> list[Found[T]]:
    """The lexical candidates alone, or fused with the vector stream when the query has one."""
    vq = q.vectors
    if vq is None:
        return await lexical
    limit = min(MAX_CANDIDATES, q.candidates + len(q.visible))  # the request may show many of the nearest
    found, near = await asyncio.gather(lexical, vq.search(kind, limit, **conversations))
    near = [(item, score) for item, score in near if keep(item)]
    return fuse(found, near, vq.weights, key=key, text=text) if near else found


def fuse(found: Sequence[Found[T]], near: Sequence[tuple[T, float]], weights: dict[str, float], *,
         key: Callable[[T], str], text: Callable[[T], str]) -> list[Found[T]]:
    """Weighted RRF of the lexical candidates and the vector ones; each text once."""
    lexical = {key(f.item): f for f in found}
    cosine = {key(item): (item, score) for item, score in near}
    fused = rrf({LEXICAL: list(lexical), VECTOR: list(cosine)}, weights)
    out: list[Found[T]] = []
    texts: set[str] = set()
    for item_id, score, ranks in fused:
        if item_id in lexical:
            f = lexical[item_id]
            item, base, reason, parts = f.item, f.score, f.reason, dict(f.parts)
        else:
            item, base = cosine[item_id]
            reason, parts = VECTOR_REASON, {}
        words = normalised(text(item)).casefold()
        if words in texts:
            continue
        texts.add(words)
        if item_id in cosine:
            parts["cosine"] = cosine[item_id][1]
        parts["rrf"] = round(score, 6)
        out.append(Found(item, base, reason, parts))
    return out
