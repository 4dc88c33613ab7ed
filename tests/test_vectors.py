"""Cosine search (memory/vectors/index.py) and the fusion of a source's two streams (memory/retrieval/hybrid.py)."""

from __future__ import annotations

import asyncio
import struct
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from proxy.memory.retrieval.sources.hybrid import VECTOR_REASON, Calibration, fuse
from proxy.memory.retrieval.sources import Found
from proxy.memory.vectors.index import (Matrix, RowFilter, Spread, VectorIndex, one_blas_thread, row_filter,
                                       spread_of, unit)
from proxy.memory.retrieval.base import Query
from proxy.memory.retrieval.retriever import Retrieval
from proxy.memory.vectors.filler import Filler
from proxy.memory.vectors.local_model import LocalModel
from proxy.memory.vectors.query import Vectors
from proxy.metrics import Metrics
from proxy.models import Scope
from proxy.settings import EmbeddingsSettings, MemorySettings
from proxy.stores.base import FinishTurn, NewEmbedding, StartTurn, StoredVector, Unembedded
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
    assert m.nearest(q(1, 0), RowFilter(), 0.5, 10)[0] == [("a", 1.0), ("c", 1.0), ("b", 0.707107)]
    assert m.nearest(q(1, 0), RowFilter(), 0.5, 1)[0] == [("a", 1.0)]  # equal cosines: the smaller id
    assert m.nearest(q(1, 0), RowFilter(), -1.0, 10)[0][-1] == ("e", -1.0)
    assert m.nearest(q(1, 0, 0), RowFilter(), 0.0, 10)[0] == []  # another model's length: nothing
    assert m.nearest(q(1, 0), RowFilter(), 0.0, 0)[0] == []


def test_filters_keep_a_sources_rows() -> None:
    m = matrix(("a", "g1", None, (1, 0)), ("b", "g2", "coder", (1, 0)), ("c", "g3", None, (1, 0)))
    ids = lambda where: [i for i, _ in m.nearest(q(1, 0), where, 0.0, 10)[0]]
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
    assert m.nearest(q(0, 1), RowFilter(), 0.9, 10)[0] == [("a", 1.0), ("b", 1.0)]
    empty = Matrix.build([])
    empty.add([("n", "g", None, q(3, 4))])
    assert empty.nearest(q(3, 4), RowFilter(), 0.9, 10)[0] == [("n", 1.0)]


def test_a_serving_process_runs_its_products_on_one_blas_thread() -> None:
    # `memproxy serve` calls it at start-up: OpenBLAS's threads, spread over every core and
    # spinning between products, cost many times the product's own CPU (module doc).
    one_blas_thread()
    blas = [lib for lib in threadpool_info() if lib["user_api"] == "blas"]
    assert blas and all(lib["num_threads"] == 1 for lib in blas)


def test_one_query_searched_twice_is_scored_once_and_never_from_before_a_change() -> None:
    # A request's sources share one product per kind; a row replaced or added since must be
    # seen by the next search with the same query.
    m = matrix(("a", "c1", None, (1, 0)), ("b", "c2", None, (0, 1)))
    query = q(1, 0)
    assert m.nearest(query, RowFilter(conversation="c1"), -1.0, 10)[0] == [("a", 1.0)]
    assert m.nearest(query, RowFilter(exclude="c1"), -1.0, 10)[0] == [("b", 0.0)]
    m.add([("b", "c2", None, q(1, 0))])  # replaced in place: same rows, new vector
    assert m.nearest(query, RowFilter(exclude="c1"), -1.0, 10)[0] == [("b", 1.0)]
    m.add([("c", "c3", None, q(1, 1))])
    assert m.nearest(query, RowFilter(), -1.0, 10)[0] == [("a", 1.0), ("b", 1.0), ("c", 0.707107)]


