"""Extraction claims on one store shared by replicas or worker processes (postgres/queue.py,
sqlite/queue.py).

Each replica is a store of its own (its own connections and claimant id) on one real
database: a PostgreSQL schema, or one SQLite file. A user's items go to one replica at a
time, in queue order, so one user's facts land in the order they were said; other users'
items go to any replica.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from proxy.memory.learning.facts import no_facts
from proxy.models import Scope
from proxy.stores.base import ExtractionFailed, QueuedMessage, StartTurn, Store
from proxy.stores.postgres.store import PostgresStore
from proxy.stores.postgres.queue import CLAIM_LEASE
from proxy.stores.postgres.schema import MIGRATIONS
from proxy.stores.sqlite.facts import _EARLIER_WAITING
from proxy.stores.sqlite.processes import new_process_id
from proxy.stores.sqlite.store import SQLiteStore
from proxy.stores.sqlite.queue import CLAIM_LEASE as SQLITE_CLAIM_LEASE
from tests.store_backends import Backend, SQLiteBackend, backend  # noqa: F401 (fixture)
from tests.proxy_db import sqlite_file

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
NOW = T0 + timedelta(days=1)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@asynccontextmanager
async def replicas(backend: Backend | str) -> AsyncIterator[tuple[Store, Store]]:
    """Two stores on one database (a PostgreSQL URL, or a backend's), as two replicas have."""
    one, two = (PostgresStore(backend), PostgresStore(backend)) if isinstance(backend, str) else (
        backend.store(), backend.store())
    await asyncio.gather(one.open(), two.open())
    try:
        yield one, two
    finally:
        await asyncio.gather(one.close(), two.close())


async def enqueue(store: Store, said: Sequence[tuple[str, str]], tag: str = "") -> None:
    """Save each (user, text) as a user message, a second apart: queued in this order."""
    await store.apply([StartTurn(Scope(user), f"t{tag}{i}", "c1", f"h{tag}{i}", T0 + timedelta(seconds=i), text)
                       for i, (user, text) in enumerate(said)])


def texts(items: Sequence[QueuedMessage]) -> list[str]:
    return [item.message.content for item in items]


def lease(backend: Backend) -> timedelta:
    return SQLITE_CLAIM_LEASE if backend.name == "sqlite" else CLAIM_LEASE


def test_a_users_later_items_stay_with_the_replica_holding_the_earlier_ones(backend: Backend) -> None:
    async def body() -> None:
        async with replicas(backend) as (one, two):
            await enqueue(one, [("u", "u1"), ("v", "v1"), ("u", "u2"), ("v", "v2"), ("u", "u3"), ("u", "u4")])
            first = await one.claim_extraction(1, NOW)
            assert texts(first) == ["u1"]
            assert texts(await two.claim_extraction(10, NOW)) == ["v1", "v2"]  # none of u's, all of v's
            second = await one.claim_extraction(1, NOW)  # the holder goes on with u
            assert texts(second) == ["u2"]
            assert await two.claim_extraction(10, NOW) == []
            await one.apply([no_facts(first[0], first[0].scope)])
            assert await two.claim_extraction(10, NOW) == []  # u2 is still one's
            await one.apply([no_facts(second[0], second[0].scope)])
            assert texts(await two.claim_extraction(10, NOW)) == ["u3", "u4"]
            assert await one.claim_extraction(10, NOW) == []  # now two holds u

    run(body())


def test_a_lease_that_runs_out_lets_another_replica_take_the_user_over(backend: Backend) -> None:
    over = NOW + lease(backend)

    async def body() -> None:
        async with replicas(backend) as (one, two):
            await enqueue(one, [("u", "u1"), ("u", "u2")])
            assert texts(await one.claim_extraction(1, NOW)) == ["u1"]
            assert await two.claim_extraction(10, over - timedelta(seconds=1)) == []
            # One died holding u1: two takes u over from u1, in order.
            assert texts(await two.claim_extraction(10, over)) == ["u1", "u2"]
            assert await one.claim_extraction(10, over) == []

    run(body())


def test_an_item_waiting_for_its_retry_holds_back_no_later_item(backend: Backend) -> None:
    """As on one replica: a failed item waits for its retry while the user's later items go on."""
    retry_at = NOW + timedelta(minutes=1)

    async def body() -> None:
        async with replicas(backend) as (one, two):
            await enqueue(one, [("u", "u1"), ("u", "u2"), ("u", "u3")])
            (failed,) = await one.claim_extraction(1, NOW)
            await one.apply([ExtractionFailed(failed.scope, failed.queue_id, "model down", retry_at)])
            assert texts(await two.claim_extraction(1, NOW)) == ["u2"]
            # When u1 is due again, it goes to the replica holding u, after u3 (due earlier).
            assert await one.claim_extraction(10, retry_at) == []
            (u3, u1) = await two.claim_extraction(10, retry_at)
            assert (texts([u3, u1]), u1.attempts) == (["u3", "u1"], 1)
            await two.apply([ExtractionFailed(u1.scope, u1.queue_id, "model down", retry_at, park=True)])
            await two.apply([no_facts(u3, u3.scope)])
            assert await one.claim_extraction(10, retry_at) == []  # u2 is still two's; u1 is parked

    run(body())


def test_claims_at_the_same_moment_never_split_a_user(backend: Backend) -> None:
    """Two replicas claim at once, round after round: each user's items go to one of them at
    most, oldest first, and one of them at least gets items."""
    users = ("a", "b")

    async def body() -> None:
        async with replicas(backend) as (one, two):
            for round_ in range(60):
                said = [(f"{user}{round_}", f"{user}{round_}-{n}") for n in range(4) for user in users]
                await enqueue(one, said, tag=f"r{round_}-")
                claims = await asyncio.gather(one.claim_extraction(3, NOW), two.claim_extraction(3, NOW))
                owners = [{item.scope.user for item in claim} for claim in claims]
                assert not owners[0] & owners[1], (round_, [texts(claim) for claim in claims])
                assert owners[0] | owners[1]
                for claim, claimed_users in zip(claims, owners):
                    for user in claimed_users:
                        taken = [item.message.content for item in claim if item.scope.user == user]
                        assert taken == [f"{user}-{n}" for n in range(len(taken))]
                await backend.sql("DELETE FROM extraction_queue")

    run(body())


def test_a_version_1_database_migrates_and_its_replicas_leases_still_hold(pg_url: str) -> None:
    """Leases taken before claims named their claimant belong to another replica."""
    lease_end = NOW + timedelta(minutes=1)

    async def body() -> None:
        conn = await asyncpg.connect(pg_url)
        try:
            async with conn.transaction():
                await conn.execute("CREATE TABLE schema_version (version integer PRIMARY KEY,"
                                   " applied_at timestamptz NOT NULL)")
                await conn.execute(MIGRATIONS[0])
                await conn.execute("INSERT INTO schema_version VALUES (1, now())")
                await conn.execute("INSERT INTO users VALUES ('u', $1), ('v', $1)", T0)
                await conn.execute("INSERT INTO conversations VALUES ('u', 'c1', NULL, $1, $1),"
                                   " ('v', 'c1', NULL, $1, $1)", T0)
                for n, (user, text) in enumerate([("u", "u1"), ("v", "v1"), ("u", "u2")]):
                    at = T0 + timedelta(seconds=n)
                    await conn.execute("INSERT INTO messages (id, user_id, conversation_id, role, content,"
                                       " content_hash, terms, created_at) VALUES ($1, $2, 'c1', 'user', $1, $1, $1, $3)",
                                       text, user, at)
                    await conn.execute("INSERT INTO extraction_queue (user_id, message_id, next_attempt_at,"
                                       " claimed_until, created_at) VALUES ($1, $2, $3, $4, $3)",
                                       user, text, at, lease_end if text == "u1" else None)
        finally:
            await conn.close()
        async with replicas(pg_url) as (one, _):
            assert texts(await one.claim_extraction(10, NOW)) == ["v1"]  # u1 is leased to an older replica
            assert texts(await one.claim_extraction(10, lease_end)) == ["u1", "u2"]
        conn = await asyncpg.connect(pg_url)
        try:
            assert [tuple(r) for r in await conn.fetch("SELECT version FROM schema_version ORDER BY version")] == [
                (version,) for version in range(1, len(MIGRATIONS) + 1)]
        finally:
            await conn.close()

    run(body())


def test_on_sqlite_a_lease_of_a_process_gone_ends_at_once(tmp_path: Any) -> None:
    """Every process on one SQLite file runs on this host: a worker killed holding items hands
    them over to the next claim, with no wait for the lease; one still running keeps them."""
    gone = subprocess.run([sys.executable, "-c", "from proxy.stores.sqlite.processes import new_process_id;"
                           " print(new_process_id())"], capture_output=True, text=True, check=True).stdout.strip()
    backend = SQLiteBackend(tmp_path / "m.db")

    async def body() -> None:
        async with replicas(backend) as (one, two):
            await enqueue(one, [("u", "u1"), ("v", "v1")])
            await backend.sql("UPDATE extraction_queue SET claimed_until = ?, claimed_by = ?"
                              " WHERE message_id = (SELECT id FROM messages WHERE content = 'u1')", (NOW + timedelta(minutes=1)).timestamp(),
                              new_process_id())
            await backend.sql("UPDATE extraction_queue SET claimed_until = ?, claimed_by = ?"
                              " WHERE message_id = (SELECT id FROM messages WHERE content = 'v1')", (NOW + timedelta(minutes=1)).timestamp(),
                              gone)
            assert texts(await two.claim_extraction(10, NOW)) == ["v1"]

    run(body())


def test_the_earlier_waiting_check_reads_the_users_own_queue_items_not_every_users_due_ones(tmp_path: Any) -> None:
    # Asked for each message whose facts commit: through the due index it read every user's
    # due items (a backlog of other users' made each saved turn slower).
    store = SQLiteStore(str(tmp_path / "memory.db"))
    run(store.open())
    run(store.close())
    with sqlite_file(tmp_path / "memory.db") as db:
        plan = [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + _EARLIER_WAITING, ("u", "m", 1.0))]
    assert plan == ["SEARCH mine USING INDEX sqlite_autoindex_extraction_queue_1 (user_id=? AND message_id=?)",
                    "SEARCH e USING INDEX sqlite_autoindex_extraction_queue_1 (user_id=?)",
                    "SEARCH m USING INDEX sqlite_autoindex_messages_1 (user_id=? AND id=?)"]
