"""The read side of SQLiteStore: a few threads, each owning one read connection.

Retrieval asks its five sources at once. On a single read connection their statements
queued behind each other; SQLite releases the GIL while it steps a statement, so on a few
threads they run side by side (WAL lets any number of readers beside the writer). A thread
opens its connection the first time it runs a read and is the only one ever to use it, so
a caller cancelled mid-read leaves no connection shared between two threads.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

Prepare = Callable[[sqlite3.Connection], None]


class ReadPool:
    """`size` read connections on `size` threads; `run(work)` calls `work(connection)` on one."""

    def __init__(self, path: str, pragmas: Sequence[str], size: int, prepare: Prepare | None = None) -> None:
        if size < 1:
            raise ValueError(f"a read pool needs at least one connection, not {size}")
        self._path = path
        self._pragmas = tuple(pragmas)
        self._prepare = prepare
        self._threads = ThreadPoolExecutor(max_workers=size, thread_name_prefix="memproxy-sqlite-reader")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._opened: list[sqlite3.Connection] = []

    def _connection(self) -> sqlite3.Connection:
        """This thread's connection, opened on first use."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            # Another thread closes it at shutdown, once this one has stopped.
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            try:
                conn.row_factory = sqlite3.Row
                for pragma in self._pragmas:
                    conn.execute(f"PRAGMA {pragma}")
                if self._prepare is not None:
                    self._prepare(conn)
            except BaseException:
                conn.close()
                raise
            with self._lock:
                self._opened.append(conn)
            self._local.conn = conn
        return conn

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work(connection)` on a reader thread; RuntimeError once the pool is closing."""
        return await asyncio.get_running_loop().run_in_executor(self._threads, lambda: work(self._connection()))

    async def close(self) -> None:
        """Let the reads already asked for finish, then close every connection."""
        await asyncio.get_running_loop().run_in_executor(None, self._threads.shutdown)
        with self._lock:
            opened, self._opened = self._opened, []
        for conn in opened:
            conn.close()
