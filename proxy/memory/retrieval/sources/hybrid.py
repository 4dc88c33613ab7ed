"""The vector stream of a source and its fusion with the lexical one (docs/retrieval.md).

With embeddings on (the embedded model by default), each request's query is embedded
once (`Vectors.query`, proxy.memory.vectors.query), within `embeddings.query_timeout_ms` of the start of retrieval,
and the store's marks of the user's newest vectors are read beside it (the cache is
current to them, proxy.memory.vectors.index); every lexical source then also ranks the user's
vectors of its kind by cosine, keeping its own filters, and the two are fused by score:

    fused = lexical_weight x bm25 / best bm25 + vector_weight x closeness

where closeness is how far a cosine stands above this query's mean cosine, in standard
deviations, relative to the query's best (0 at or below the mean, 1 for the nearest). A
static model's cosines are small and bunched (a right answer often at 0.1-0.3), so a
fixed cosine floor cannot tell near from far; this calibration per query can. A vector
hit the lexical stream did not find enters only when it stands at least MIN_Z standard
deviations above the mean and clears `embeddings.min_cosine`: when nothing is close,
no vector-only line is shown. Rank fusion (RRF) was tried and lost 4 points on LoCoMo.

When the query cannot be embedded in time, or the endpoint fails (it is then left alone
for a while), or the vectors cannot be read, the lexical stream stands alone. With
`embeddings.model: off` none of this runs: `SourceQuery.vectors` is None.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from proxy.memory.retrieval.sources import FILLER, Found, SourceQuery, same_words
from proxy.memory.vectors.index import Spread
from proxy.settings import EmbeddingsSettings
from proxy.stores.base import EmbeddingKind

T = TypeVar("T")
VECTOR_REASON = "vector"
MAX_CANDIDATES = 500  # vector candidates asked per source, at most
# A vector hit the lexical stream missed enters only this many standard deviations above
# the query's mean cosine (tuned on LoCoMo dev, docs/retrieval.md).
MIN_Z = 2.5
# Below this it only fills slots the lexical hits leave: on LoCoMo, vector-only hits between
# 2.5 and 4 deviations taking full slots cost 0.6 points, displacing lexical hits.
FULL_Z = 4.0
# With too few vectors for a spread (a new user), a hit is close at this cosine, and
# closeness is the cosine relative to the best one.
FEW_ROWS_COSINE = 0.3


@dataclass(frozen=True)
class Calibration:
    """One query's cosines over one source's rows, as the fusion judges them (module doc)."""

    spread: Spread
    best: float  # the query's best cosine there
    min_cosine: float

    def z(self, cosine: float) -> float:
        """Deviations above the query's mean cosine; a new user's (too few rows): the cosine itself."""
        return self.spread.z(cosine) if self.spread.telling else cosine

    def closeness(self, cosine: float) -> float:
        """0 at or below the query's mean cosine, 1 for its best; 0 where the spread does not tell
        (a new user's few items keep their lexical order)."""
        if not self.spread.telling:
            return 0.0
        best = self.best_z
        return max(0.0, self.z(cosine)) / best if best > 0 else 0.0

    @functools.cached_property
    def best_z(self) -> float:
        """The best cosine's deviations above the mean: computed once, asked for every candidate."""
        return self.z(self.best)

    def enters(self, cosine: float) -> bool:
        """Close enough to be shown on its vector alone (the lexical stream missed it)."""
        return self.z(cosine) >= (MIN_Z if self.spread.telling else FEW_ROWS_COSINE) and cosine >= self.min_cosine

    def takes_a_slot(self, cosine: float) -> bool:
        """Close enough to count as a full hit, not only a filler; a lexical hit this close is marked
        so. Only where the spread tells: among a new user's few items a vector hit only fills."""
        return self.spread.telling and self.z(cosine) >= FULL_Z and cosine >= self.min_cosine

    def why(self, cosine: float) -> dict[str, float]:
        """The parts the injection log shows: the cosine and, where the spread tells, its deviations."""
        return {"cosine": cosine, "z": round(self.z(cosine), 2)} if self.spread.telling else {"cosine": cosine}


async def with_vectors(
    q: SourceQuery, lexical: Awaitable[list[Found[T]]], kind: EmbeddingKind, *, key: Callable[[T], str],
    text: Callable[[T], str], keep: Callable[[T], bool] = lambda item: True, **conversations: Any,
) -> list[Found[T]]:
    """The lexical candidates alone, or fused with the vector stream when the query has one.

    Only the vector hits the lexical stream missed and that are close are read from the
    store; the others are known already, or not shown."""
    vq = q.vectors
    if vq is None:
        return await lexical
    limit = min(MAX_CANDIDATES, q.candidates + len(q.visible))  # the request may show many of the nearest
    # `lexical` is awaited here, never handed to a task of its own: a task cancelled before it
    # starts (the recall's deadline) would leave the coroutines inside it never awaited. The
    # vector search runs beside it only when it has something to wait for other than the few vectors
    # saved since the cached ones (most often it has nothing, or only those, read on the event loop).
    now = vq.nearest_now(kind, limit, **conversations)
    if now is None and vq.catches_up(kind):
        try:
            now = await vq.nearest(kind, limit, **conversations)
        except BaseException:
            if isinstance(lexical, Coroutine):
                lexical.close()  # cancelled first: the lexical search never begun is not left unawaited
            raise
    later = asyncio.ensure_future(vq.nearest(kind, limit, **conversations)) if now is None else None
    try:
        found = await lexical
    except BaseException:
        if later is not None:
            later.cancel()
        raise
    if later is not None:
        now = await later
    assert now is not None  # one of the two answered
    near, spread = now
    if not near:
        return found
    calibration = Calibration(spread, near[0][1], vq.vectors.settings.min_cosine)
    lexical_ids = {key(f.item) for f in found}
    missed = [(item_id, score) for item_id, score in near if item_id not in lexical_ids and calibration.enters(score)]
    read = await vq.items(kind, [item_id for item_id, _ in missed])
    alone = [(read[item_id], score) for item_id, score in missed if item_id in read and keep(read[item_id])]
    return fuse(found, dict(near), alone, calibration, vq.vectors.settings, key=key, text=text, words=q.words)


def fuse(found: Sequence[Found[T]], cosines: Mapping[str, float], alone: Sequence[tuple[T, float]],
         calibration: Calibration, settings: EmbeddingsSettings, *, key: Callable[[T], str],
         text: Callable[[T], str], words: Callable[[str], str] = same_words) -> list[Found[T]]:
    """The lexical candidates (each with its cosine, if near) and the close vector-only ones
    (`alone`), by fused score (module doc); each text once (compared by `words`)."""
    best_bm25 = max((f.score for f in found), default=0.0)
    ranked: list[tuple[float, int, Found[T]]] = []
    for n, f in enumerate(found):
        lexical = f.score / best_bm25 if best_bm25 > 0 else 0.0
        parts = dict(f.parts)
        cosine = cosines.get(key(f.item))
        closeness = calibration.closeness(cosine) if cosine is not None else 0.0
        fused = settings.lexical_weight * lexical + settings.vector_weight * closeness
        if cosine is not None and calibration.takes_a_slot(cosine):
            # Marks it close in meaning (an entity so marked is never weak).
            parts.update({**calibration.why(cosine), "fused": round(fused, 6)})
        ranked.append((fused, n, Found(f.item, f.score, f.reason, parts)))
    for n, (item, cosine) in enumerate(alone, start=len(found)):
        if not calibration.enters(cosine):
            continue  # nothing the lexical stream missed is shown unless it is close
        fused = settings.vector_weight * calibration.closeness(cosine)
        weak = {} if calibration.takes_a_slot(cosine) else {FILLER: True}
        ranked.append((fused, n, Found(item, cosine, VECTOR_REASON,
                                       {**calibration.why(cosine), "fused": round(fused, 6), **weak})))
    ranked.sort(key=lambda r: (-round(r[0], 9), r[1]))
    out: list[Found[T]] = []
    texts: set[str] = set()
    for _, _, f in ranked:
        said = words(text(f.item))
        if said not in texts:
            texts.add(said)
            out.append(f)
    return out
