"""Reading a running proxy's SQLite store from a test, and waiting for what it saves."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any


def rows(proxy: Any, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The rows `sql` finds in the proxy's store (its own SQLite file, read beside it)."""
    with sqlite3.connect(proxy.settings.store.url[len("sqlite:///"):]) as db:
        return db.execute(sql, params).fetchall()


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
