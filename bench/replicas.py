"""Memory-on throughput of one memproxy on SQLite beside 1..N replicas sharing one PostgreSQL.

Starts the mock upstream and a throwaway PostgreSQL server (tests/pg_server.py: its binaries
must be installed; fsync off, as a test server), then for each setup seeds 2,000 memories for
one user and runs a closed loop of non-streamed chat requests split evenly over the setup's
processes. Prints requests/s, the share with `X-Memory-Status: ok`, and the CPU of memproxy
and of PostgreSQL. On one machine the database, the replicas and this client share its cores.

    python bench/replicas.py [--setups sqlite,pg1,pg2] [--connections 32] [--duration 10]
                             [--memproxy-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import asyncpg

from loadgen import ClosedLoop, MakeRequest, Target, run_client, wire_payload
from processes import REPO, Server, free_port, start, start_mock
from storm import searched_in_memory, seed_memories

sys.path.insert(0, str(REPO))
from tests.pg_server import PostgresServer, find_binaries  # noqa: E402

MEMORIES = 2000
WARM_S = 3.0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--setups", default="sqlite,pg1,pg2", help="sqlite, or pgN: N replicas on one PostgreSQL")
    p.add_argument("--connections", type=int, default=32, help="closed-loop connections, split over the replicas")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per setup")
    p.add_argument("--memproxy-dir", type=Path, default=REPO, help="the memproxy checkout to run")
    return p.parse_args()


def postgres_cpu_seconds() -> float:
    """CPU seconds of every PostgreSQL process on the machine (the test server's), with those of the
    backends that ended (the postmaster's children's times, once it reaped them)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm", encoding="ascii") as comm:
                if comm.read().strip() not in ("postgres", "postmaster"):
                    continue
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15]) / tick  # utime, stime, cutime, cstime
        except OSError:
            continue  # a backend that ended meanwhile
    return total


def numbered(make: MakeRequest, first: int) -> MakeRequest:
    """Request n of a replica's load asks question first + n: no two replicas send the same text."""
    def numbered_make(n: int) -> bytes:
        return make(first + n)
    return numbered_make


async def measure(setup: str, servers: list[Server], args: argparse.Namespace) -> str:
    user = f"bench-{setup}"
    targets = [Target(s.name, s.port, {"x-memory-user": user}) for s in servers]
    await seed_memories(targets[0], user, MEMORIES)
    for target in targets:
        await searched_in_memory(target, user)
    loops = []
    for i, target in enumerate(targets):
        share = args.connections // len(targets) + (i < args.connections % len(targets))
        loops.append(ClosedLoop(target, numbered(wire_payload(target, stream=False), i * 10**7), share,
                                warm=wire_payload(target, stream=False)))
    try:
        for loop in loops:
            await loop.open()
        await asyncio.gather(*(loop.run(WARM_S) for loop in loops))
        before = [len(loop.total.replies) for loop in loops]
        cpu, database, started = sum(s.cpu_seconds() for s in servers), postgres_cpu_seconds(), time.perf_counter()
        await asyncio.gather(*(loop.run(args.duration) for loop in loops))
        elapsed = time.perf_counter() - started
        cpu, database = sum(s.cpu_seconds() for s in servers) - cpu, postgres_cpu_seconds() - database
    finally:
        for loop in loops:
            loop.close()
    replies = [r for loop, n in zip(loops, before) for r in loop.total.replies[n:]]
    ok = sum(r.memory_status == b"ok" for r in replies) / max(1, len(replies))
    database_cores = f"{database / elapsed:16.2f}" if setup != "sqlite" else f"{'-':>16}"
    return (f"{setup:>7} {len(replies) / elapsed:11.0f} {ok:7.1%} {cpu / elapsed:15.2f}"
            f" {1000 * cpu / max(1, len(replies)):11.2f} {database_cores}")


async def bench(args: argparse.Namespace, work: Path, mock: Server, postgres: PostgresServer | None) -> list[str]:
    lines = []
    for setup in args.setups.split(","):
        if setup == "sqlite":
            urls = [f"sqlite:///{work}/{setup}.db"]
        else:
            assert postgres is not None
            database = f"bench_{setup}_{int(time.time())}"
            conn = await asyncpg.connect(postgres.url())
            try:
                await conn.execute(f'CREATE DATABASE "{database}"')
            finally:
                await conn.close()
            urls = [postgres.url(database)] * int(setup.removeprefix("pg"))
        servers = [start_replica(work, f"{setup}-{i}", url, mock, args.memproxy_dir) for i, url in enumerate(urls)]
        try:
            lines.append(await measure(setup, servers, args))
            print(lines[-1], file=sys.stderr)
        finally:
            for server in servers:
                server.stop()
    return lines


def start_replica(work: Path, name: str, url: str, mock: Server, source: Path) -> Server:
    port = free_port()
    config = work / f"{name}.yaml"
    config.write_text(f"server:\n  log_level: warning\nstore:\n  url: {url}\n")
    argv = [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port),
            "--upstream", f"http://127.0.0.1:{mock.port}"]
    return start(name, argv, port, work, source)


def main() -> int:
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="memproxy-replicas-"))
    postgres = None
    if any(s.startswith("pg") for s in args.setups.split(",")):
        binaries = find_binaries()
        if binaries is None:
            print("PostgreSQL server binaries (initdb, pg_ctl) not found", file=sys.stderr)
            return 1
        postgres = PostgresServer(binaries)
        postgres.init()
        postgres.start()
    mock = start_mock(work, 50, 5.0)
    try:
        lines = run_client(bench(args, work, mock, postgres))
    finally:
        mock.stop()
        if postgres is not None:
            postgres.remove()
    print(f"{args.connections} connections, {MEMORIES} memories for the user, {args.duration:.0f} s a setup;"
          f" logs in {work}")
    print("  setup  requests/s      ok  memproxy cores  CPU ms/req  PostgreSQL cores")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