def test_the_cut_at_the_limit_keeps_ties_and_honours_the_filter_and_floor() -> None:
    m = matrix(("a", "c1", None, (1, 0)), ("b", "c2", None, (1, 0)), ("c", "c1", None, (1, 1)),
               ("d", "c1", None, (0, 1)), ("e", "c2", None, (-1, 0)))
    assert m.nearest(q(1, 0), RowFilter(), -1.0, 1)[0] == [("a", 1.0)]  # b ties at the cut, then by id
    assert m.nearest(q(1, 0), RowFilter(conversation="c1"), 0.5, 2)[0] == [("a", 1.0), ("c", 0.707107)]
    assert m.nearest(q(1, 0), RowFilter(exclude="c1"), 0.5, 5)[0] == [("b", 1.0)]
    found, spread = m.nearest(q(1, 0), RowFilter(conversation="c2"), -1.0, 1)
    assert found == [("b", 1.0)] and (spread.rows, spread.mean) == (2, 0.0)


def test_a_unit_vector_is_the_vector_over_numpys_norm_bit_for_bit_and_none_without_a_length() -> None:
    rng = np.random.default_rng(5)
    for _ in range(200):
        v = rng.normal(size=128).astype(np.float32)
        u = unit(v.tobytes())
        assert u is not None and u.dtype == np.float32
        assert np.array_equal(u, (v / float(np.linalg.norm(v))).astype(np.float32))
    for nothing in (b"", vec(0, 0), vec(float("inf"), 1), vec(float("nan"), 1)):
        assert unit(nothing) is None


def test_the_spread_is_numpys_mean_and_std_bit_for_bit() -> None:
    # Computed in fewer passes than numpy's mean() and std() take, it must not move a z-score.
    rng = np.random.default_rng(7)
    for size in (1, 2, 49, 50, 1000, 10_007):
        cosines = np.round(rng.normal(0.05, 0.08, size).astype(np.float32), 6)
        assert spread_of(cosines) == Spread(float(cosines.mean()), float(cosines.std()), size)


def test_over_many_rows_the_nearest_are_the_best_visible_ones_with_every_tie_at_the_cut() -> None:
    # The plain definition, row by row: visible, at or above the floor, the limit-th best
    # cosine as the cut, ties at the cut kept and then ordered by id.
    rng = np.random.default_rng(11)
    rows = 3000
    vectors = rng.normal(size=(rows, 16)).astype(np.float32)
    vectors[rng.integers(0, rows, 600)] = vectors[0]  # many equal cosines
    ids = [f"i{n:05d}" for n in rng.permutation(rows)]
    groups = [f"g{n % 7}" for n in range(rows)]
    m = matrix(*((ids[n], groups[n], None, tuple(float(x) for x in vectors[n])) for n in range(rows)))
    query = unit(vectors[0])
    assert query is not None
    cosines = [round(float(c), 6) for c in np.round(m.vectors @ query, 6)]  # the product is not what is tested
    for where, visible in [(RowFilter(), lambda g: True), (RowFilter(exclude="g3"), lambda g: g != "g3"),
                           (RowFilter(conversation="g5"), lambda g: g == "g5")]:
        for floor, limit in [(-1.0, 1), (-1.0, 40), (0.2, 40), (0.99, 500), (-1.0, 5000)]:
            seen = [(cosines[n], ids[n]) for n in range(rows) if visible(groups[n])]
            eligible = sorted(((c, i) for c, i in seen if c >= floor), key=lambda r: (-r[0], r[1]))
            expected = [(i, c) for c, i in eligible[:limit]]
            found, spread = m.nearest(query, where, floor, limit)
            assert found == expected, (where, floor, limit)
            assert spread.rows == len(seen)


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
    assert matrix.nearest(target, RowFilter(), -1.0, 1)[0] == [(matrix.ids[3 + 117], pytest.approx(1.0, abs=1e-5))]


