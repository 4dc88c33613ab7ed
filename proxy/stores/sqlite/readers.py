"""The read side of SQLiteStore: a few threads, each owning one read connection.

Retrieval asks its five sources at once. On a single read connection their statements
queued behind each other; SQLite releases the GIL while it steps a statement, so on a few
threads they run side by side (WAL lets any number of readers beside the writer). A thread
opens its connection the first time it runs a read and is the only one ever to use it, so
a caller cancelled mid-read leaves no connection shared between two threads.

A read is handed over on a plain queue and its result set on the caller's future from the
thread, rather than by `run_in_executor`, whose concurrent future, chaining and callbacks
cost about as much again as the hop itself; a memory-on request makes about eight reads
(paired runs against run_in_executor: server CPU 0.2-0.3 ms less per request).

A lookup of a few rows by an index (a turn, a conversation, the user's node, a hit's
neighbours) runs on the event loop's own connection instead (`run_here`): it takes
0.05-0.2 ms, while a hop to a reader thread and back, under load, waits for the GIL on the
way there and for the busy event loop on the way back, 5 ms on average with 64 streaming
clients, and a recall makes several such lookups one after another. A search the user's
in-memory postings answer runs there too (store.py `_search`): it is Python holding the GIL,
which a reader thread only takes back from the loop. What stays on the threads is SQLite's
own work (FTS5), during which it releases the GIL. That connection never waits for a lock
(busy_timeout 0): a lookup SQLite cannot answer at once goes to a reader thread.
"""

from __future__ import annotations

import asyncio
import functools
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

Prepare = Callable[[sqlite3.Connection], None]
_Read = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[[sqlite3.Connection], Any]]


class ReadPool:
    """`size` read connections on `size` threads; `run(work)` calls `work(connection)` on one."""

    def __init__(self, path: str, pragmas: Sequence[str], size: int, prepare: Prepare | None = None) -> None:
        if size < 1:
            raise ValueError(f"a read pool needs at least one connection, not {size}")
        self._path = path
        self._pragmas = tuple(pragmas)
        self._prepare = prepare
        self._reads: queue.SimpleQueue[_Read | None] = queue.SimpleQueue()
        self._closing = False
        # time.monotonic() of the last read a thread completed, set on the thread: a busy event
        # loop that has not yet taken the result in does not hold it back.
        self.answered_at = float("-inf")
        self._here: sqlite3.Connection | None = None  # the event loop's own, opened by its first lookup
        self._threads = [threading.Thread(target=self._serve, name=f"memproxy-sqlite-reader-{n}", daemon=True)
                         for n in range(size)]
        for thread in self._threads:
            thread.start()

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work(connection)` on a reader thread; RuntimeError once the pool is closing."""
        if self._closing:
            raise RuntimeError("the read pool is closed")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        self._reads.put((loop, done, work))
        return await done

    async def run_here(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work(connection)` on the calling event loop's own connection, for a lookup of a few rows
        by an index; on a reader thread when SQLite would have to wait for a lock."""
        if self._closing:
            raise RuntimeError("the read pool is closed")
        if self._here is None:
            self._here = self._connect(busy_timeout_ms=0)
        try:
            result = work(self._here)
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                raise
            if self._here.in_transaction:
                self._here.rollback()
            return await self.run(work)
        self.answered_at = time.monotonic()
        return result

    async def close(self) -> None:
        """Let the reads already asked for finish, then close every connection."""
        if self._closing:
            return
        self._closing = True
        here, self._here = self._here, None
        if here is not None:
            here.close()
        for _ in self._threads:
            self._reads.put(None)  # after every read already queued
        await asyncio.get_running_loop().run_in_executor(None, self._join)

    def _join(self) -> None:
        for thread in self._threads:
            thread.join()

    def _serve(self) -> None:
        opened: list[sqlite3.Connection] = []  # this thread's connection, opened by its first read

        def run(work: Callable[[sqlite3.Connection], Any]) -> Any:
            if not opened:
                opened.append(self._connect())
            result = work(opened[0])
            self.answered_at = time.monotonic()
            return result

        try:
            while (read := self._reads.get()) is not None:
                loop, done, work = read
                if done.cancelled():  # the caller gave up while the read queued
                    continue
                answer(loop, done, functools.partial(run, work))
        finally:
            for conn in opened:
                conn.close()

    def _connect(self, busy_timeout_ms: int | None = None) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        try:
            conn.row_factory = sqlite3.Row
            for pragma in self._pragmas:
                conn.execute(f"PRAGMA {pragma}")
            if busy_timeout_ms is not None:
                conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            if self._prepare is not None:
                self._prepare(conn)
        except BaseException:
            conn.close()
            raise
        return conn


def answer(loop: asyncio.AbstractEventLoop, done: asyncio.Future[T], work: Callable[[], T]) -> None:
    """On a store thread: `work` run, and its result or exception set on `done` in `loop` (not
    through run_in_executor's future chained to a concurrent one, a hop each read or commit
    would make)."""
    try:
        result, error = work(), None
    except Exception as exc:  # noqa: BLE001 - not swallowed: the caller's await raises it
        result, error = None, exc
    try:
        loop.call_soon_threadsafe(settle, done, result, error)
    except RuntimeError:  # the loop closed meanwhile: nobody is waiting
        pass


def settle(done: asyncio.Future[Any], result: Any, error: Exception | None) -> None:
    """On the event loop: a thread's outcome set on the future its caller awaits (unless it gave up)."""
    if done.cancelled():
        return
    if error is None:
        done.set_result(result)
    else:
        done.set_exception(error)
