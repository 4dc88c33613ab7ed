"""Cosine search (memory/vectors.py) and the fusion of a source's two streams (memory/hybrid.py)."""

from __future__ import annotations

import asyncio
import struct
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from proxy.memory.hybrid import VECTOR_REASON, fuse
from proxy.memory.sources import Found
from proxy.memory.vectors import Matrix, RowFilter, VectorIndex, row_filter, unit
from proxy.models import Scope
from proxy.stores.base import FinishTurn, NewEmbedding, StartTurn, StoredVector
from proxy.stores.sqlite.store import SQLiteStore

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def vec(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def matrix(*rows: tuple[str, str | None, str | None, tuple[float, ...]]) -> Matrix:
    return Matrix.build([StoredVector(item_id, group, agent, vec(*values)) for item_id, group, agent, values in rows])


def q(*values: float) -> np.ndarray:
    v = unit(vec(*values))
    assert v is not None
    return v


# --- Matrix ---------------------------------------------------------------------------


def test_nearest_is_best_first_above_the_floor_and_ties_break_by_id() -> None:
    m = matrix(("c", "g1", None, (1, 0)), ("a", "g1", None, (2, 0)), ("b", "g2", None, (1, 1)),
               ("d", "g2", None, (0, 1)), ("e", "g2", None, (-1, 0)))
    assert m.nearest(q(1, 0), RowFilter(), 0.5, 10) == [("a", 1.0), ("c", 1.0), ("b", 0.707107)]
    assert m.nearest(q(1, 0), RowFilter(), 0.5, 1) == [("a", 1.0)]  # equal cosines: the smaller id
    assert m.nearest(q(1, 0), RowFilter(), -1.0, 10)[-1] == ("e", -1.0)
    assert m.nearest(q(1, 0, 0), RowFilter(), 0.0, 10) == []  # another model's length: nothing
    assert m.nearest(q(1, 0), RowFilter(), 0.0, 0) == []


def test_filters_keep_a_sources_rows() -> None:
    m = matrix(("a", "g1", None, (1, 0)), ("b", "g2", "coder", (1, 0)), ("c", "g3", None, (1, 0)))
    ids = lambda where: [i for i, _ in m.nearest(q(1, 0), where, 0.0, 10)]
    assert ids(RowFilter(conversation="g2")) == ["b"]
    assert ids(RowFilter(exclude="g2")) == ["a", "c"]
    assert ids(RowFilter(exclude="g1", within=frozenset({"g1", "g3"}))) == ["c"]
    assert ids(RowFilter(agent="coder", by_agent=True)) == ["b"]
    assert ids(RowFilter(agent=None, by_agent=True)) == ["a", "c"]
    assert ids(row_filter(Scope("u", agent="coder"), "message")) == ["a", "b", "c"]  # shared unless isolated
    assert ids(row_filter(Scope("u", agent="coder"), "reasoning")) == ["b"]  # reasoning is per agent


def test_build_skips_zero_vectors_and_other_lengths_and_add_replaces() -> None:
    m = matrix(("a", None, None, (1, 0)), ("z", None, None, (0, 0)), ("x", None, None, (1, 0, 0)),
               ("b", None, None, (0, 1)))
    assert m.ids == ["a", "b"]
    m.add([("a", None, None, q(0, 1)), ("c", None, None, q(1, 0)), ("w", None, None, q(1, 0, 0))])
    assert m.ids == ["a", "b", "c"]
    assert m.nearest(q(0, 1), RowFilter(), 0.9, 10) == [("a", 1.0), ("b", 1.0)]
    empty = Matrix.build([])
    empty.add([("n", "g", None, q(3, 4))])
    assert empty.nearest(q(3, 4), RowFilter(), 0.9, 10) == [("n", 1.0)]


# --- fuse -----------------------------------------------------------------------------


def test_rows_added_batch_after_batch_land_in_order_and_an_earlier_view_stays_whole() -> None:
    # The matrix grows in a room with space to spare (no copy of it per batch); a search in a
    # thread holding the view from before an add must see the rows it had, unchanged.
    rng = np.random.default_rng(7)
    first = np.stack([unit(row) for row in rng.random((3, 8), dtype=np.float32)])
    matrix = Matrix(["a", "b", "c"], first.copy(), [None] * 3, [None] * 3)
    before = matrix.vectors
    added = []
    for batch in range(40):
        rows = [(f"n{batch}-{k}", "c1", None, unit(rng.random(8, dtype=np.float32))) for k in range(5)]
        matrix.add(rows)
        added += [r[3] for r in rows]
    assert before.shape == (3, 8) and np.array_equal(before, first)
    assert matrix.vectors.shape == (203, 8) and len(matrix.ids) == 203
    assert np.array_equal(matrix.vectors, np.vstack([first, np.stack(added)]))
    target = added[117]
    assert matrix.nearest(target, RowFilter(), -1.0, 1) == [(matrix.ids[3 + 117], pytest.approx(1.0, abs=1e-5))]


def test_fuse_ranks_by_weighted_rrf_with_a_bonus_for_both_and_each_text_once() -> None:
    lexical = [Found("l1", 9.0, parts={"bm25": 9.0}), Found("both", 5.0, parts={"bm25": 5.0})]
    near = [("both", 0.8), ("v1", 0.7), ("twin", 0.6)]
    text = {"l1": "one", "both": "two", "v1": "three", "twin": "ONE "}.__getitem__
    fused = fuse(lexical, near, {"lexical": 1.0, "vector": 1.0}, key=lambda i: i, text=text)
    assert [f.item for f in fused] == ["both", "l1", "v1"]  # twin says l1's words: dropped
    assert fused[0].parts["cosine"] == 0.8 and fused[0].parts["bm25"] == 5.0
    assert fused[2].reason == VECTOR_REASON and fused[2].parts == {"cosine": 0.7, "rrf": fused[2].parts["rrf"]}
    vector_led = fuse(lexical, near, {"lexical": 1.0, "vector": 3.0}, key=lambda i: i, text=text)
    assert [f.item for f in vector_led] == ["both", "v1", "twin"]  # twin now before l1, whose words it says
    alone = fuse([], near, {"lexical": 1.0, "vector": 1.0}, key=lambda i: i, text=text)
    assert [f.item for f in alone] == ["both", "v1", "twin"] and alone[0].parts["rrf"] == 1.0


# --- VectorIndex over a real SQLite store ----------------------------------------------


def test_index_loads_once_takes_this_process_vectors_and_reloads_after_its_ttl(tmp_path: Path) -> None:
    async def body() -> None:
        store = SQLiteStore(str(tmp_path / "m.db"))
        await store.open()
        try:
            alice = Scope("alice")
            for n in range(3):
                await store.apply([StartTurn(alice, f"t{n}", f"c{n}", f"h{n}", T0, f"words {n}"),
                                   FinishTurn(alice, f"t{n}", f"c{n}", f"answer {n}", T0 + timedelta(seconds=1))])
            items = await store.unembedded("m", "message")
            first, second, third = items[0], items[1], items[2]
            await store.save_embeddings("m", [NewEmbedding("alice", "message", first.item_id, first.text, vec(1, 0))])
            index = VectorIndex(store, "m", ttl_s=0.2)
            where = RowFilter()
            assert await index.nearest(alice, "message", q(1, 0), where, floor=0.5, limit=5) == [(first.item_id, 1.0)]
            # Saved here: in the loaded matrix at once.
            await store.save_embeddings("m", [NewEmbedding("alice", "message", second.item_id, second.text,
                                                           vec(1, 0))])
            index.add([second], [vec(1, 0)])
            assert len(await index.nearest(alice, "message", q(1, 0), where, floor=0.5, limit=5)) == 2
            # Saved elsewhere (another replica, reindex): seen once the matrix is older than its ttl.
            await store.save_embeddings("m", [NewEmbedding("alice", "message", third.item_id, third.text,
                                                           vec(1, 0))])
            assert len(await index.nearest(alice, "message", q(1, 0), where, floor=0.5, limit=5)) == 2
            await asyncio.sleep(0.25)
            await index.nearest(alice, "message", q(1, 0), where, floor=0.5, limit=5)  # starts the reload
            await asyncio.sleep(0.05)
            assert len(await index.nearest(alice, "message", q(1, 0), where, floor=0.5, limit=5)) == 3
            assert await index.nearest(Scope("bob"), "message", q(1, 0), where, floor=0.5, limit=5) == []
            index.forget("alice")
            assert ("alice", "message") not in index._entries
        finally:
            await store.close()

    asyncio.run(body())


def test_the_cached_matrices_stay_within_their_memory_bound(tmp_path: Path) -> None:
    async def body() -> None:
        store = SQLiteStore(str(tmp_path / "m.db"))
        await store.open()
        try:
            users = [Scope(name) for name in ("ann", "ben", "cid")]
            for user in users:
                await store.apply([StartTurn(user, f"{user.user}-t{n}", "c", f"h{n}", T0, f"words {n}")
                                   for n in range(10)])
                await store.save_embeddings("m", [
                    NewEmbedding(user.user, "message", item.item_id, item.text, vec(*([1.0] * 100)))
                    for item in await store.unembedded("m", "message") if item.scope.user == user.user])
            one_matrix = 10 * 100 * 4
            index = VectorIndex(store, "m", ttl_s=60, max_bytes=2 * one_matrix + 100)
            query, where = q(*([1.0] * 100)), RowFilter()
            for user in users[:2]:
                assert len(await index.nearest(user, "message", query, where, floor=0.5, limit=20)) == 10
            assert list(index._entries) == [("ann", "message"), ("ben", "message")]
            await index.nearest(users[0], "message", query, where, floor=0.5, limit=20)  # ann used last
            assert len(await index.nearest(users[2], "message", query, where, floor=0.5, limit=20)) == 10
            assert list(index._entries) == [("ann", "message"), ("cid", "message")]  # ben, least recent, left
            # One matrix past the bound on its own stays: the request using it needs it.
            index.max_bytes = one_matrix // 2
            index.add([], [])
            assert list(index._entries) == [("cid", "message")]
            assert len(await index.nearest(users[1], "message", query, where, floor=0.5, limit=20)) == 10
            assert list(index._entries) == [("ben", "message")]
        finally:
            await store.close()

    asyncio.run(body())
