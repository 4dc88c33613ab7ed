"""The processes that have one SQLite file open, so that one starting never takes what another
is still doing for a crash's leftovers.

Every process on a SQLite file runs on one host (WAL needs shared memory), so a process is
named by where it runs, its process id, when that process started, and an id of its store:
whether it still runs is asked of the operating system, not guessed from a lease. Each store
registers its process when it opens the file and removes it when it closes; a process killed
leaves its row behind, and the next store to open finds it gone and removes it.

Where a process runs is its host name and, on Linux, the host's boot and its pid namespace:
two containers may share a host name and one file, and a process id says nothing outside its
own namespace; a process of an earlier boot of this host is gone. Process ids are reused
(Linux hands out at most 32,768 by default, and a container's restart gives its processes the
same ids again), so a pid that runs names the same process only if it started when that
process did (`/proc/PID/stat`; where there is no /proc, the pid alone is asked).
"""

from __future__ import annotations

import os
import socket
import sqlite3

from proxy.ids import new_id


def _where() -> tuple[str, str, str]:
    """This host's name, and on Linux the host's boot and this process's pid namespace ('' when unknown)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot_id:
            boot = boot_id.read().strip()
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        boot = namespace = ""
    return socket.gethostname(), boot, namespace


def _started(pid: int) -> str:
    """When process `pid` started, as the kernel counts (clock ticks since boot); '' when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # The command name, in parentheses, may hold spaces: the fields after it are split.
            fields = stat.read().rpartition(b")")[2].split()
    except OSError:
        return ""
    return fields[19].decode() if len(fields) > 19 else ""


def new_process_id() -> str:
    """This store's name: where it runs, this process and when it started, then an id unique to the store."""
    pid = os.getpid()
    return f"{'/'.join(_where())}:{pid}:{_started(pid)}:{new_id()}"


def gone(process_id: str) -> bool:
    """True when `process_id` names a process of this host and pid namespace that no longer runs, or one
    of an earlier boot of this host."""
    where, _, rest = process_id.partition(":")
    pid, _, rest = rest.partition(":")
    started, _, _ = rest.partition(":")
    host, _, rest = where.partition("/")
    boot, _, namespace = rest.partition("/")
    here, boot_here, namespace_here = _where()
    if host != here or not pid.isdigit():
        return False  # another host's: only time tells
    if boot and boot_here and boot != boot_here:
        return True  # this host has restarted since
    if (boot, namespace) != (boot_here, namespace_here):
        return False  # another namespace's: only time tells
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it runs, as another user
    return bool(started) and _started(int(pid)) not in ("", started)  # the pid now names another process


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
