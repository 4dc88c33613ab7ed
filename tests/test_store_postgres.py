"""PostgresStore beyond the shared contract: replicas on one database, locks, recovery, outages.

The contract every backend keeps is test_store_contract.py; these are the promises only
a database shared by several processes has to keep.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from proxy.app import open_store
from proxy.models import ReasoningStep, Scope
from proxy.settings import load_settings
from proxy.stores.base import FinishTurn, RecordToolCalls, SaveBlock, StartTurn, StoreError, StoreMemory, WriteOp
from proxy.stores.postgres.store import PostgresStore, _error, user_lock_key
from proxy.stores.postgres.batch import STALE_PENDING
from proxy.terms import query_terms
from proxy.stores.postgres.schema import MIGRATIONS
from tests.conftest import PG_HASH_KEY
from tests.pg_server import PostgresServer
from tests.store_backends import PostgresBackend, SQLiteBackend

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
ALICE = Scope("alice")
BOB = Scope("bob")
ROOT = Path(__file__).resolve().parent.parent


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def turn_ops(scope: Scope, key: str, text: str, *, at: datetime = T0, conv: str = "c1") -> list[WriteOp]:
    steps = (ReasoningStep("lookup", "{}", "found"),)
    return [StartTurn(scope, key, conv, f"h-{key}", at, text),
            RecordToolCalls(scope, key, ((f"call-{key}", "lookup", "{}"),), at),
            SaveBlock(scope, key, f"block of {key}", 1, {"k": key}, at),
            FinishTurn(scope, key, conv, f"answer to {text}", at + timedelta(seconds=1), text, steps)]


def test_two_stores_writing_the_same_turns_at_once_save_each_once(pg_url: str) -> None:
    """Two replicas (two pools) open together, migrate once, and race on the same writes."""
    async def body() -> None:
        one, two = PostgresStore(pg_url), PostgresStore(pg_url)
        await asyncio.gather(one.open(), two.open())
        try:
            ops = [op for i in range(30) for op in turn_ops(Scope(f"u{i % 3}"), f"t{i}", f"text {i}")]
            await asyncio.gather(*(store.apply(ops[n:n + 8]) for n in range(0, len(ops), 8) for store in (one, two)))
            backend = PostgresBackend(pg_url)
            assert await backend.sql("SELECT role, count(*) FROM messages GROUP BY role ORDER BY role") == [
                ("assistant", 30), ("user", 30)]
            assert await backend.sql("SELECT count(*), count(DISTINCT turn_key) FROM reasoning") == [(30, 30)]
            assert await backend.sql("SELECT count(*) FROM injections") == [(30,)]
            assert await backend.sql("SELECT count(*) FROM turn_tool_calls") == [(30,)]
            versions = await backend.sql("SELECT version FROM schema_version ORDER BY version")
            assert versions == [(version,) for version in range(1, len(MIGRATIONS) + 1)]
            turn = (await two.find_turn(Scope("u1"), ["call-t4"], "", T0)).turn
            assert turn is not None and (turn.key, turn.block, turn.status) == ("t4", "block of t4", "complete")
        finally:
            await asyncio.gather(one.close(), two.close())

    run(body())


def test_reading_who_owns_provider_objects_waits_for_no_writer(pg_url: str) -> None:
    """A listing's owners are read (owners_of), not written again: while another session holds the
    table against writes (a CREATE INDEX's SHARE lock, a replica migrating), the read answers and
    only a record of a new id waits."""
    async def body() -> None:
        store = PostgresStore(pg_url)
        await store.open()
        holder = await asyncpg.connect(pg_url)
        try:
            await store.record_owners("openai", "alice", [("item", "msg_seen")], T0)
            async with holder.transaction():
                await holder.execute("LOCK TABLE provider_objects IN SHARE MODE")
                assert await asyncio.wait_for(store.owners_of("openai", ["msg_seen", "msg_new"]), 5) == {
                    "msg_seen": "alice"}
                recording = asyncio.create_task(store.record_owners("openai", "alice", [("item", "msg_new")], T0))
                await asyncio.sleep(0.3)
                assert not recording.done()
            assert await asyncio.wait_for(recording, 5) == {"msg_new": "alice"}
        finally:
            await holder.close()
            await store.close()

    run(body())


def test_a_users_writes_wait_for_that_users_lock_only(pg_url: str) -> None:
    """Per-user ordering across replicas: a batch waits while another holds the user's lock."""
    async def body() -> None:
        store = PostgresStore(pg_url)
        await store.open()
        holder = await asyncpg.connect(pg_url)
        try:
            await holder.execute("SELECT pg_advisory_lock($1)", user_lock_key("alice"))
            blocked = asyncio.create_task(store.apply([StartTurn(ALICE, "t1", "c1", "h", T0, "after the lock")]))
            await store.apply([StartTurn(BOB, "t1", "c1", "h", T0, "bob goes on")])  # another user: no wait
            await asyncio.sleep(0.3)
            assert not blocked.done()
            assert [m.content for m in await store.messages(BOB, "c1")] == ["bob goes on"]
            await holder.execute("SELECT pg_advisory_unlock($1)", user_lock_key("alice"))
            await asyncio.wait_for(blocked, 5)
            assert [m.content for m in await store.messages(ALICE, "c1")] == ["after the lock"]
            # The memory API's writes take the same lock (the user's, not one per letter of the name).
            await holder.execute("SELECT pg_advisory_lock($1)", user_lock_key("alice"))
            stored = asyncio.create_task(store.store_memory(StoreMemory(ALICE, "m1", "Alice prefers tea", "fact", T0)))
            await asyncio.sleep(0.3)
            assert not stored.done()
            await holder.execute("SELECT pg_advisory_unlock($1)", user_lock_key("alice"))
            assert await asyncio.wait_for(stored, 5)
        finally:
            await holder.close()
            await store.close()

    run(body())


def test_lock_keys_are_stable_and_distinct() -> None:
    assert user_lock_key("alice") == user_lock_key("alice")
    assert len({user_lock_key(f"user{i}") for i in range(10_000)}) == 10_000
    assert all(-2**63 <= user_lock_key(u) < 2**63 for u in ("", "alice", "x" * 256))


def test_recovery_leaves_turns_other_replicas_may_be_serving(pg_url: str) -> None:
    now = datetime.now(UTC)
    stale = now - STALE_PENDING - timedelta(minutes=1)

    async def body() -> None:
        store = PostgresStore(pg_url)
        await store.open()
        await store.apply([StartTurn(ALICE, "fresh", "c1", "h1", now, "in flight elsewhere"),
                           StartTurn(ALICE, "stale", "c1", "h2", stale, "its replica died")])
        await store.close()
        await store.open()  # another replica starting
        try:
            assert (await store.turn(ALICE, "fresh")).status == "pending"  # type: ignore[union-attr]
            assert (await store.turn(ALICE, "stale")).status == "interrupted"  # type: ignore[union-attr]
        finally:
            await store.close()

    run(body())


def test_nul_characters_are_stored_as_replacement_characters(pg_url: str) -> None:
    """PostgreSQL text cannot hold NUL (valid in JSON); it is stored as U+FFFD, never refused."""
    async def body() -> None:
        store = PostgresStore(pg_url)
        await store.open()
        try:
            await store.apply([StartTurn(ALICE, "t1", "c1", "h", T0, "a\x00b"),
                               FinishTurn(ALICE, "t1", "c1", "c\x00d", T0, "a\x00b", (ReasoningStep("f\x00", "{}"),)),
                               RecordToolCalls(ALICE, "t1", (("id\x00", "n\x00", "a\x00"),), T0),
                               SaveBlock(ALICE, "t1", "blo\x00ck", 1, {"x": "\x00"})])
            assert [m.content for m in await store.messages(ALICE, "c1")] == ["a\ufffdb", "c\ufffdd"]
            assert (await store.turn(ALICE, "t1")).block == "blo\ufffdck"  # type: ignore[union-attr]
            assert (await store.reasoning(ALICE))[0].steps[0].name == "f\x00"  # JSON keeps it escaped
        finally:
            await store.close()

    run(body())


def test_scores_equal_sqlite_fts5_bm25(pg_url: str, tmp_path: Path) -> None:
    """One user's corpus in both stores: the same hits, in the same order, with the same scores."""
    texts = [f"the {w} plan for the {o} office, draft {i}" for i, (w, o) in enumerate(
        [(w, o) for w in ("budget", "deploy", "garden", "budget budget") for o in ("oslo", "lisbon", "quito")])]
    texts += ["internal-hbr-2291.example hosts the budget service", "nothing relevant here at all"]
    queries = ["budget plan", "oslo office draft", "internal-hbr-2291.example", "garden lisbon", "zebra"]

    async def results(backend: Any) -> list[list[tuple[str, float]]]:
        async with backend.opened() as store:
            await store.apply([StartTurn(ALICE, f"t{i}", f"c{i % 4}", f"h{i}", T0 + timedelta(seconds=i), text)
                               for i, text in enumerate(texts)])
            await backend.add_entity("alice", "Budget Office", "place", "where the budget plan is drafted")
            await backend.add_entity("alice", "Oslo", "city", "the budget office of the north")
            found = []
            for query in queries:
                found.append([(m.content, s) for m, s in await store.search_messages(ALICE, query_terms(query))])
                found.append([(e.name, s) for e, s in await store.search_entities(ALICE, query_terms(query))])
            return found

    sqlite, postgres = run(results(SQLiteBackend(tmp_path / "m.db"))), run(results(PostgresBackend(pg_url)))
    assert [[name for name, _ in hits] for hits in postgres] == [[name for name, _ in hits] for hits in sqlite]
    for pg_hits, lite_hits in zip(postgres, sqlite):
        assert all(math.isclose(p, s, rel_tol=1e-6) for (_, p), (_, s) in zip(pg_hits, lite_hits))
    assert sum(len(hits) for hits in postgres) == 36


def test_search_reads_the_index_not_the_users_items(pg_url: str) -> None:
    """The request path stays off full scans: postings by (user, term), then the best items by key."""
    async def body() -> str:
        store = PostgresStore(pg_url)
        await store.open()
        try:
            for user, count in (("alice", 3000), ("bob", 500)):
                ops = [StartTurn(Scope(user), f"t{i}", f"c{i % 50}", f"h{i}", T0 + timedelta(seconds=i),
                                 f"note {i} on topic{i % 97}") for i in range(count)]
                for n in range(0, count, 250):  # writer-sized batches
                    await store.apply(ops[n:n + 250])
            backend = PostgresBackend(pg_url)
            await backend.sql("ANALYZE")
            # "note" is in every message, "topic7" in 31: the rare term finds, both score.
            hits = await store.search_messages(ALICE, ["topic7", "note"], exclude_conversation_id="c7", limit=100)
            assert len(hits) == 30 and all(m.conversation_id != "c7" for m, _ in hits)
            assert len(await store.search_messages(ALICE, ["note"], exclude_conversation_id="c7", limit=100)) == 100
            sql, args = await store.message_query(ALICE, ["topic7", "note"], None, "c7", 20)
            conn = await asyncpg.connect(pg_url)
            try:
                return "\n".join(row[0] for row in await conn.fetch("EXPLAIN " + sql, *args))
            finally:
                await conn.close()
        finally:
            await store.close()

    plan = run(body())
    assert "Index" in plan, plan
    assert not [line for line in plan.splitlines() if "Seq Scan on message" in line], plan



def _plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for child in node.get("Plans", []) for n in _plan_nodes(child))]


