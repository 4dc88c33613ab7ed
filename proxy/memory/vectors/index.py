"""Cosine search over a user's vectors, from an in-process cache of one matrix per (user, kind).

Several processes share one store, so a cached matrix is never trusted on its own: each
request reads the store's mark of the user's newest vector of each kind (one index probe
per kind, Store.vector_marks) alongside embedding its query, and a matrix behind that mark
reads just the rows saved after it (all of them again when a row was replaced in place).
A search therefore sees every vector committed before its request began, by any process.
The first load of a (user, kind) runs in a task of its own that a request's deadline does
not cancel (a request that cannot wait goes on with the lexical stream alone).

An item deleted or edited since (its vector dropped by the store's triggers) is never
returned, because the candidates are read back from the store, which checks that each
still holds a vector for the model (Store.embedded_items), before anything uses them.
The matrix is the model's vectors scaled to unit length, so a cosine is one dot product.
It is float32: numpy has no fast float16 or int8 product (at 100,000 rows of 256, float16
took 104 ms and int8 27 ms against float32's 16 ms), so it costs rows x dimensions x 4
bytes (the embedded model's 128: 512 bytes an item, 5 MB for 10,000 items, 50 MB for
100,000). At most MAX_MATRICES taking at most `embeddings.cache_max_mb` together are kept,
the least recently used dropped first (the one in use stays, even alone past the bound).

A process serving requests runs its products on one BLAS thread (`one_blas_thread`):
OpenBLAS splits a product of more than about 9,000 cells over every core, and its threads
then spin waiting for the next one. A query against 10,800 vectors cost 2.3-5.8 ms of CPU
that way on two shared cores, against 0.2 ms on one thread (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from proxy.models import Scope
from proxy.stores.base import EmbeddingKind, RecallReads, StoredVector, VectorMark

log = logging.getLogger("memproxy.vectors")

MAX_MATRICES = 256
# Past this many matrix cells a product runs in a thread, not on the event loop, so other streams keep flowing.
# 4M cells (16 MB of float32, about 1 ms): up to 31,000 items of the embedded model's 128
# stay inline, where a thread's hop cost more than the product.
INLINE_CELLS = 4_000_000
COSINE_DIGITS = 6  # cosines are compared rounded, so float noise cannot reorder equals
# Below this many rows a query's spread of cosines says too little for a z-score (a few
# near rows among ten move the mean and the deviation as much as they stand out).
MIN_SPREAD_ROWS = 50


def one_blas_thread() -> None:
    """Hold this process's BLAS libraries to one thread each (see the module doc)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")


def unit(vector: bytes | np.ndarray) -> np.ndarray | None:
    """A float32 vector scaled to length 1; None for an empty or zero vector."""
    v = np.frombuffer(vector, dtype="<f4") if isinstance(vector, bytes) else np.asarray(vector, dtype=np.float32)
    # What np.linalg.norm computes for a float32 vector, without its Python layers (each query's
    # vector and each new row pass here, with the caches cold).
    norm = float(np.sqrt(v.dot(v))) if v.size else 0.0
    return None if norm == 0.0 or not math.isfinite(norm) else v / np.float32(norm)


@dataclass(frozen=True)
class RowFilter:
    """Which rows a source may see: its conversation, or all but one, or some; and the agent."""

    conversation: str | None = None  # only this conversation's items
    exclude: str | None = None  # all but this conversation's
    within: frozenset[str] | None = None  # only these conversations' items
    agent: str | None = None
    by_agent: bool = False  # only items of `agent`


def row_filter(scope: Scope, kind: EmbeddingKind, **conversations: object) -> RowFilter:
    """The scope's agent filter as the store's searches apply it (reasoning is per agent)."""
    by_agent = scope.agent_isolated or (kind == "reasoning" and scope.agent is not None)
    return RowFilter(agent=scope.agent, by_agent=by_agent, **conversations)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Spread:
    """How one query's cosines spread over a source's rows: a static model's cosines are
    small and bunched, so a hit is judged by how far it stands above this query's own."""

    mean: float = 0.0
    std: float = 0.0
    rows: int = 0

    @functools.cached_property  # asked for each candidate of each source
    def telling(self) -> bool:
        """Enough rows for a z-score to mean something."""
        return self.rows >= MIN_SPREAD_ROWS and self.std > 0

    def z(self, cosine: float) -> float:
        """Standard deviations above the query's mean cosine (0 when not `telling`)."""
        return (cosine - self.mean) / self.std if self.telling else 0.0