def test_fuse_orders_by_normalised_bm25_plus_weighted_closeness_and_admits_only_close_vector_hits() -> None:
    lexical = [Found("l1", 9.0, parts={"bm25": 9.0}), Found("both", 8.0, parts={"bm25": 8.0})]
    cosines = {"both": 0.5, "v1": 0.45, "twin": 0.44, "far": 0.16, "l1": 0.1}
    alone = [("v1", 0.45), ("twin", 0.44), ("far", 0.16)]
    text = {"l1": "one", "both": "two", "v1": "three", "far": "four", "twin": "ONE "}.__getitem__
    settings = EmbeddingsSettings(vector_weight=0.3, min_cosine=0.1)
    # z: both 4.0, v1 3.5, twin 3.4, far 0.6, l1 0.0
    calibration = Calibration(Spread(mean=0.1, std=0.1, rows=100), best=0.5, min_cosine=0.1)
    fused = fuse(lexical, cosines, alone, calibration, settings, key=lambda i: i, text=text)
    # both: 8/9 + 0.3 x 1.0 = 1.19 above l1's 1.0; v1 close (z >= MIN_Z): 0.3 x 3.5/4; far stays out;
    # twin says l1's words: dropped.
    assert [f.item for f in fused] == ["both", "l1", "v1"]
    assert fused[0].parts["cosine"] == 0.5 and fused[0].parts["z"] == 4.0 and fused[0].parts["bm25"] == 8.0
    # v1 stands 3.5 deviations out: below FULL_Z it only fills what the lexical hits leave.
    assert fused[2].reason == VECTOR_REASON and fused[2].parts == {"cosine": 0.45, "z": 3.5, "filler": True,
                                                                    "fused": round(0.3 * 3.5 / 4.0, 6)}
    assert "cosine" not in fused[1].parts
    # Nothing close: no vector-only hit, the lexical order stands.
    flat = fuse(lexical, {"v1": 0.12}, [("v1", 0.12)], calibration, settings, key=lambda i: i, text=text)
    assert [f.item for f in flat] == ["l1", "both"]
    # A new user (too few rows for a spread): a vector hit is close at a cosine of 0.3.
    few = Calibration(Spread(0.1, 0.1, rows=10), best=0.35, min_cosine=0.1)
    alone_few = [("v1", 0.35), ("far", 0.2)]
    found_few = fuse([], dict(alone_few), alone_few, few, settings, key=lambda i: i, text=text)
    assert [f.item for f in found_few] == ["v1"]
    assert found_few[0].parts == {"cosine": 0.35, "fused": 0.0, "filler": True}  # it only fills a free slot


# --- VectorIndex over a real SQLite store ----------------------------------------------


def test_the_cache_sees_every_vector_another_process_committed_before_the_search(tmp_path: Path) -> None:
    async def body() -> None:
        store = SQLiteStore(str(tmp_path / "m.db"))
        other = SQLiteStore(str(tmp_path / "m.db"))  # another process's store on the same file
        await store.open()
        await other.open()
        try:
            alice = Scope("alice")
            for n in range(3):
                await store.apply([StartTurn(alice, f"t{n}", f"c{n}", f"h{n}", T0, f"words {n}"),
                                   FinishTurn(alice, f"t{n}", f"c{n}", f"answer {n}", T0 + timedelta(seconds=1))])
            first, second, third = (await store.unembedded("m", "message"))[:3]
            await store.save_embeddings("m", [NewEmbedding("alice", "message", first.item_id, first.text, vec(1, 0))])
            index = VectorIndex(store, "m")
            where = RowFilter()

            async def search() -> list[tuple[str, float]]:
                marks = await index.marks(alice)
                return (await index.nearest(alice, "message", q(1, 0), where, mark=marks.get("message"),
                                            floor=0.5, limit=5))[0]

            assert await search() == [(first.item_id, 1.0)]
            await other.save_embeddings("m", [NewEmbedding("alice", "message", second.item_id, second.text,
                                                           vec(1, 0))])
            assert len(await search()) == 2  # at once: no time to live
            # Each search reads only the rows saved after those it holds.
            await other.save_embeddings("m", [NewEmbedding("alice", "message", third.item_id, third.text, vec(1, 0))])
            assert len(await search()) == 3
            assert (await index.nearest(Scope("bob"), "message", q(1, 0), where, mark=None, floor=0.5,
                                        limit=5))[0] == []
            index.forget("alice")
            assert ("alice", "message") not in index._entries
        finally:
            await other.close()
            await store.close()

    asyncio.run(body())


