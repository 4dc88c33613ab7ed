"""Reading a running proxy's SQLite store from a test, and waiting for what it saves."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any


def store_path(proxy: Any) -> str:
    """The proxy's SQLite file."""
    return str(proxy.settings.store.url[len("sqlite:///"):])


@contextmanager
def sqlite_file(path: str | Path) -> Iterator[sqlite3.Connection]:
    """A connection to a SQLite file: committed when the block ends well, rolled back when it
    raises, closed either way (sqlite3's own `with` only commits, and an unclosed connection
    warns on Python 3.13)."""
    with closing(sqlite3.connect(path)) as db, db:
        yield db


def rows(proxy: Any, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The rows `sql` finds in the proxy's store (its own SQLite file, read beside it)."""
    with sqlite_file(store_path(proxy)) as db:
        return db.execute(sql, params).fetchall()


def rows_together(proxy: Any, *queries: str) -> list[list[tuple[Any, ...]]]:
    """Each query's rows, all read in one snapshot: a commit landing between two reads cannot
    show the second a row whose parent the first did not see."""
    with closing(sqlite3.connect(store_path(proxy), isolation_level=None)) as db:
        db.execute("BEGIN")
        try:
            return [db.execute(sql).fetchall() for sql in queries]
        finally:
            db.execute("COMMIT")


def eventually(check: Callable[[], Any], timeout: float = 5.0) -> bool:
    """True once `check()` is, polling until `timeout` seconds have passed (a store locked
    for a moment counts as not yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return True
        except sqlite3.OperationalError:
            pass
        time.sleep(0.02)
    return bool(check())


def settled_turns(proxy: Any, turns: int, timeout: float = 5.0) -> list[tuple[Any, ...]]:
    """The turns' statuses in order, once there are `turns` of them and none is pending."""
    def settled() -> bool:
        found = rows(proxy, "SELECT status FROM turns")
        return len(found) == turns and all(status != "pending" for (status,) in found)

    eventually(settled, timeout)
    return rows(proxy, "SELECT status FROM turns ORDER BY seq")
