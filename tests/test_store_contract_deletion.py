"""Deletion generations in the Store contract, on both backends (stores/generations.py).

A turn's writes carry the generation its lookup read; the commit skips them once the
user or their conversation was deleted at a later generation, and any deletion leaves a
turn's cached block out of the lookup until a block of the new generation replaces it.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Coroutine
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from proxy.extracted import bounded_key
from proxy.models import Scope
from proxy.stores.base import (
    EntityFact, FinishTurn, FoundTurn, RecordFacts, RecordToolCalls, SaveBlock, SetTurnStatus, StartTurn, Store,
    StoreMemory,
)
from proxy.stores.generations import Generation
from proxy.stores.sqlite.store import SQLiteStore
from proxy.stores.sqlite.schema import MIGRATIONS, statements
from tests.store_backends import Backend, backend  # noqa: F401  (the fixture)

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
ALICE = Scope("alice")
BOB = Scope("bob")
USER_TABLES = ("users", "conversations", "turns", "messages", "turn_tool_calls", "injections", "reasoning",
               "extraction_queue")


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


async def lookup(store: Store, scope: Scope, history: str = "h", call_ids: tuple[str, ...] = ()) -> FoundTurn:
    return await store.find_turn(scope, list(call_ids), history, T0 - timedelta(days=1))


def turn_writes(scope: Scope, key: str, conversation: str, generation: int) -> list[Any]:
    """Every write a turn makes, from its start to its answer, at `generation`."""
    gen = Generation(generation, conversation)
    return [StartTurn(scope, key, conversation, f"h-{key}", T0, f"question {key}", generation=gen),
            SaveBlock(scope, key, f"block of {key}", 1, {"n": 1}, T0, generation=gen),
            RecordToolCalls(scope, key, ((f"call-{key}", "search", "{}"),), T0, generation=gen),
            SetTurnStatus(scope, key, "upstream_failed", T0, generation=gen),
            FinishTurn(scope, key, conversation, f"answer {key}", T0 + timedelta(seconds=1), generation=gen)]


async def rows_of(backend: Backend, user: str) -> dict[str, int]:
    counts = {}
    for table in USER_TABLES:
        column = "id" if table == "users" else "user_id"
        counts[table] = (await backend.sql(f"SELECT count(*) FROM {table} WHERE {column} = ?", user))[0][0]
    return {table: n for table, n in counts.items() if n}


def test_a_turn_in_flight_saves_nothing_after_its_users_deletion(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            assert await lookup(store, ALICE) == FoundTurn(None, 0)
            await store.apply(turn_writes(ALICE, "t1", "c1", 0)[:1] + turn_writes(BOB, "b1", "c1", 0)[:1])
            await store.delete_user(ALICE)
            assert (await lookup(store, ALICE)).generation == 1
            await store.apply(turn_writes(ALICE, "t1", "c1", 0)[1:] + turn_writes(ALICE, "t2", "c2", 0)
                              + turn_writes(BOB, "b1", "c1", 0)[1:])
            assert await rows_of(backend, "alice") == {}
            assert await rows_of(backend, "bob") == {"users": 1, "conversations": 1, "turns": 1, "messages": 2,
                                                     "turn_tool_calls": 1, "injections": 1, "extraction_queue": 2}
            await store.apply(turn_writes(ALICE, "t3", "c1", 1))  # a turn begun after the deletion
            assert await rows_of(backend, "alice") == {"users": 1, "conversations": 1, "turns": 1, "messages": 2,
                                                       "turn_tool_calls": 1, "injections": 1, "extraction_queue": 2}
        # The record of the deletion keeps no user id in the clear.
        kept = await backend.sql("SELECT id, generation FROM generations ORDER BY generation")
        assert len(kept) == 2 and {n for _, n in kept} == {1} and not any("alice" in key for key, _ in kept)

    run(body())


def test_deleting_a_user_with_nothing_saved_yet_still_ends_its_turn_in_flight(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            assert (await lookup(store, ALICE)).generation == 0
            assert (await store.delete_user(ALICE))["users"] == 0
            await store.apply(turn_writes(ALICE, "t1", "c1", 0))
            assert await rows_of(backend, "alice") == {}

    run(body())


def test_deleting_a_conversation_with_nothing_saved_yet_still_ends_its_turn_in_flight(backend: Backend) -> None:
    """Its first turn is in flight (a slow pre_memory_write hook holds its start): the delete finds
    nothing (404), and the turn's writes still save nothing; another conversation's do."""
    async def body() -> None:
        async with backend.opened() as store:
            assert await store.delete_item(ALICE, "conversation", "c1") is None
            await store.apply(turn_writes(ALICE, "t1", "c1", 0) + turn_writes(ALICE, "t2", "c2", 0))
            assert await backend.sql("SELECT turn_key, conversation_id FROM turns") == [("t2", "c2")]
            assert await store.messages(ALICE, "c1") == []

    run(body())


def test_deleting_a_conversation_ends_only_its_turns_in_flight(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([turn_writes(ALICE, "t1", "c1", 0)[0], turn_writes(ALICE, "t2", "c2", 0)[0]])
            assert await store.delete_item(ALICE, "conversation", "c1") is not None
            assert (await lookup(store, ALICE)).generation == 1
            await store.apply(turn_writes(ALICE, "t1", "c1", 0)[1:] + turn_writes(ALICE, "t2", "c2", 0)[1:])
            turns = await backend.sql("SELECT turn_key, conversation_id, status FROM turns")
            assert turns == [("t2", "c2", "complete")]
            assert [m.content for m in await store.messages(ALICE, "c2")] == ["question t2", "answer t2"]
            assert await store.messages(ALICE, "c1") == []
            await store.apply(turn_writes(ALICE, "t3", "c1", 1))  # the id is free again for a later turn
            assert [m.content for m in await store.messages(ALICE, "c1")] == ["question t3", "answer t3"]

    run(body())


def test_what_a_turn_stores_with_the_memory_tool_goes_with_a_deletion_made_meanwhile(backend: Backend) -> None:
    """tools mode's store_memory is a write of the turn: a fact or an interaction it stores after
    its user or conversation was deleted saves nothing; the memory API's write (no turn) saves."""
    def stored(scope: Scope, memory_id: str, kind: str, conversation: str, generation: int | None) -> StoreMemory:
        return StoreMemory(scope, memory_id, f"remember {memory_id}", kind, T0, conversation_id=conversation,
                           generation=None if generation is None else Generation(generation, conversation))

    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([turn_writes(ALICE, "t1", "c1", 0)[0], turn_writes(ALICE, "t2", "c2", 0)[0]])
            assert await store.delete_item(ALICE, "conversation", "c1") is not None  # generation 1
            await store.apply([stored(ALICE, "m1", "interaction", "c1", 0), stored(ALICE, "m2", "fact", "c1", 0),
                               stored(ALICE, "m3", "interaction", "c2", 0)])
            assert await store.messages(ALICE, "c1") == []
            assert [m.content for m in await store.messages(ALICE, "c2")] == ["question t2", "remember m3"]
            assert await backend.sql("SELECT count(*) FROM entities WHERE user_id = ?", "alice") == [(0,)]
            await store.delete_user(ALICE)  # generation 2
            await store.apply([stored(ALICE, "m4", "fact", "c2", 1), stored(ALICE, "m5", "interaction", "c2", 1)])
            assert await rows_of(backend, "alice") == {}
            assert await backend.sql("SELECT count(*) FROM entities WHERE user_id = ?", "alice") == [(0,)]
            await store.apply([stored(ALICE, "m6", "fact", "c9", None)])  # the memory API's, after the deletion
            assert await backend.sql("SELECT name FROM entities WHERE user_id = ?", "alice") == [("remember m6",)]

    run(body())


