"""The in-memory postings answer exactly as FTS5 does, stay current, and forget.

Two stores open the same SQLite file: one searches FTS5 only (`search_cache_mb=0`), the
other its users' in-memory postings once built. Every search must return the same
messages and entities with the same scores, bit for bit, after new rows, corrections and
deletions (by the memory API, by another connection, by a cascade), in every search mode
the sources use.
"""

from __future__ import annotations

import asyncio
import gc
import random
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager, closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from proxy.models import Scope
from proxy.settings import ConfigError, load_settings
from proxy.stores.base import FinishTurn, StartTurn, StoreMemory, WriteOp
from proxy.stores.sqlite.store import READERS, SQLiteStore
from proxy.stores.sqlite.postings import (
    BURST_S,
    FAST_TERM,
    REST_S,
    UserPostings,
    _Growing,
    _Keyed,
    fts_tokens,
    paced,
)
from proxy.stores.search_budget import SMALL_INDEX_ROWS
from proxy.terms import index_text, query_terms

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
ALICE = Scope("alice")
WORDS = """budget garden deploy invoice holiday dentist marathon recipe database lease guitar mortgage
    podcast wedding laptop vaccine thesis kayak migration bakery insurance passport conference printer
    review fix book cancel schedule finish discuss move test renew submit compare order plan deadline
    Alice Priya Mateo Lisbon Oslo Kyoto Acme Globex meeting notes weekend tomorrow Monday""".split()  # noqa: SIM905
ODD = ["Zoë's café in Tromsø", "Привет, мир: встреча в пятницу", "我住在北京", "naïve façade résumé",
       "internal-hbr-2291.example", "INTERNAL_HBR_7", "getUserById", "/srv/app/config.yaml"]


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(3, 12))]
    if rng.random() < 0.1:
        words.insert(rng.randrange(len(words)), rng.choice(ODD))
    return " ".join(words) + "."


def turns(scope: Scope, count: int, rng: random.Random, *, first: int = 0, conversations: int = 30) -> list[WriteOp]:
    """`count` turns (a question and its answer each) spread over conversations."""
    ops: list[WriteOp] = []
    for n in range(first, first + count):
        conv = f"{scope.user}-c{rng.randrange(conversations)}"
        at = T0 + timedelta(minutes=n)
        key = f"{scope.user}-{scope.agent}-t{n}"
        ops.append(StartTurn(scope, key, conv, f"h-{key}", at, sentence(rng)))
        ops.append(FinishTurn(scope, key, conv, sentence(rng), at + timedelta(seconds=20)))
    return ops


def queries(rng: random.Random, count: int) -> list[tuple[str, ...]]:
    out = []
    for _ in range(count):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5)))
        if rng.random() < 0.2:
            text += " " + rng.choice(ODD)
        out.append(tuple(query_terms(text)))
    return out


def memories(scope: Scope, count: int, rng: random.Random) -> list[WriteOp]:
    """`count` explicit memories: each an entity of the user."""
    return [StoreMemory(scope, f"{scope.user}-{scope.agent}-m{n}", sentence(rng), "fact", T0 + timedelta(seconds=n))
            for n in range(count)]


async def fill(path: Path) -> None:
    rng = random.Random(7)
    store = SQLiteStore(str(path), search_cache_mb=0)
    await store.open()
    try:
        ops = turns(ALICE, 700, rng) + turns(Scope("alice", agent="a1"), 150, rng, first=700)
        ops += turns(Scope("bob"), 300, rng) + turns(Scope("carol", agent="a2"), 100, rng)
        ops += memories(ALICE, 900, rng) + memories(Scope("alice", agent="a1"), 100, rng)
        ops += memories(Scope("bob"), 300, rng) + memories(Scope("carol", agent="a2"), 60, rng)
        for n in range(0, len(ops), 500):
            await store.apply(ops[n:n + 500])
    finally:
        await store.close()


async def built(store: SQLiteStore, scope: Scope, timeout: float = 30.0) -> None:
    """Search until the user's postings are built (the first search asks for them)."""
    deadline = time.monotonic() + timeout
    while not (store.message_indexes.holds(scope.user) and store.entity_indexes.holds(scope.user)):
        await store.search_messages(scope, ("plan",), limit=4)
        await store.search_entities(scope, ("plan",), limit=4)
        assert time.monotonic() < deadline, "the postings were never built"
        await asyncio.sleep(0.02)


