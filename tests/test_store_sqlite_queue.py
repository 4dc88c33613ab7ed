"""Extraction claims on one SQLite file shared by the workers of `memproxy serve --workers N`
(sqlite/queue.py).

Each worker is a SQLiteStore of its own (its own connections and claimant id) on one real
file; two stores in one process take the same file locks two processes do. A user's items
go to one worker at a time, in queue order, and no item goes to two.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from proxy.memory.extraction.facts import no_facts
from proxy.models import Scope
from proxy.stores.base import ExtractionFailed, QueuedMessage, StartTurn
from proxy.stores.sqlite.queue import CLAIM_LEASE_S
from proxy.stores.sqlite.store import SQLiteStore

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
NOW = T0 + timedelta(days=1)
LEASE = timedelta(seconds=CLAIM_LEASE_S)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@asynccontextmanager
async def workers(path: Path) -> AsyncIterator[tuple[SQLiteStore, SQLiteStore]]:
    """Two stores on one file, as two workers have (neither closes the other's pending turns)."""
    one, two = SQLiteStore(str(path), recover_pending=False), SQLiteStore(str(path), recover_pending=False)
    await one.open()
    await two.open()
    try:
        yield one, two
    finally:
        await asyncio.gather(one.close(), two.close())


async def enqueue(store: SQLiteStore, said: Sequence[tuple[str, str]], tag: str = "") -> None:
    """Save each (user, text) as a user message, a second apart: queued in this order."""
    await store.apply([StartTurn(Scope(user), f"t{tag}{i}", "c1", f"h{tag}{i}", T0 + timedelta(seconds=i), text)
                       for i, (user, text) in enumerate(said)])


def texts(items: Sequence[QueuedMessage]) -> list[str]:
    return [item.message.content for item in items]


def test_an_item_claimed_by_one_worker_is_not_claimed_by_another(tmp_path: Path) -> None:
    async def body() -> None:
        async with workers(tmp_path / "m.db") as (one, two):
            await enqueue(one, [("u", "u1"), ("u", "u2"), ("v", "v1")])
            assert texts(await one.claim_extraction(10, NOW)) == ["u1", "u2", "v1"]
            assert await two.claim_extraction(10, NOW) == []
            assert await one.claim_extraction(10, NOW) == []  # nor twice by the same one

    run(body())


def test_a_users_later_items_stay_with_the_worker_holding_the_earlier_ones(tmp_path: Path) -> None:
    async def body() -> None:
        async with workers(tmp_path / "m.db") as (one, two):
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


def test_a_lease_that_runs_out_lets_another_worker_take_the_user_over(tmp_path: Path) -> None:
    async def body() -> None:
        async with workers(tmp_path / "m.db") as (one, two):
            await enqueue(one, [("u", "u1"), ("u", "u2")])
            assert texts(await one.claim_extraction(1, NOW)) == ["u1"]
            assert await two.claim_extraction(10, NOW + LEASE - timedelta(seconds=1)) == []
            # One died holding u1: two takes u over from u1, in order.
            assert texts(await two.claim_extraction(10, NOW + LEASE)) == ["u1", "u2"]

    run(body())


def test_a_failed_item_and_a_handed_back_one_hold_no_lease(tmp_path: Path) -> None:
    retry_at = NOW + timedelta(minutes=1)

    async def body() -> None:
        async with workers(tmp_path / "m.db") as (one, two):
            await enqueue(one, [("u", "u1"), ("u", "u2"), ("v", "v1")])
            failed, _, handed = await one.claim_extraction(10, NOW)
            await one.apply([ExtractionFailed(failed.scope, failed.queue_id, "model down", retry_at)])
            await one.release_extraction([handed.queue_id])
            assert texts(await two.claim_extraction(10, NOW)) == ["v1"]  # u2 is still one's
            (u1,) = await one.claim_extraction(10, retry_at)
            assert (u1.message.content, u1.attempts) == ("u1", 1)

    run(body())


def test_the_next_start_of_serve_ends_every_lease(tmp_path: Path) -> None:
    async def body() -> None:
        async with workers(tmp_path / "m.db") as (one, _):
            await enqueue(one, [("u", "u1")])
            assert texts(await one.claim_extraction(10, NOW)) == ["u1"]
        alone = SQLiteStore(str(tmp_path / "m.db"))  # opened by one process, or the supervisor of several
        await alone.open()
        try:
            assert texts(await alone.claim_extraction(10, NOW)) == ["u1"]
        finally:
            await alone.close()

    run(body())


def test_claims_at_the_same_moment_never_take_an_item_twice_nor_split_a_user(tmp_path: Path) -> None:
    async def body() -> None:
        async with workers(tmp_path / "m.db") as (one, two):
            for round_ in range(30):
                said = [(f"{user}{round_}", f"{user}{round_}-{n}") for n in range(4) for user in ("a", "b")]
                await enqueue(one, said, tag=f"r{round_}-")
                claims = await asyncio.gather(one.claim_extraction(3, NOW), two.claim_extraction(3, NOW))
                owners = [{item.scope.user for item in claim} for claim in claims]
                assert not owners[0] & owners[1], (round_, [texts(claim) for claim in claims])
                assert owners[0] | owners[1]
                for claim, claimed_users in zip(claims, owners):
                    for user in claimed_users:
                        taken = [item.message.content for item in claim if item.scope.user == user]
                        assert taken == [f"{user}-{n}" for n in range(len(taken))]
                with closing(sqlite3.connect(tmp_path / "m.db")) as db, db:
                    db.execute("DELETE FROM extraction_queue")

    run(body())