def test_search_of_a_growing_user_reads_statistics_once_and_postings_by_term(pg_url: str) -> None:
    """Right after a user's messages grew (no ANALYZE has seen them, as between autovacuum runs),
    a search still reads the term statistics once and the postings by (user, term): planned on
    stale estimates, they were read again for every posting, and every posting of the user for
    every candidate (113 ms at 446 messages under load, against 2-4 ms)."""
    async def body() -> list[dict[str, Any]]:
        store = PostgresStore(pg_url)
        await store.open()
        try:
            ops = [StartTurn(ALICE, f"t{i}", f"c{i}", f"h{i}", T0 + timedelta(seconds=i),
                             f"request {i}: which tools do I prefer for my projects?") for i in range(400)]
            for n in range(0, len(ops), 50):
                await store.apply(ops[n:n + 50])
            sql, args = await store.message_query(ALICE, ["request", "tool", "prefer", "project"], None, "c-new", 20)
            conn = await asyncpg.connect(pg_url)
            try:
                plan = await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, *args)
            finally:
                await conn.close()
            return _plan_nodes(json.loads(plan)[0]["Plan"])
        finally:
            await store.close()

    nodes = run(body())
    stats_reads = [n for n in nodes if n.get("Relation Name") == "term_stats"]
    assert stats_reads and sum(n["Actual Loops"] for n in stats_reads) == 1, stats_reads
    postings_reads = [n for n in nodes if n.get("Relation Name") == "message_postings"]
    assert postings_reads and all("term" in n.get("Index Cond", "") for n in postings_reads), postings_reads