Searched = list[tuple[str, float]]


@asynccontextmanager
async def fts_and_postings(path: Path) -> AsyncIterator[tuple[SQLiteStore, SQLiteStore]]:
    """Two stores on one file: one searching FTS5 only, one its users' postings once built."""
    fts, mem = SQLiteStore(str(path), search_cache_mb=0), SQLiteStore(str(path))
    await fts.open()
    await mem.open()
    try:
        yield fts, mem
    finally:
        await fts.close()
        await mem.close()


async def search_both(fts: SQLiteStore, mem: SQLiteStore, scope: Scope, terms: tuple[str, ...],
                      **where: Any) -> tuple[Searched, Searched]:
    a = await fts.search_messages(scope, terms, limit=16, **where)
    b = await mem.search_messages(scope, terms, limit=16, **where)
    return [(m.id, s) for m, s in a], [(m.id, s) for m, s in b]


async def entities_both(fts: SQLiteStore, mem: SQLiteStore, scope: Scope, terms: tuple[str, ...]
                        ) -> tuple[Searched, Searched]:
    a = await fts.search_entities(scope, terms, limit=16)
    b = await mem.search_entities(scope, terms, limit=16)
    return [(e.id, s) for e, s in a], [(e.id, s) for e, s in b]


def modes(scope: Scope, rng: random.Random) -> list[dict[str, Any]]:
    conv = f"{scope.user}-c{rng.randrange(30)}"
    return [{}, {"exclude_conversation_id": conv}, {"conversation_ids": [conv]},
            {"conversation_ids": [conv, f"{scope.user}-c{rng.randrange(30)}", "nowhere"]}]


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("message-index") / "memory.db"
    run(fill(path))
    return path


def copy_of(filled: Path, tmp_path: Path) -> Path:
    path = tmp_path / "memory.db"
    with closing(sqlite3.connect(filled)) as source, closing(sqlite3.connect(path)) as target:
        source.backup(target)
    return path


def test_every_search_mode_answers_as_fts5_does_to_the_bit(filled: Path, tmp_path: Path) -> None:
    path = copy_of(filled, tmp_path)
    scopes = [ALICE, Scope("alice", agent="a1", agent_isolated=True), Scope("bob"),
              Scope("carol", agent="a2", agent_isolated=True), Scope("carol", agent="a1", agent_isolated=True)]

    async def body() -> tuple[int, int, int, int, int]:
        async with fts_and_postings(path) as (fts, mem):
            for scope in scopes:
                await built(mem, scope)
            rng = random.Random(11)
            compared = found = entities_found = 0
            for terms in queries(rng, 150):
                for scope in scopes:
                    for where in modes(scope, rng):
                        expected, got = await search_both(fts, mem, scope, terms, **where)
                        assert got == expected, (scope, terms, where)
                        compared += 1
                        found += bool(got)
                    expected, got = await entities_both(fts, mem, scope, terms)
                    assert got == expected, (scope, terms)
                    entities_found += bool(got)
            return compared, found, entities_found, mem.message_indexes.searches, mem.entity_indexes.searches

    compared, found, entities_found, served, entities_served = run(body())
    assert compared == 150 * 5 * 4
    assert found > compared // 2  # most searches find something: the comparison is not of empty lists
    assert entities_found > 150 * 5 // 3  # (one scope, carol as agent a1, holds no entity)
    # and the postings answered them (a term FTS5 splits, or a term nobody says, goes to FTS5)
    assert served > compared * 3 // 4
    assert entities_served > 150 * 5 * 3 // 4


