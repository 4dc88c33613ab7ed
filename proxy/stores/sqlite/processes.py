"""The processes that have one SQLite file open, so that one starting never takes what another
is still doing for a crash's leftovers.

Every process on a SQLite file runs on one host (WAL needs shared memory), so a process is
named by its host and process id (and an id of its store): whether it still runs is asked
of the operating system, not guessed from a lease. Each store registers its process when it
opens the file and removes it when it closes; a process killed leaves its row behind, and
the next store to open finds it gone and removes it.
"""

from __future__ import annotations

import os
import socket
import sqlite3

from proxy.ids import new_id


def new_process_id() -> str:
    """This store's name: this host, this process, then an id unique to the store."""
    return f"{socket.gethostname()}:{os.getpid()}:{new_id()}"


def gone(process_id: str) -> bool:
    """True when `process_id` names a process of this host that no longer runs."""
    host, _, rest = process_id.partition(":")
    pid, _, _ = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another host's: only time tells
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # it runs, as another user
    return False


def register(conn: sqlite3.Connection, process_id: str, at: float) -> bool:
    """Add this process, drop those gone; True when another live process has the file open.

    Runs inside the caller's transaction on the write connection."""
    others = [name for (name,) in conn.execute("SELECT id FROM processes WHERE id != ?", (process_id,))]
    dead = [name for name in others if gone(name)]
    conn.executemany("DELETE FROM processes WHERE id = ?", [(name,) for name in dead])
    conn.execute("INSERT INTO processes (id, opened_at) VALUES (?, ?) ON CONFLICT DO NOTHING", (process_id, at))
    return len(others) > len(dead)


def deregister(conn: sqlite3.Connection, process_id: str) -> None:
    """This process has closed the file."""
    conn.execute("DELETE FROM processes WHERE id = ?", (process_id,))