STATS_DRIFT = """
SELECT 'term', t.user_id, t.kind, t.term FROM (SELECT user_id, kind, term, sum(docs) AS docs, sum(finding) AS finding
    FROM term_stats GROUP BY user_id, kind, term) t FULL JOIN (
    SELECT user_id, 'message' AS kind, term, count(*) AS docs, count(*) FILTER (WHERE finds) AS finding
    FROM message_postings GROUP BY user_id, term
    UNION ALL SELECT user_id, 'entity', term, count(*), count(*) FILTER (WHERE finds) FROM entity_postings
    GROUP BY user_id, term
    UNION ALL SELECT user_id, 'reasoning', term, count(*), count(*) FILTER (WHERE finds) FROM reasoning_postings
    GROUP BY user_id, term) c ON c.user_id = t.user_id AND c.kind = t.kind AND c.term = t.term
WHERE coalesce(t.docs, 0) <> coalesce(c.docs, 0) OR coalesce(t.finding, 0) <> coalesce(c.finding, 0)
UNION ALL
SELECT 'docs', l.user_id, l.kind, '' FROM (SELECT user_id, kind, sum(docs) AS docs FROM lexicon_stats
    GROUP BY user_id, kind) l WHERE l.kind = 'message' AND l.docs <> (SELECT count(*) FROM messages m
    WHERE m.user_id = l.user_id)
"""