def test_a_small_entity_index_searched_in_one_pass_answers_as_the_postings_do(tmp_path: Path) -> None:
    # A user's index of at most SMALL_INDEX_ROWS rows is searched whole, every row saying a
    # term scored (sqlite.search._search); the fixture's alice is past that size.
    path = tmp_path / "small.db"
    rng = random.Random(3)
    scopes = [ALICE, Scope("alice", agent="a1", agent_isolated=True), Scope("bob")]

    async def body() -> tuple[int, int]:
        store = SQLiteStore(str(path), search_cache_mb=0)
        await store.open()
        try:
            await store.apply(memories(ALICE, 300, rng) + memories(Scope("alice", agent="a1"), 60, rng)
                              + memories(Scope("bob"), 100, rng))
        finally:
            await store.close()
        async with fts_and_postings(path) as (fts, mem):
            for scope in scopes:
                await built(mem, scope)
            found = 0
            for terms in queries(rng, 150):
                for scope in scopes:
                    expected, got = await entities_both(fts, mem, scope, terms)
                    assert got == expected, (scope, terms)
                    found += bool(got)
            return found, mem.entity_indexes.searches

    found, served = run(body())
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT count(*) FROM entities").fetchone()[0] == 460 <= SMALL_INDEX_ROWS
    assert found > 150 * 3 // 2
    assert served > 150 * 3 * 3 // 4


def test_new_messages_are_found_at_once_and_deleted_ones_never(filled: Path, tmp_path: Path) -> None:
    path = copy_of(filled, tmp_path)

    async def body() -> None:
        async with fts_and_postings(path) as (fts, mem):
            await built(mem, ALICE)
            builds = mem.message_indexes.builds
            # Written by the FTS-only store: another writer than the index's own process would be.
            await fts.apply([StartTurn(ALICE, "fresh", "alice-c1", "h-fresh", T0 + timedelta(days=9),
                                       "the zeppelin budget review"),
                             FinishTurn(ALICE, "fresh", "alice-c1", "zeppelin tickets booked",
                                        T0 + timedelta(days=9, seconds=5))])
            expected, got = await search_both(fts, mem, ALICE, ("zeppelin", "budget"))
            assert got == expected
            found = await mem.search_messages(ALICE, ("zeppelin",), limit=4)
            assert sorted(m.content for m, _ in found) == ["the zeppelin budget review", "zeppelin tickets booked"]
            assert mem.message_indexes.builds == builds  # caught up, not rebuilt

            gone = found[0][0]
            assert await mem.delete_item(ALICE, "message", gone.id) is not None
            assert [m.content for m, _ in await mem.search_messages(ALICE, ("zeppelin",), limit=4)] == [
                found[1][0].content]
            await built(mem, ALICE)  # rebuilt after the deletion
            assert mem.message_indexes.builds == builds + 1

            # A deletion by another connection, through the conversation's cascade.
            with closing(sqlite3.connect(path)) as db, db:
                db.execute("PRAGMA foreign_keys = ON")
                db.execute("DELETE FROM conversations WHERE user_id = 'alice' AND id = 'alice-c1'")
            assert await mem.search_messages(ALICE, ("zeppelin",), limit=4) == []
            for terms in queries(random.Random(5), 40):
                expected, got = await search_both(fts, mem, ALICE, terms)
                assert got == expected
                assert "alice-c1" not in {m.conversation_id for m, _ in
                                          await mem.search_messages(ALICE, terms, limit=16)}

    run(body())


@asynccontextmanager
async def readers_busy(store: SQLiteStore) -> AsyncIterator[None]:
    """Every reader thread of `store` inside a read until the block ends."""
    release = threading.Event()
    busy = [asyncio.ensure_future(store._readers.run(lambda conn: release.wait(10)))  # type: ignore[union-attr]
            for _ in range(READERS)]
    try:
        await asyncio.sleep(0.1)
        yield
    finally:
        release.set()
        await asyncio.gather(*busy)