def test_the_cache_sees_vectors_saved_after_another_process_deleted_the_newest_ones(tmp_path: Path) -> None:
    """Once the newest vectors are deleted (their conversations, on another process), the next
    ones must still be numbered above the mark a cached matrix was read to. Numbered again from
    below it, one saved alone was taken for older than the cache; and of several saved at once,
    those at or below the cache's mark were skipped by the read of the rows past it."""
    async def body() -> None:
        reader = SQLiteStore(str(tmp_path / "m.db"))
        writer = SQLiteStore(str(tmp_path / "m.db"))  # another process on the same file
        await reader.open()
        await writer.open()
        try:
            alice = Scope("alice")
            for n in range(7):
                await writer.apply([StartTurn(alice, f"t{n}", f"c{n}", f"h{n}", T0 + timedelta(minutes=n),
                                              f"words {n}")])
            items = await writer.unembedded("m", "message")
            assert [item.group for item in items] == [f"c{n}" for n in range(7)]

            async def save(*saved: Unembedded, vector: bytes = vec(0, 1)) -> None:
                await writer.save_embeddings("m", [NewEmbedding("alice", "message", item.item_id, item.text, vector)
                                                   for item in saved])

            index = VectorIndex(reader, "m")

            async def search() -> list[str]:
                mark = (await index.marks(alice)).get("message")
                found = await index.nearest(alice, "message", q(0, 1), RowFilter(), mark=mark, floor=0.5, limit=9)
                return sorted(item for item, _ in found[0])

            await save(*items[:3], vector=vec(1, 0))
            assert await search() == []  # alice's matrix is cached, to the third vector
            for conversation in ("c1", "c2"):  # the two newest vectors go with their conversations
                assert await writer.delete_item(alice, "conversation", conversation) is not None
            await save(items[3])
            assert await search() == [items[3].item_id]
            assert await writer.delete_item(alice, "conversation", "c3") is not None
            await save(*items[4:])
            # The matrix keeps a deleted row (a hit is read back through the store, which drops it).
            assert await search() == sorted(item.item_id for item in items[3:])
        finally:
            await writer.close()
            await reader.close()

    asyncio.run(body())


def test_a_search_arriving_as_a_load_of_an_older_mark_ends_loads_its_own(tmp_path: Path) -> None:
    # A load finishes (for the mark of the request that began it) and stays listed until its done
    # callback runs, on the event loop's next pass. A request with a newer mark that comes in
    # between, as one under load does, found that finished load, awaited it (which does not
    # yield), found the cache still behind its mark, and went round again: the event loop never
    # got its next pass, and the process spun at 100% CPU, deaf to every request and to SIGTERM.
    # The state between the two passes is set up here as the loop leaves it.
    store_path = str(tmp_path / "m.db")
    found: list[list[tuple[str, float]]] = []

    async def body() -> None:
        store = SQLiteStore(store_path)
        await store.open()
        try:
            alice = Scope("alice")
            for n in range(2):
                await store.apply([StartTurn(alice, f"t{n}", f"c{n}", f"h{n}", T0, f"words {n}")])
            first, second = (await store.unembedded("m", "message"))[:2]
            await store.save_embeddings("m", [NewEmbedding("alice", "message", first.item_id, first.text, vec(1, 0))])
            index = VectorIndex(store, "m")

            async def search() -> list[tuple[str, float]]:
                mark = (await index.marks(alice))["message"]
                return (await index.nearest(alice, "message", q(1, 0), RowFilter(), mark=mark, floor=0.5,
                                            limit=5))[0]

            found.append(await search())
            finished = asyncio.get_running_loop().create_future()
            finished.set_result(index._entries["alice", "message"].matrix)
            index._loads["alice", "message"] = finished  # type: ignore[assignment]  # its callback not run yet
            await store.save_embeddings("m", [NewEmbedding("alice", "message", second.item_id, second.text,
                                                           vec(1, 0))])
            found.append(await search())
        finally:
            await store.close()

    searching = threading.Thread(target=asyncio.run, args=(body(),), daemon=True)
    searching.start()
    searching.join(timeout=20)
    assert not searching.is_alive(), "the search spun on the finished load"
    assert [len(each) for each in found] == [1, 2]


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
            index = VectorIndex(store, "m", max_bytes=2 * one_matrix + 100)
            query, where = q(*([1.0] * 100)), RowFilter()
            for user in users[:2]:
                assert len((await index.nearest(user, "message", query, where, mark=(await index.marks(user))["message"], floor=0.5, limit=20))[0]) == 10
            assert list(index._entries) == [("ann", "message"), ("ben", "message")]
            (await index.nearest(users[0], "message", query, where, mark=(await index.marks(users[0]))["message"], floor=0.5, limit=20))[0]  # ann used last
            assert len((await index.nearest(users[2], "message", query, where, mark=(await index.marks(users[2]))["message"], floor=0.5, limit=20))[0]) == 10
            assert list(index._entries) == [("ann", "message"), ("cid", "message")]  # ben, least recent, left
            # One matrix past the bound on its own stays: the request using it needs it.
            index.max_bytes = one_matrix // 2
            index._trim()
            assert list(index._entries) == [("cid", "message")]
            assert len((await index.nearest(users[1], "message", query, where, mark=(await index.marks(users[1]))["message"], floor=0.5, limit=20))[0]) == 10
            assert list(index._entries) == [("ben", "message")]
        finally:
            await store.close()

    asyncio.run(body())


