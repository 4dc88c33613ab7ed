"""What /proc says about a process: CPU time (whole, or by thread), resident memory, open files."""

from __future__ import annotations

import os
import time

_TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(path: str) -> list[str]:
    """The fields of a /proc .../stat file after the command name (which may hold spaces)."""
    with open(path, encoding="ascii") as handle:
        return handle.read().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int, reaped_children: bool = False) -> float:
    """User + system CPU time of `pid` so far, clock-tick resolution; with `reaped_children`, also that of
    the children it waited for (a PostgreSQL postmaster's ended backends)."""
    fields = _stat_fields(f"/proc/{pid}/stat")
    used = fields[11:15] if reaped_children else fields[11:13]  # utime, stime[, cutime, cstime]
    return sum(int(f) for f in used) / _TICK


def tree(pid: int) -> list[int]:
    """`pid` and its live descendants (a `memproxy serve --workers N` supervisor and its workers)."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            parent = int(_stat_fields(f"/proc/{entry}/stat")[1])
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid` and its live descendants, with those of the children each reaped (a worker
    that died and was replaced still counts); a process ending meanwhile is skipped."""
    total = 0.0
    for member in tree(pid):
        try:
            total += cpu_seconds(member, reaped_children=member != pid)
        except OSError:
            continue
    return total


def own_cpu_seconds() -> float:
    """User + system CPU time of this process (the load client) so far."""
    return time.process_time()


def thread_cpu(pid: int, names: dict[int, str]) -> dict[str, float]:
    """CPU seconds per thread of `pid`, by name where known (`names`: thread id -> name), else by id."""
    spent: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return spent
    for tid in tids:
        try:
            fields = _stat_fields(f"/proc/{pid}/task/{tid}/stat")
        except OSError:
            continue  # the thread ended meanwhile
        name = names.get(int(tid), f"thread {tid}")
        spent[name] = spent.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / _TICK
    return spent


def command_cpu_seconds(commands: tuple[str, ...]) -> float:
    """CPU seconds of every process on the machine whose command is one of `commands`, with those of the
    children each reaped (processes that end meanwhile are skipped)."""
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm", encoding="ascii") as comm:
                if comm.read().strip() not in commands:
                    continue
            total += cpu_seconds(int(pid), reaped_children=True)
        except OSError:
            continue
    return total


def status_mb(pid: int | str, field: str) -> float:
    """A memory line of /proc/<pid>/status (`VmRSS`, `VmHWM`) in MiB; `pid` may be "self"."""
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def open_fds(pid: int) -> int:
    """Open file descriptors of `pid` (/proc/<pid>/fd)."""
    return len(os.listdir(f"/proc/{pid}/fd"))