def test_a_search_the_postings_answer_waits_for_no_reader_thread(filled: Path, tmp_path: Path) -> None:
    """Postings are Python holding the GIL: a search they answer runs on the event loop, and
    answers while every reader thread is busy (a hand-off each way cost more than the search
    under load). A search FTS5 must answer (a user whose postings are not built) is SQLite
    releasing the GIL, on a reader thread: it waits for one."""
    path = copy_of(filled, tmp_path)

    async def body() -> None:
        async with fts_and_postings(path) as (fts, mem):
            await built(mem, ALICE)
            terms = ("budget", "plan", "lisbon")
            expected_messages = await fts.search_messages(ALICE, terms, limit=16)
            expected_entities = await fts.search_entities(ALICE, terms, limit=16)
            expected_bob = await fts.search_messages(Scope("bob"), terms, limit=16)
            async with readers_busy(mem):
                async with asyncio.timeout(5):
                    assert await mem.search_messages(ALICE, terms, limit=16) == expected_messages
                    assert await mem.search_entities(ALICE, terms, limit=16) == expected_entities
                    assert await mem.relationships(ALICE, "alice-None-m1", limit=5) == []
                bob = asyncio.ensure_future(mem.search_messages(Scope("bob"), terms, limit=16))
                done, _ = await asyncio.wait({bob}, timeout=0.3)
                assert not done  # bob's postings are not built: FTS5 answers, on a reader thread
            assert await bob == expected_bob
            assert expected_messages and expected_entities and expected_bob

    run(body())


def test_postings_far_behind_their_snapshot_catch_up_on_a_reader_thread(filled: Path, tmp_path: Path) -> None:
    """A catch-up walks every row committed since the user's last search, whoever wrote it: past
    a few hundred, the search leaves the event loop to a reader thread (it waits for one), and
    answers as FTS5 does; caught up, the next search is back on the loop."""
    path = copy_of(filled, tmp_path)

    async def body() -> None:
        async with fts_and_postings(path) as (fts, mem):
            await built(mem, ALICE)
            rng = random.Random(3)
            await fts.apply(turns(Scope("dave"), 200, rng) + memories(Scope("dave"), 300, rng))
            terms = ("budget", "plan", "lisbon")
            expected_messages = await fts.search_messages(ALICE, terms, limit=16)
            expected_entities = await fts.search_entities(ALICE, terms, limit=16)
            async with readers_busy(mem):
                messages = asyncio.ensure_future(mem.search_messages(ALICE, terms, limit=16))
                entities = asyncio.ensure_future(mem.search_entities(ALICE, terms, limit=16))
                done, _ = await asyncio.wait({messages, entities}, timeout=0.3)
                assert not done  # 400 rowids and 300 changed entities behind: not on the loop
            assert await messages == expected_messages
            assert await entities == expected_entities
            async with readers_busy(mem):
                async with asyncio.timeout(5):  # caught up: on the loop again
                    assert await mem.search_messages(ALICE, terms, limit=16) == expected_messages
                    assert await mem.search_entities(ALICE, terms, limit=16) == expected_entities
            assert mem.message_indexes.holds("alice") and mem.entity_indexes.holds("alice")

    run(body())


def test_the_event_loop_never_waits_for_postings_a_thread_holds(filled: Path, tmp_path: Path) -> None:
    """A reader thread holds a user's postings while it catches them up or searches them; a
    search of that user on the event loop then goes to a thread too, and the loop runs on."""
    path = copy_of(filled, tmp_path)

    async def body() -> None:
        async with fts_and_postings(path) as (fts, mem):
            await built(mem, ALICE)
            terms = ("budget", "plan")
            expected = await fts.search_messages(ALICE, terms, limit=16)
            lock = mem.message_indexes._users["alice"].lock  # what a thread's catch-up holds
            taken, release = threading.Event(), threading.Event()

            def hold() -> None:
                with lock:
                    taken.set()
                    release.wait(10)

            holder = threading.Thread(target=hold)
            holder.start()
            taken.wait(5)
            try:
                search = asyncio.ensure_future(mem.search_messages(ALICE, terms, limit=16))
                done, _ = await asyncio.wait({search}, timeout=0.3)  # returns: the loop is not held
                assert not done  # the search waits on a reader thread
            finally:
                release.set()
                holder.join()
            assert await search == expected

    run(body())