class _Codes:
    """Small integer codes of a column's values (conversations, agents), grown as rows are
    added: a filter is then one vectorised comparison, not a Python loop over every row."""

    def __init__(self) -> None:
        self._of: dict[str | None, int] = {}
        self._array = np.zeros(0, dtype=np.int32)

    def up_to(self, values: Sequence[str | None], n: int) -> np.ndarray:
        """The codes of the first `n` values."""
        have = self._array.size
        if have < n:
            added = np.fromiter((self._of.setdefault(v, len(self._of)) for v in values[have:n]), dtype=np.int32,
                                count=n - have)
            self._array = np.concatenate([self._array, added])
        return self._array[:n]

    def code(self, value: str | None) -> int:
        """The value's code; -1 (no row's) for a value no row holds."""
        return self._of.get(value, -1)

    def among(self, codes: np.ndarray, values: Iterable[str | None]) -> np.ndarray:
        """True where a code (of `up_to`) is one of `values`': one lookup a row (numpy's isin sorts them)."""
        wanted = np.zeros(len(self._of), dtype=bool)
        wanted[[code for value in values if (code := self.code(value)) >= 0]] = True
        return wanted[codes]


@dataclass
class Matrix:
    """One (user, kind)'s unit vectors, with the conversation and agent of each row."""

    ids: list[str]
    vectors: np.ndarray  # (rows, dim) float32: a view of the first rows of `_room`
    groups: list[str | None]
    agents: list[str | None]
    rows: dict[str, int] = field(default_factory=dict)
    # The array `vectors` views, with room to grow: adding a batch copies that batch, and the
    # whole matrix only when the room runs out (then doubled). Copying it at every batch took
    # the event loop 34 ms at 50,000 rows of 1,536 floats.
    _room: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32), repr=False)
    _group_codes: _Codes = field(default_factory=lambda: _Codes(), repr=False)
    _agent_codes: _Codes = field(default_factory=lambda: _Codes(), repr=False)
    # The last query's rounded cosines, with the query and the rows they were computed
    # over: a request's sources searching one kind (its conversation, the others) share
    # one product. A row replaced in place bumps `_changes`, so no stale score is reused.
    _changes: int = field(default=0, repr=False)
    _last: tuple[np.ndarray, int, int, np.ndarray] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.rows = {item_id: n for n, item_id in enumerate(self.ids)}
        self._room = self.vectors

    @property
    def nbytes(self) -> int:
        """The memory its vectors take, room to grow included."""
        return int(self._room.nbytes)

    @classmethod
    def build(cls, stored: Sequence[StoredVector]) -> Matrix:
        """The matrix of stored vectors: rows of the most common length (one model gives one)."""
        units = [(s, unit(s.vector)) for s in stored]
        lengths = [u.shape[0] for _, u in units if u is not None]
        dim = max(set(lengths), key=lengths.count) if lengths else 0
        kept = [(s, u) for s, u in units if u is not None and u.shape[0] == dim]
        vectors = np.stack([u for _, u in kept]) if kept else np.zeros((0, dim), dtype=np.float32)
        return cls([s.item_id for s, _ in kept], vectors, [s.group for s, _ in kept], [s.agent for s, _ in kept])

    def add(self, rows: Sequence[tuple[str, str | None, str | None, np.ndarray]]) -> None:
        """Put (item id, conversation, agent, unit vector) rows in, replacing an item's old vector."""
        dim = self.vectors.shape[1] if self.vectors.shape[0] else (rows[0][3].shape[0] if rows else 0)
        new: list[tuple[str, str | None, str | None, np.ndarray]] = []
        for item_id, group, agent, vector in rows:
            if vector.shape[0] != dim:
                continue
            if item_id in self.rows:
                self.vectors[self.rows[item_id]] = vector
                self._changes += 1
                continue
            self.rows[item_id] = len(self.ids) + len(new)
            new.append((item_id, group, agent, vector))
        if new:  # one copy of the matrix per batch, not per row
            # The lists grow before the matrix does: a search running in a thread meanwhile
            # reads the matrix once and never finds a row without its id.
            self.ids.extend(r[0] for r in new)
            self.groups.extend(r[1] for r in new)
            self.agents.extend(r[2] for r in new)
            self.vectors = self._grown(dim, np.stack([r[3] for r in new]))

    def _grown(self, dim: int, added: np.ndarray) -> np.ndarray:
        """The vectors with `added` after them, in the room left or in a room twice as large.

        A search reading the old view meanwhile (in a thread) is not disturbed: rows past its
        end are written, or a new array is made."""
        have = self.vectors.shape[0] if self.vectors.ndim == 2 else 0
        need = have + added.shape[0]
        if self._room.ndim != 2 or self._room.shape[1] != dim or self._room.shape[0] < need:
            room = np.empty((max(need, 2 * have, 64), dim), dtype=np.float32)
            room[:have] = self.vectors.reshape(-1, dim)[:have]
            self._room = room
        self._room[have:need] = added
        return self._room[:need]

    def mask(self, where: RowFilter, n: int) -> np.ndarray | None:
        """True for the first `n` rows that `where` lets a source see; None when it lets it see every row."""
        by_group = where.conversation is not None or where.exclude is not None or where.within is not None
        if not by_group and not where.by_agent:
            return None
        tests: list[np.ndarray] = []
        if by_group:
            groups = self._group_codes.up_to(self.groups, n)
            if where.conversation is not None:
                tests.append(groups == self._group_codes.code(where.conversation))
            if where.exclude is not None:
                tests.append(groups != self._group_codes.code(where.exclude))
            if where.within is not None:
                tests.append(self._group_codes.among(groups, where.within))
        if where.by_agent:
            tests.append(self._agent_codes.up_to(self.agents, n) == self._agent_codes.code(where.agent))
        keep = tests[0]
        for test in tests[1:]:
            keep &= test
        return keep

    def nearest(self, query: np.ndarray, where: RowFilter, floor: float, limit: int
                ) -> tuple[list[tuple[str, float]], Spread]:
        """Up to `limit` (item id, cosine) at or above `floor`, best first, ties by id; and the
        spread of the query's cosines over every row `where` lets the source see."""
        vectors = self.vectors
        if not vectors.shape[0] or query.shape[0] != vectors.shape[1] or limit <= 0:
            return [], Spread()
        scores = self._scores(query, vectors)
        visible = self.mask(where, vectors.shape[0])
        rows = None if visible is None else np.flatnonzero(visible)
        seen = scores if rows is None else scores[rows]
        if not seen.size:
            return [], Spread()
        # One partition of the visible cosines finds the cut: with more than `limit` of them at
        # or above the floor, the limit-th best is too, so the cut is the higher of the two.
        # Ties at the cut all stay, then by id.
        cut = floor
        if seen.size > limit:
            cut = max(cut, float(np.partition(seen, seen.size - limit)[seen.size - limit]))
        kept = np.flatnonzero(seen >= cut)
        if rows is not None:
            kept = rows[kept]
        ids = self.ids
        ranked = sorted(zip((-np.round(scores[kept].astype(np.float64), COSINE_DIGITS)).tolist(),
                            [ids[n] for n in kept.tolist()]))
        return [(item_id, -negated) for negated, item_id in ranked[:limit]], spread_of(seen)

    def _scores(self, query: np.ndarray, vectors: np.ndarray) -> np.ndarray:
        """The rounded cosines of `query` with every row of `vectors` (this matrix's current view)."""
        last = self._last
        if last is not None and last[0] is query and last[1] == vectors.shape[0] and last[2] == self._changes:
            return last[3]
        changes = self._changes
        scores = vectors @ query
        np.round(scores, COSINE_DIGITS, out=scores)
        self._last = (query, vectors.shape[0], changes, scores)
        return scores


