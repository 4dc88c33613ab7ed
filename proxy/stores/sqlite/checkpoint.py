"""WAL checkpoints off the write path.

By default SQLite checkpoints inside the commit that takes the WAL past 1,000 pages: that
commit copies the pages into the database and syncs it, and the answer waiting on it
(committed before the response's last byte) goes out 5-10 ms later. Measured on the overhead benchmark's store, a
turn's answer commit took 7.4 ms at p99 with it and 0.74 ms without. So the writer's
connection never checkpoints (`wal_autocheckpoint=0`) and this thread does, once a second
while the WAL holds frames, PASSIVE: it neither waits for nor blocks the writer or readers.

The next write rewinds the WAL once a checkpoint has copied all of it, but only when no
reader is still inside it. Under steady load some reader always is, so the WAL never
rewinds: it reached 290 MB after 3,000 turns at c=1, disk and page cache held for nothing.
So past WAL_TRUNCATE_BYTES the thread checkpoints with TRUNCATE instead: it waits (within
the busy timeout) for the readers inside the WAL to finish, holding new writes back
meanwhile, which costs a few milliseconds, and empties the file.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Sequence

log = logging.getLogger("memproxy.store")

CHECKPOINT_EVERY_S = 1.0
STOP_WAIT_S = 5.0
WAL_TRUNCATE_BYTES = 64 * 1024 * 1024  # a few hundred turns a second fill it in about two seconds


class Checkpointer:
    """A thread with its own connection that checkpoints the WAL every `every_s` seconds."""

    def __init__(self, path: str, pragmas: Sequence[str], every_s: float = CHECKPOINT_EVERY_S,
                 truncate_bytes: int = WAL_TRUNCATE_BYTES) -> None:
        self._path = path
        self._pragmas = tuple(pragmas)
        self._every_s = every_s
        self._truncate_bytes = truncate_bytes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memproxy-sqlite-checkpoint", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the checkpoint in progress, if any (the last connection's close checkpoints)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(STOP_WAIT_S)

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            log.error("WAL checkpoints: cannot open %s (%s); the WAL grows until restart", self._path, exc)
            return
        try:
            for pragma in self._pragmas:
                conn.execute(f"PRAGMA {pragma}")
            while not self._stop.wait(self._every_s):
                if wal_bytes(self._path) > self._truncate_bytes:
                    checkpoint_truncate(conn)
                else:
                    checkpoint_passive(conn)
        finally:
            conn.close()


def checkpoint_passive(conn: sqlite3.Connection) -> int:
    """Copy what the WAL holds into the database without waiting on anyone; frames copied."""
    try:
        _, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    except sqlite3.Error as exc:
        log.warning("WAL checkpoint failed (%s); retrying in %.0f s", exc, CHECKPOINT_EVERY_S)
        return 0
    return int(copied) if frames > 0 else 0


def checkpoint_truncate(conn: sqlite3.Connection) -> bool:
    """Copy the whole WAL into the database, wait for its readers, and empty it; True when done."""
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    except sqlite3.Error as exc:
        log.warning("WAL truncation failed (%s); retrying in %.0f s", exc, CHECKPOINT_EVERY_S)
        return False
    return not busy


def wal_bytes(path: str) -> int:
    """The size of the database's WAL file (0 when there is none)."""
    try:
        return os.path.getsize(f"{path}-wal")
    except OSError:
        return 0