def test_a_message_kept_from_an_earlier_search_is_returned_as_it_now_reads(filled: Path, tmp_path: Path) -> None:
    # The postings keep the messages their searches returned; a message changed by hand in
    # any column (not only the indexed ones) moves `search_epoch` (schema v7), so the next
    # search answers from the table as it now reads, never from what was kept.
    path = copy_of(filled, tmp_path)

    async def body() -> None:
        async with fts_and_postings(path) as (fts, mem):
            await built(mem, ALICE)
            terms = ("budget", "garden", "lease")
            first = await mem.search_messages(ALICE, terms, limit=16)
            assert len(first) == 16
            assert await mem.search_messages(ALICE, terms, limit=16) == first
            target = first[3][0]
            with closing(sqlite3.connect(path)) as db, db:
                db.execute("UPDATE messages SET content = 'rewritten by hand', role = 'user' WHERE id = ?",
                           (target.id,))
            after = {m.id: m for m, _ in await mem.search_messages(ALICE, terms, limit=16)}
            assert (after[target.id].content, after[target.id].role) == ("rewritten by hand", "user")
            expected, got = await search_both(fts, mem, ALICE, terms)
            assert got == expected

    run(body())


def test_entities_added_corrected_and_deleted_are_searched_as_they_now_read(filled: Path, tmp_path: Path) -> None:
    path = copy_of(filled, tmp_path)

    async def body() -> None:
        async with fts_and_postings(path) as (fts, mem):
            await built(mem, ALICE)
            builds = mem.entity_indexes.builds
            rng = random.Random(3)
            asked = queries(rng, 30)
            for terms in asked:
                expected, got = await entities_both(fts, mem, ALICE, terms)
                assert got == expected

            # Added by another writer (the FTS-only store), corrected through the API, deleted by SQL.
            await fts.apply([StoreMemory(ALICE, "zep", "the zeppelin hangar lease", "fact", T0 + timedelta(days=3))])
            assert [e.id for e, _ in await mem.search_entities(ALICE, ("zeppelin",))] == ["zep"]
            assert await mem.update_memory(ALICE, "zep", "the airship hangar lease") is not None
            assert await mem.search_entities(ALICE, ("zeppelin",)) == []
            assert [e.id for e, _ in await mem.search_entities(ALICE, ("airship",))] == ["zep"]
            with closing(sqlite3.connect(path)) as db, db:
                db.execute("DELETE FROM entities WHERE user_id = 'alice' AND id = 'zep'")
            assert await mem.search_entities(ALICE, ("airship",)) == []
            await fts.apply(memories(Scope("alice", agent="new"), 40, rng))
            for terms in asked:
                expected, got = await entities_both(fts, mem, ALICE, terms)
                assert got == expected
            assert mem.entity_indexes.builds == builds  # caught up each time, never rebuilt

            # A change log trimmed past what the postings have read: they are built again.
            with closing(sqlite3.connect(path)) as db, db:
                db.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 70000)"
                           " INSERT INTO entity_changes (entity_seq) SELECT 0 FROM n")
                assert db.execute("SELECT count(*) FROM entity_changes").fetchone()[0] < 70000
            for terms in asked:
                expected, got = await entities_both(fts, mem, ALICE, terms)
                assert got == expected
            await built(mem, ALICE)
            assert mem.entity_indexes.builds == builds + 1

    run(body())


def test_a_deleted_user_s_postings_are_dropped(filled: Path, tmp_path: Path) -> None:
    path = copy_of(filled, tmp_path)
    bob = Scope("bob")

    async def body() -> tuple[bool, bool, list[Any], list[Any]]:
        store = SQLiteStore(str(path))
        await store.open()
        try:
            await built(store, bob)
            held = store.message_indexes.holds("bob") and store.entity_indexes.holds("bob")
            await store.delete_user(bob)
            return (held, store.message_indexes.holds("bob") or store.entity_indexes.holds("bob"),
                    await store.search_messages(bob, ("plan",)), await store.search_entities(bob, ("plan",)))
        finally:
            await store.close()

    assert run(body()) == (True, False, [], [])


def test_an_index_larger_than_the_cache_is_not_kept_and_fts5_answers(filled: Path, tmp_path: Path) -> None:
    path = copy_of(filled, tmp_path)

    async def body() -> tuple[bool, Searched, Searched]:
        store = SQLiteStore(str(path))
        store.message_indexes.max_bytes = 10_000  # alice's index takes far more
        fts = SQLiteStore(str(path), search_cache_mb=0)
        await store.open()
        await fts.open()
        try:
            await store.search_messages(ALICE, ("plan",))
            for _ in range(200):  # the build runs, and is refused
                if store.message_indexes.builds:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.05)
            expected, got = await search_both(fts, store, ALICE, ("budget", "lisbon"))
            return store.message_indexes.holds("alice"), expected, got
        finally:
            await store.close()
            await fts.close()

    held, expected, got = run(body())
    assert not held
    assert got == expected and got


