"""The SQLite read pool: reads side by side on their own connections, cancelled reads skipped,
errors returned to the caller, and a close that lets queued reads finish first."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from proxy.stores.sqlite.readers import ReadPool

from tests.proxy_db import sqlite_file

PRAGMAS = ("busy_timeout=1000",)


def make_db(tmp_path: Path) -> str:
    path = str(tmp_path / "r.db")
    with sqlite_file(path) as conn:
        conn.execute("CREATE TABLE t (n INTEGER)")
        conn.executemany("INSERT INTO t VALUES (?)", [(n,) for n in range(5)])
    return path


def test_reads_run_side_by_side_each_thread_on_its_own_connection(tmp_path: Path) -> None:
    async def body() -> None:
        pool = ReadPool(make_db(tmp_path), PRAGMAS, 2)
        both_started = threading.Barrier(2, timeout=5)
        seen: list[tuple[int, int]] = []

        def read(conn: sqlite3.Connection) -> int:
            both_started.wait()  # only two reads running at once get past this
            seen.append((threading.get_ident(), id(conn)))
            return int(conn.execute("SELECT sum(n) FROM t").fetchone()[0])

        try:
            assert await asyncio.gather(pool.run(read), pool.run(read)) == [10, 10]
            assert len({thread for thread, _ in seen}) == 2
            assert len({conn for _, conn in seen}) == 2
        finally:
            await pool.close()

    asyncio.run(body())


def test_an_error_reaches_its_caller_and_the_pool_keeps_serving(tmp_path: Path) -> None:
    async def body() -> None:
        pool = ReadPool(make_db(tmp_path), PRAGMAS, 1)
        try:
            with pytest.raises(sqlite3.OperationalError, match="no such table"):
                await pool.run(lambda conn: conn.execute("SELECT * FROM missing").fetchall())
            rows = await pool.run(lambda conn: conn.execute("SELECT count(*) FROM t").fetchall())
            assert rows[0][0] == 5
        finally:
            await pool.close()

    asyncio.run(body())


def test_a_read_cancelled_while_queued_never_runs(tmp_path: Path) -> None:
    async def body() -> None:
        pool = ReadPool(make_db(tmp_path), PRAGMAS, 1)
        release = threading.Event()
        ran: list[str] = []

        def blocker(conn: sqlite3.Connection) -> None:
            release.wait(5)
            ran.append("blocker")

        try:
            first = asyncio.ensure_future(pool.run(blocker))
            queued = asyncio.ensure_future(pool.run(lambda conn: ran.append("cancelled")))
            await asyncio.sleep(0.05)
            queued.cancel()
            await asyncio.sleep(0)
            release.set()
            await first
            await pool.run(lambda conn: ran.append("after"))
            assert ran == ["blocker", "after"]
            assert queued.cancelled()
        finally:
            await pool.close()

    asyncio.run(body())


def test_close_lets_queued_reads_finish_then_refuses_new_ones(tmp_path: Path) -> None:
    async def body() -> None:
        pool = ReadPool(make_db(tmp_path), PRAGMAS, 1)
        release = threading.Event()

        def slow(conn: sqlite3.Connection) -> int:
            release.wait(5)
            return int(conn.execute("SELECT max(n) FROM t").fetchone()[0])

        reads = [asyncio.ensure_future(pool.run(slow)) for _ in range(3)]
        await asyncio.sleep(0.05)
        closing = asyncio.ensure_future(pool.close())
        await asyncio.sleep(0.05)
        assert not closing.done()
        release.set()
        await closing
        assert [read.result() for read in reads] == [4, 4, 4]
        with pytest.raises(RuntimeError, match="closed"):
            await pool.run(lambda conn: None)

    asyncio.run(body())


def test_a_lookup_runs_on_the_event_loops_thread_and_a_locked_one_on_a_reader(tmp_path: Path) -> None:
    """`run_here` answers on the calling thread, on a connection of its own, without a hop; when
    SQLite would have to wait for a lock it does not block the event loop: a reader thread
    waits instead, and the loop keeps running meanwhile."""
    async def body() -> None:
        path = make_db(tmp_path)  # a rollback journal: an exclusive lock keeps readers out
        pool = ReadPool(path, PRAGMAS, 1)
        seen: list[tuple[int, int]] = []

        def read(conn: sqlite3.Connection) -> int:
            seen.append((threading.get_ident(), id(conn)))
            return int(conn.execute("SELECT sum(n) FROM t").fetchone()[0])

        try:
            assert await pool.run_here(read) == 10
            assert await pool.run(read) == 10
            (here, here_conn), (reader, reader_conn) = seen
            assert here == threading.get_ident() and reader != here and here_conn != reader_conn
            assert await pool.run_here(read) == 10
            assert seen[2] == seen[0]  # the same connection again
            holder = sqlite3.connect(path, isolation_level=None)
            holder.execute("BEGIN EXCLUSIVE")
            ticks = 0

            async def tick() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.01)

            ticking = asyncio.create_task(tick())
            asyncio.get_running_loop().call_later(0.3, holder.rollback)
            assert await pool.run_here(read) == 10
            ticking.cancel()
            holder.close()
            assert [thread for thread, _ in seen[3:]] == [here, reader]  # tried here, answered on the reader
            assert ticks >= 10  # the loop ran while the reader waited for the lock
        finally:
            await pool.close()

    asyncio.run(body())