def test_a_cached_block_is_left_out_after_a_deletion_until_a_new_one_replaces_it(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply(turn_writes(ALICE, "t1", "c1", 0)[:3] + turn_writes(ALICE, "t2", "c1", 0)[:1])
            found = await lookup(store, ALICE, call_ids=("call-t1",))
            assert found.turn is not None and (found.turn.key, found.turn.block) == ("t1", "block of t1")
            said = (await store.messages(ALICE, "c1"))[1]
            assert await store.delete_item(ALICE, "message", said.id) is not None
            found = await lookup(store, ALICE, call_ids=("call-t1",))
            assert found.generation == 1 and found.turn is not None
            assert (found.turn.key, found.turn.block, found.turn.injected) == ("t1", None, 0)
            again = Generation(1, "c1")
            await store.apply([SaveBlock(ALICE, "t1", "new block", 2, {"n": 2}, T0, again),
                               SaveBlock(ALICE, "t1", "a third block", 3, {"n": 3}, T0, again)])
            found = await lookup(store, ALICE, call_ids=("call-t1",))
            assert found.turn is not None and (found.turn.block, found.turn.injected) == ("new block", 2)
            assert [(row["turn_id"], row["log"]) for row in await store.injections(ALICE)] == [("t1", {"n": 2})]
            # The turn's other writes still land: only a deletion of its user or conversation ends them.
            await store.apply(turn_writes(ALICE, "t1", "c1", 0)[4:])
            assert [m.content for m in await store.messages(ALICE, "c1")] == ["question t1", "answer t1"]

    run(body())


def test_a_deletion_clears_the_users_cached_blocks_and_a_block_computed_before_it_keeps_no_text(
        backend: Backend) -> None:
    """A block may quote what was deleted: the deletion clears every block of the user in its own
    transaction, and one computed before it but saved after is kept without its text."""
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply(turn_writes(ALICE, "t1", "c1", 0)[:2] + turn_writes(ALICE, "t2", "c2", 0)[:1]
                              + turn_writes(BOB, "b1", "c1", 0)[:2])
            said = (await store.messages(ALICE, "c1"))[0]
            assert await store.delete_item(ALICE, "message", said.id) is not None
            blocks = "SELECT user_id, turn_key, block FROM turns ORDER BY user_id, turn_key"
            assert await backend.sql(blocks) == [("alice", "t1", None), ("alice", "t2", None),
                                                 ("bob", "b1", "block of b1")]
            # t2's first step computed its block before the deletion; it commits after.
            await store.apply([SaveBlock(ALICE, "t2", "block of t2", 1, {"n": 1}, T0, Generation(0, "c2"),
                                         prompt="rewritten t2")])
            assert await backend.sql("SELECT block, injected, prompt FROM turns WHERE turn_key = ?", "t2") == [
                (None, 1, "rewritten t2")]
            assert [row["turn_id"] for row in await store.injections(ALICE)] == ["t2", "t1"]
            found = await lookup(store, ALICE, "h-t2")
            assert found.turn is not None and (found.turn.block, found.turn.prompt) == (None, "rewritten t2")
            # Its next step computes it again, after the deletion: that block is cached.
            await store.apply([SaveBlock(ALICE, "t2", "block of t2 again", 1, {"n": 2}, T0, Generation(1, "c2"))])
            found = await lookup(store, ALICE, "h-t2")
            assert found.turn is not None and found.turn.block == "block of t2 again"

    run(body())


def test_the_extraction_of_a_deleted_message_is_never_applied_to_a_later_one(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply(turn_writes(ALICE, "t1", "c1", 0)[:1])
            [item] = await store.claim_extraction(10, T0 + timedelta(days=1))
            await store.delete_user(ALICE)
            await store.apply(turn_writes(ALICE, "t2", "c1", 1)[:1])
            if backend.name == "sqlite":  # the later message's item takes the deleted one's queue id
                assert [q.queue_id for q in await store.claim_extraction(10, T0 + timedelta(days=1))] == [item.queue_id]
            # The extraction of the deleted message, finishing now, is dropped.
            await store.apply([RecordFacts(ALICE, item.queue_id, item.message.id, (EntityFact("Zed", "person"),), (),
                                           T0)])
            assert await store.entities(ALICE) == []
            assert await backend.sql("SELECT count(*) FROM extraction_queue") == [(1,)]

    run(body())


def test_a_database_of_schema_7_opens_and_its_cached_blocks_stay_current(tmp_path: Path) -> None:
    path = tmp_path / "v7.db"
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.create_function("memproxy_bounded_key", 1, bounded_key)  # what migration v4 calls
        db.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
        for version, script in enumerate(MIGRATIONS[:7], start=1):
            for statement in statements(script):
                db.execute(statement)
            db.execute("INSERT INTO schema_version VALUES (?, 0)", (version,))
        db.execute("INSERT INTO users VALUES ('alice', 0)")
        db.execute("INSERT INTO conversations VALUES ('alice', 'c1', NULL, 0, 0)")
        db.execute("INSERT INTO turns (user_id, turn_key, conversation_id, history_hash, status, block, injected,"
                   " created_at, updated_at) VALUES ('alice', 't1', 'c1', 'h', 'complete', 'old block', 1, ?, ?)",
                   (T0.timestamp(), T0.timestamp()))

    async def body() -> FoundTurn:
        store = SQLiteStore(str(path))
        await store.open()
        try:
            return await lookup(store, ALICE)
        finally:
            await store.close()

    found = run(body())
    assert found.generation == 0 and found.turn is not None and found.turn.block == "old block"
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT max(version) FROM schema_version").fetchone() == (len(MIGRATIONS),)