def test_the_least_recently_searched_user_is_dropped_to_make_room(filled: Path, tmp_path: Path) -> None:
    path = copy_of(filled, tmp_path)
    bob = Scope("bob")

    async def body() -> list[tuple[bool, bool]]:
        async with fts_and_postings(path) as (fts, mem):
            cache = mem.message_indexes
            await built(mem, bob)
            bob_bytes = cache.nbytes
            await built(mem, ALICE)
            alice_bytes = cache.nbytes - bob_bytes
            held = [(cache.holds("alice"), cache.holds("bob"))]
            cache.max_bytes = alice_bytes + bob_bytes // 2  # room for alice's postings, not for both
            await fts.apply(turns(ALICE, 3, random.Random(1), first=20_000))  # alice's grow: room is made
            await mem.search_messages(ALICE, ("plan",))
            held.append((cache.holds("alice"), cache.holds("bob")))
            for terms in queries(random.Random(17), 20):  # bob's searches go to FTS5 now: the same answers
                expected, got = await search_both(fts, mem, bob, terms)
                assert got == expected
            return held

    assert run(body()) == [(True, True), (True, False)]


def test_a_build_rests_after_each_burst_of_work_so_requests_get_the_gil() -> None:
    # A 100,000-message build held the GIL for seconds and batched other clients' streams;
    # it now rests REST_S after every BURST_S of work (bench/retrieval.py holds the figures).
    now = [0.0]
    done: list[int] = []
    rests: list[tuple[int, float]] = []
    for number in paced(range(10), clock=lambda: now[0], rest=lambda s: rests.append((done[-1], s))):
        done.append(number)
        now[0] += 0.4 * BURST_S  # each item costs two fifths of a burst
    assert done == list(range(10))
    assert rests == [(2, REST_S), (5, REST_S), (8, REST_S)]


TEXTS = ["my therapi plan for tromso", "internal_hbr_2291_example HBR", "Crème Brûlée at Łódź", "l'été x–y a·b",
         "Ⅻ ① ٣ _x_", "ok\u200bgo x\u00a0y", "İstanbul ǅemal ĳssel ﬁsh", "Ελληνικά τόνος", "שָׁלוֹם עולם",
         "日本語テキスト", "emoji 😀 here", "Привет, мир", "a\u0301b Å"]


def test_a_growing_array_holds_every_value_appended_and_keeps_what_was_read() -> None:
    rng = random.Random(5)
    growing, expected, reads = _Growing(np.int64), [], []
    for _ in range(300):
        for _ in range(rng.choice((0, 1, 2, 7, 40))):
            expected.append(rng.randrange(-10**12, 10**12))
            growing.append(expected[-1])
        array = growing.array()
        assert array.dtype == np.int64 and array.tolist() == expected
        reads.append((array, list(expected)))
    for array, then in reads:  # an array read earlier still reads as it did
        assert array.tolist() == then
    fresh = _Growing(np.bool_)
    assert fresh.array().tolist() == []
    fresh.append(True)
    assert fresh.array().tolist() == [True]


def test_keyed_rows_read_back_exact_per_key_and_column() -> None:
    rng = random.Random(9)
    keyed, expected = _Keyed(np.int32, np.float64, np.bool_), {}
    reads = []
    for _ in range(400):
        key = f"term{rng.randrange(40)}"
        for _ in range(rng.choice((1, 1, 3, 20))):
            row = (rng.randrange(10**6), rng.random(), rng.random() < 0.5)
            keyed.append(key, *row)
            expected.setdefault(key, []).append(row)
        if rng.random() < 0.3:
            got = keyed.get(key)
            assert got is not None and [a.dtype for a in got] == [np.int32, np.float64, np.bool_]
            assert list(zip(*(a.tolist() for a in got), strict=True)) == expected[key]
            reads.append((got, list(expected[key])))
    for key, rows in expected.items():
        got = keyed.get(key)
        assert got is not None and list(zip(*(a.tolist() for a in got), strict=True)) == rows
    for got, then in reads:  # what was read earlier still reads as it did
        assert list(zip(*(a.tolist() for a in got), strict=True)) == then
    assert len(keyed) == len(expected) and keyed.get("never") is None and keyed.pending() == []


