"""SQLite-only store behaviour: opening failures, a lock held by another connection, FTS5 tokens after a delete.

The behaviour both backends share is in tests/test_store_contract.py, run on each.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Any

import pytest

from proxy.models import ReasoningStep
from proxy.stores.base import (
    RecordToolCalls,
    SaveBlock,
    StoreError,
)
from proxy.stores.sqlite.store import SQLiteStore
from proxy.stores.indexed_text import entity_terms
from proxy.stores.sqlite.schema import FTS_TABLES
from proxy.terms import query_terms
from tests.test_store_contract import ALICE, BOB, CANARY, T0, finish, run, start


@asynccontextmanager
async def opened(path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(str(path))
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def sql(path: Path, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("PRAGMA foreign_keys=ON")
        return db.execute(query, params).fetchall()


def add_entity(path: Path, user: str, name: str, type_: str = "", description: str = "",
               agent: str | None = None) -> str:
    """An entity written as the extraction work will write it (no write op exists yet)."""
    eid = uuid.uuid4().hex
    sql(path, "INSERT INTO users (id, created_at) VALUES (?, 0) ON CONFLICT DO NOTHING", (user,))
    sql(path, "INSERT INTO entities (id, user_id, agent_id, name, canonical_name, type, description, name_terms,"
              " type_terms, description_terms, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0)",
        (eid, user, agent, name, " ".join(name.lower().split()), type_, description,
         *entity_terms(name, type_, description)))
    return eid


# --- writes ----------------------------------------------------------------------------


# --- lookups ---------------------------------------------------------------------------


# --- scopes ----------------------------------------------------------------------------


# --- search ----------------------------------------------------------------------------


# --- export ----------------------------------------------------------------------------


# --- faults, recovery, scale ---------------------------------------------------------------


def test_open_fails_with_store_error(tmp_path: Path) -> None:
    async def body() -> None:
        with pytest.raises(StoreError, match="cannot open"):
            await SQLiteStore(str(tmp_path / "missing-dir" / "m.db")).open()

    run(body())
    with pytest.raises(ValueError, match="synchronous"):
        SQLiteStore(str(tmp_path / "m.db"), synchronous="sometimes")


def test_apply_waits_for_a_lock_held_elsewhere(tmp_path: Path) -> None:
    path = tmp_path / "m.db"

    async def body() -> None:
        async with opened(path) as store:
            await store.apply([start(ALICE, "t0")])
            with closing(sqlite3.connect(path, isolation_level=None)) as blocker:
                blocker.execute("BEGIN EXCLUSIVE")
                began = time.monotonic()
                task = asyncio.create_task(store.apply([start(ALICE, "t1", "written after the lock")]))
                await asyncio.sleep(0.4)
                assert not task.done()
                assert await store.turn(ALICE, "t0") is not None  # WAL: reads go on meanwhile
                blocker.execute("COMMIT")
            await asyncio.wait_for(task, timeout=2)
            assert 0.4 <= time.monotonic() - began < 2.5
            assert "written after the lock" in [m.content for m in await store.messages(ALICE, "c1")]

    run(body())


def test_user_delete_cascades_and_optimize_drops_the_tokens(tmp_path: Path) -> None:
    """What the later delete-user work relies on: FK cascades fire the FTS triggers."""
    path = tmp_path / "m.db"
    token = f"{CANARY}uniquetoken"

    async def body() -> None:
        async with opened(path) as store:
            steps = (ReasoningStep("t", "{}", token),)
            await store.apply([start(ALICE, "t1", f"hello {token}"),
                               RecordToolCalls(ALICE, "t1", (("c", "n", "a"),), T0),
                               finish(ALICE, "t1", token, task=token, steps=steps),
                               SaveBlock(ALICE, "t1", token, 1),
                               start(BOB, "t1", "bob stays")])
            add_entity(path, "alice", token, "thing", token)
            assert await store.search_messages(ALICE, [token])

    run(body())
    assert index_holds(path, token)
    sql(path, "DELETE FROM users WHERE id = 'alice'")
    for fts in FTS_TABLES:
        sql(path, f"INSERT INTO {fts}({fts}) VALUES ('optimize')")
    assert not index_holds(path, token)
    tables = [name for (name,) in sql(path, "SELECT name FROM sqlite_master WHERE type = 'table'"
                                            " AND sql LIKE '%user_id%' AND name NOT LIKE '%fts%'")]
    for table in tables:
        assert sql(path, f"SELECT count(*) FROM {table} WHERE user_id = 'alice'") == [(0,)], table
    assert sql(path, "SELECT count(*) FROM messages WHERE user_id = 'bob'") == [(1,)]


def index_holds(path: Path, token: str) -> bool:
    needle = token.encode()
    return any(sql(path, f"SELECT count(*) FROM {fts}_data WHERE instr(block, ?) > 0", (needle,))[0][0]
               for fts in FTS_TABLES)


# --- WAL checkpoints, off the write path ----------------------------------------------------


def _rows_in_main_file(path: Path) -> int:
    """Messages the database file itself holds, ignoring what only the WAL holds yet."""
    with closing(sqlite3.connect(f"file:{path}?immutable=1", uri=True)) as db:
        return int(db.execute("SELECT count(*) FROM messages").fetchone()[0])


def _rows_copied_yet(path: Path) -> int:
    """`_rows_in_main_file`, or -1 when the read met the file while a checkpoint was writing it
    (an immutable read takes no lock, so it can see a page half copied)."""
    try:
        return _rows_in_main_file(path)
    except sqlite3.DatabaseError:
        return -1


def test_commits_never_checkpoint_the_wal_a_thread_does(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    text = "a long message to fill the WAL quickly " * 200  # ~8 KB: 600 turns are well past 1,000 pages

    async def body() -> None:
        async with opened(path):
            pass  # the schema, in the database file once the store has closed
        # No checkpoint for an hour: past 1,000 WAL pages, a commit would once have copied them itself.
        store = SQLiteStore(str(path), checkpoint_every_s=3600)
        await store.open()
        try:
            for batch in range(12):  # many commits, as turns arrive
                await store.apply([start(ALICE, f"t{batch}-{n}", f"{text} {n}") for n in range(50)])
            assert (path.parent / "m.db-wal").stat().st_size > 1000 * 4096
            assert _rows_in_main_file(path) == 0  # all 600 are in the WAL only
        finally:
            await store.close()
        assert _rows_in_main_file(path) == 600  # the last connection's close checkpoints

        store = SQLiteStore(str(path), checkpoint_every_s=0.05)
        await store.open()
        try:
            await store.apply([start(ALICE, f"u{n}", f"{text} {n}") for n in range(100)])
            deadline = time.monotonic() + 5
            while _rows_copied_yet(path) < 700 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert _rows_in_main_file(path) == 700  # copied by the checkpoint thread, the store still open
        finally:
            await store.close()

    run(body())


def test_a_wal_past_its_limit_is_emptied_by_the_checkpoint_thread(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    wal = path.parent / "m.db-wal"
    text = "a long message to fill the WAL quickly " * 200

    async def body() -> None:
        store = SQLiteStore(str(path), checkpoint_every_s=0.05, wal_truncate_bytes=256 * 1024)
        await store.open()
        try:
            for batch in range(4):
                await store.apply([start(ALICE, f"t{batch}-{n}", f"{text} {n}") for n in range(50)])
            deadline = time.monotonic() + 5
            while wal.stat().st_size > 0 and time.monotonic() < deadline:
                # Reads keep coming meanwhile, as under load; the truncation waits them out.
                await store.search_messages(ALICE, ["long", "message"], limit=3)
                await asyncio.sleep(0.01)
            assert wal.stat().st_size == 0  # a PASSIVE checkpoint copies the WAL but leaves the file as large
            assert _rows_in_main_file(path) == 200
            await store.apply([start(ALICE, "after", "written after the truncation")])
            assert len(await store.search_messages(ALICE, query_terms("truncation"), limit=3)) == 1
        finally:
            await store.close()

    run(body())