def spread_of(cosines: np.ndarray) -> Spread:
    """The mean and standard deviation of (a non-empty array of float32) cosines, bit for bit what
    numpy's mean() and std() give, with the mean computed once and numpy's Python layers skipped."""
    n = cosines.size
    mean = np.add.reduce(cosines) / n
    deviations = cosines - mean
    np.multiply(deviations, deviations, out=deviations)
    return Spread(float(mean), float(np.sqrt(np.add.reduce(deviations) / n)), n)


@dataclass
class _Entry:
    matrix: Matrix
    mark: VectorMark


class VectorIndex:
    """The cached matrices of one model, each checked against the store's mark per search (see the module doc)."""

    def __init__(self, store: RecallReads, model: str, *, max_bytes: int = 512 * 1024 * 1024) -> None:
        self.store = store
        self.model = model
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._loads: dict[tuple[str, str], asyncio.Task[Matrix]] = {}

    async def marks(self, scope: Scope) -> dict[EmbeddingKind, VectorMark]:
        """The store's newest vector of each kind for the user: read once per request."""
        return await self.store.vector_marks(Scope(scope.user), self.model)

    async def nearest(self, scope: Scope, kind: EmbeddingKind, query: np.ndarray, where: RowFilter, *,
                      mark: VectorMark | None, floor: float, limit: int) -> tuple[list[tuple[str, float]], Spread]:
        """The user's nearest items of `kind` to the (unit) query vector, and how the query's cosines spread.

        `mark` is the store's newest vector of the kind, read during this request: the matrix
        searched holds every vector up to it."""
        found = self.nearest_now(scope, kind, query, where, mark=mark, floor=floor, limit=limit)
        if found is not None:
            return found
        assert mark is not None  # nearest_now answers for no mark
        matrix = await self._matrix(scope, kind, mark)
        if matrix.vectors.size > INLINE_CELLS:
            return await asyncio.to_thread(matrix.nearest, query, where, floor, limit)
        return matrix.nearest(query, where, floor, limit)

    def nearest_now(self, scope: Scope, kind: EmbeddingKind, query: np.ndarray, where: RowFilter, *,
                    mark: VectorMark | None, floor: float, limit: int
                    ) -> tuple[list[tuple[str, float]], Spread] | None:
        """What `nearest` answers, when it can be had without waiting: the matrix cached is current to
        `mark` and small enough for a product on the event loop; None when a load or a thread is due."""
        if mark is None:
            return [], Spread()
        matrix = self._current(scope, kind, mark)
        if matrix is None or matrix.vectors.size > INLINE_CELLS:
            return None
        return matrix.nearest(query, where, floor, limit)

    def _current(self, scope: Scope, kind: EmbeddingKind, mark: VectorMark) -> Matrix | None:
        """The cached matrix holding every vector up to `mark`; None when it must be loaded first."""
        key = (scope.user, kind)
        entry = self._entries.get(key)
        if entry is not None and entry.mark == mark:
            self._entries.move_to_end(key)
            return entry.matrix
        if entry is not None and mark.seq < entry.mark.seq:
            # This request read its mark before the cache was read, or the user's newest vectors
            # were deleted since: seqs only rise (VectorMark), so no row can have come below the
            # cache's mark, and it holds every row this mark covers (deleted ones are dropped
            # when hits are read back).
            return entry.matrix
        return None

    async def _matrix(self, scope: Scope, kind: EmbeddingKind, mark: VectorMark) -> Matrix:
        key = (scope.user, kind)
        loop = asyncio.get_running_loop()
        while True:
            if (matrix := self._current(scope, kind, mark)) is not None:
                return matrix
            load = self._loads.get(key)
            if load is None or load.done():
                # A finished load (of an older mark, or failed) stays listed until its done callback
                # runs, on the loop's next pass: awaited again it would not yield, and this loop
                # would spin with the event loop's every other task and signal held (seen under load).
                load = self._loads[key] = loop.create_task(self._load(key, scope, kind, mark),
                                                           name="memproxy-vectors-load")
                load.add_done_callback(lambda task: self._loaded(key, task))
            # Shielded: a request that stops waiting leaves the load to finish for the next one.
            await asyncio.shield(load)

    def _loaded(self, key: tuple[str, str], task: asyncio.Task[Matrix]) -> None:
        if self._loads.get(key) is task:  # a later load may have taken its place
            del self._loads[key]
        if not task.cancelled():
            task.exception()  # retrieved: a request that stopped waiting left no one to see it (it logs its own)

    async def _load(self, key: tuple[str, str], scope: Scope, kind: EmbeddingKind, mark: VectorMark) -> Matrix:
        """The vectors saved since the cached ones (all of them when none are cached or a row was replaced)."""
        entry = self._entries.get(key)
        if entry is not None and mark.seq > entry.mark.seq:
            newer = await self.store.vectors(Scope(scope.user), kind, self.model, after=entry.mark.seq,
                                             newest=mark.seq)
            rows = [(s.item_id, s.group, s.agent, u) for s in newer if (u := unit(s.vector)) is not None]
            if self._entries.get(key) is entry:
                entry.matrix.add(rows)
                entry.mark = mark
                self._trim()
            return entry.matrix
        stored = await self.store.vectors(Scope(scope.user), kind, self.model)
        matrix = await asyncio.to_thread(Matrix.build, stored) if len(stored) > 1000 else Matrix.build(stored)
        self._entries[key] = _Entry(matrix, mark)
        self._entries.move_to_end(key)
        self._trim()
        return matrix

    def _trim(self) -> None:
        """Drop the least recently used matrices past MAX_MATRICES or `max_bytes`, never the last one."""
        held = sum(entry.matrix.nbytes for entry in self._entries.values())
        while len(self._entries) > 1 and (len(self._entries) > MAX_MATRICES or held > self.max_bytes):
            _, dropped = self._entries.popitem(last=False)
            held -= dropped.matrix.nbytes

    def forget(self, user: str) -> None:
        """Drop the user's matrices (a deleted user's vectors leave memory, not just the database)."""
        for key in [k for k in self._entries if k[0] == user]:
            del self._entries[key]