def test_a_recall_whose_vectors_are_current_searches_them_without_a_task_or_deadline_of_their_own(
        tmp_path: Path) -> None:
    said = ["My dog is called Rex.", "I keep bees on the roof.", "The staging host runs nginx."]
    blocks: list[str] = []
    vector_tasks: list[int] = []

    async def body() -> None:
        store = SQLiteStore(str(tmp_path / "m.db"))
        await store.open()
        try:
            alice = Scope("alice")
            for n, text in enumerate(said):
                await store.apply([StartTurn(alice, f"t{n}", f"c{n}", f"h{n}", T0, text),
                                   FinishTurn(alice, f"t{n}", f"c{n}", f"Noted {n}.", T0 + timedelta(seconds=1))])
            model = LocalModel()
            await Filler(store, model, model.model, batch=64, timeout_s=1.0).fill_all()
            metrics = Metrics()
            vectors = Vectors(model, VectorIndex(store, model.model), EmbeddingsSettings(), metrics)
            retrieval = Retrieval(store, MemorySettings(retrieval_timeout_ms=5000), metrics, vectors)
            loop = asyncio.get_running_loop()
            started: list[str] = []

            def task_factory(loop: asyncio.AbstractEventLoop, coro: Any, **options: Any) -> asyncio.Task[Any]:
                started.append(coro.__qualname__)
                return asyncio.Task(coro, loop=loop, **options)

            loop.set_task_factory(task_factory)
            for _ in range(2):  # the first loads the user's matrices; the second finds them current
                started.clear()
                query = Query("what is the name of my pet", "c9", (), 6)
                blocks.append((await retrieval.retrieve(alice, query)).block)
                vector_tasks.append(started.count("VectorQuery.nearest"))
        finally:
            await store.close()

    asyncio.run(body())
    assert "My dog is called Rex." in blocks[0] and blocks[1] == blocks[0]
    assert vector_tasks[0] > 0 and vector_tasks[1] == 0


def test_nearest_now_answers_as_nearest_does_only_when_nothing_is_to_be_loaded(tmp_path: Path) -> None:
    async def body() -> None:
        store = SQLiteStore(str(tmp_path / "m.db"))
        await store.open()
        try:
            alice = Scope("alice")
            await store.apply([StartTurn(alice, f"t{n}", "c", f"h{n}", T0, f"words {n}") for n in range(2)])
            first, second = await store.unembedded("m", "message")
            await store.save_embeddings("m", [NewEmbedding("alice", "message", first.item_id, first.text, vec(1, 0))])
            index, where = VectorIndex(store, "m"), RowFilter()
            mark = (await index.marks(alice))["message"]
            assert index.nearest_now(alice, "message", q(1, 0), where, mark=mark, floor=0.5, limit=5) is None
            loaded = await index.nearest(alice, "message", q(1, 0), where, mark=mark, floor=0.5, limit=5)
            assert index.nearest_now(alice, "message", q(1, 0), where, mark=mark, floor=0.5, limit=5) == loaded
            assert index.nearest_now(alice, "message", q(1, 0), where, mark=None, floor=0.5, limit=5) == ([], Spread())
            await store.save_embeddings("m", [NewEmbedding("alice", "message", second.item_id, second.text,
                                                           vec(1, 0))])
            newer = (await index.marks(alice))["message"]
            assert index.nearest_now(alice, "message", q(1, 0), where, mark=newer, floor=0.5, limit=5) is None
            assert index.nearest_now(alice, "message", q(1, 0), where, mark=mark, floor=0.5, limit=5) == loaded
        finally:
            await store.close()

    asyncio.run(body())