def test_index_statistics_follow_every_write_path(pg_url: str) -> None:
    """Inserts, edits, an FK cascade and a user delete: the counts BM25 reads stay exact."""
    async def body() -> None:
        store = PostgresStore(pg_url)
        await store.open()
        backend = PostgresBackend(pg_url)
        try:
            for user in ("alice", "bob"):
                await store.apply([op for i in range(20) for op in turn_ops(Scope(user), f"t{i}", f"hello {i % 3}",
                                                                          conv=f"c{i % 4}")])
            eid = await backend.add_entity("alice", "Nimbus", "project", "the old codename")
            await backend.sql("UPDATE entities SET name_terms = 'stratus hello' WHERE id = ?", eid)
            await backend.sql("UPDATE messages SET terms = 'hello world', context = 'x y' WHERE turn_key = 't3'")
            await backend.sql("DELETE FROM conversations WHERE user_id = 'alice' AND id = 'c1'")
            assert await backend.sql(STATS_DRIFT) == []
            assert (await backend.sql("SELECT sum(docs) FROM term_stats WHERE user_id = 'alice' AND kind = 'message'"
                                      " AND term = 'hello'")) == [(30,)]
            # What the store wrote is folded, one row a key; the test's own SQL left deltas.
            await store.apply([StartTurn(ALICE, "fold", "c0", "hf", T0, "hello again")])
            assert await backend.sql("SELECT count(*) FROM term_stats WHERE user_id = 'alice' AND term = 'hello'"
                                     " AND kind = 'message'") == [(1,)]
            await store.delete_user(ALICE)
            assert await backend.sql(STATS_DRIFT) == []
            assert await backend.sql("SELECT count(*) FROM term_stats WHERE user_id = 'alice'") == [(0,)]
        finally:
            await store.close()

    run(body())


def test_outage_gives_transient_errors_and_the_pool_reconnects(pg_server: PostgresServer, pg_url: str) -> None:
    async def body() -> None:
        store = PostgresStore(pg_url)
        await store.open()
        try:
            await store.apply([StartTurn(ALICE, "t1", "c1", "h", T0, "before")])
            pg_server.stop()
            try:
                assert await store.ping() is False
                with pytest.raises(StoreError) as write_error:
                    await store.apply([StartTurn(ALICE, "t2", "c1", "h2", T0, "during")])
                with pytest.raises(StoreError) as read_error:
                    await store.search_messages(ALICE, ["before"])
                assert write_error.value.transient and read_error.value.transient
            finally:
                pg_server.start()
            deadline = time.monotonic() + 10
            while not await store.ping() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await store.apply([StartTurn(ALICE, "t2", "c1", "h2", T0, "during")])  # the writer's retry
            assert [m.content for m in await store.messages(ALICE, "c1")] == ["before", "during"]
        finally:
            await store.close()

    run(body())


def test_open_fails_with_store_error_naming_no_password() -> None:
    async def body() -> None:
        store = PostgresStore("postgresql://memproxy:hunter2@127.0.0.1:1/memproxy")
        with pytest.raises(StoreError, match="cannot open") as failure:
            await store.open()
        assert "hunter2" not in str(failure.value) and failure.value.transient

    run(body())


def test_config_example_selects_the_postgres_store(pg_url: str) -> None:
    settings = load_settings(str(ROOT / "config" / "postgres.yaml"),
                             environ={"MEMPROXY_STORE_URL": pg_url, "MEMPROXY_STORE_HASH_KEY": PG_HASH_KEY})
    store = open_store(settings.store)
    assert isinstance(store, PostgresStore)

    async def body() -> None:
        await store.open()
        try:
            assert await store.ping() is True
        finally:
            await store.close()

    run(body())


@pytest.mark.parametrize(("error", "transient"), [
    (asyncpg.exceptions.ProgramLimitExceededError("index row size 6416 exceeds btree version 4 maximum 2704"), False),
    (asyncpg.exceptions.UniqueViolationError("duplicate key"), False),
    (asyncpg.exceptions.DeadlockDetectedError("deadlock detected"), True),
    (asyncpg.exceptions.DiskFullError("could not extend file"), True),
])
def test_only_errors_a_retry_can_fix_are_transient(error: Exception, transient: bool) -> None:
    # A write taken for transient is retried forever with every later write behind it: a row
    # PostgreSQL can never take (SQLSTATE class 54) must be dropped and logged instead.
    assert _error(error).transient is transient