def test_a_user_s_postings_leave_the_garbage_collector_little_to_walk() -> None:
    # A full collection walks every object it tracks; the postings of 20,000 distinct terms
    # once made 140,000 of them (an object and three arrays' lists a term).
    postings = UserPostings("alice", (1.0,), finding_column=None)
    for seq in range(1, 5001):
        postings.add(seq, f"c{seq % 50}", None, (f"w{seq} x{seq} y{seq} z{seq} common",), b"\x05")
    postings.join()
    gc.collect()
    tracked = len(gc.get_objects())
    del postings
    gc.collect()
    assert tracked - len(gc.get_objects()) < 200


@pytest.mark.parametrize("text", TEXTS)
def test_the_tokens_the_postings_can_match_are_fts5_s(text: str) -> None:
    # The postings answer only queries whose every term is [a-z0-9_] (others go to FTS5), and
    # take each row's length from FTS5's docsize: so of what FTS5's tokenizer makes of a
    # stored text (proxy.terms.index_text), those tokens, in order, are what must agree.
    # (Others may not: FTS5 keeps Greek accents and folds a final sigma.)
    with closing(sqlite3.connect(":memory:")) as db:
        db.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize = \"unicode61 tokenchars '_'\")")
        db.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, instance)")
        stored = index_text(text)
        db.execute("INSERT INTO t (x) VALUES (?)", (stored,))
        fts5 = [term for (term,) in db.execute("SELECT term FROM v ORDER BY offset")]
    plain = [t for t in fts_tokens(stored) if FAST_TERM.fullmatch(t)]
    assert plain == [t for t in fts5 if FAST_TERM.fullmatch(t)]
    assert plain or not text.isascii()  # an ASCII text is not compared on nothing


def test_search_cache_mb_must_not_be_negative(tmp_path: Path) -> None:
    config = tmp_path / "memproxy.yaml"
    config.write_text("store:\n  search_cache_mb: -1\n")
    with pytest.raises(ConfigError, match="store.search_cache_mb"):
        load_settings(str(config))


def test_searches_beside_writes_stay_consistent(filled: Path, tmp_path: Path) -> None:
    # Two reader threads search the same user's postings (catching them up, each in its own
    # snapshot) while turns and memories commit: no search fails, none returns a row from
    # another user, and afterwards both engines agree again.
    path = copy_of(filled, tmp_path)

    async def body() -> int:
        async with fts_and_postings(path) as (fts, mem):
            await built(mem, ALICE)
            rng = random.Random(13)
            asked = queries(rng, 60)

            async def write() -> None:
                for n in range(20):
                    await fts.apply([*turns(ALICE, 5, rng, first=10_000 + 5 * n),
                                     *memories(Scope("alice", agent=f"w{n}"), 5, rng)])
                    await asyncio.sleep(0)

            async def search() -> int:
                seen = 0
                for terms in asked * 3:
                    messages, entities = await asyncio.gather(
                        mem.search_messages(ALICE, terms, limit=16),
                        mem.search_entities(ALICE, terms, limit=16))
                    assert all(m.conversation_id.startswith("alice-") for m, _ in messages)
                    assert all(e.id.startswith("alice-") for e, _ in entities)
                    seen += len(messages) + len(entities)
                return seen

            _, seen = await asyncio.gather(write(), search())
            for terms in asked:
                expected, got = await search_both(fts, mem, ALICE, terms)
                assert got == expected
                expected, got = await entities_both(fts, mem, ALICE, terms)
                assert got == expected
            return seen

    assert run(body()) > 0


def test_a_long_run_of_lower_case_letters_is_indexed_in_linear_time() -> None:
    # A pasted token of 64,000 letters: the camelCase check once backtracked over every start
    # (8 s at 32,000 letters, four times that at twice the length), on the event loop.
    token = "a" * 64_000
    start = time.perf_counter()
    assert index_text(token) == token[:128] and query_terms(token) == [token[:128]]  # a term's longest
    assert time.perf_counter() - start < 2.0
