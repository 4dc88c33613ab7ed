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
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg

from harness.figures import per_request_ms
from harness.loadgen import ClosedLoop, Target, numbered, run_client, wire_payload
from harness.memory import searched_in_memory, seed_memories
from harness.proc import command_cpu_seconds
from harness.report import Column, header, row
from harness.targets import REPO, Server, Targets, throwaway_postgres

if TYPE_CHECKING:
    from tests.pg_server import PostgresServer

MEMORIES = 2000
WARM_S = 3.0
COLUMNS = (Column("setup", 7), Column("requests/s", 11, ".0f"), Column("ok", 7, ".1%"),
           Column("memproxy cores", 15, ".2f"), Column("CPU ms/req", 11, ".2f"), Column("PostgreSQL cores", 16, ".2f"))


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
    return command_cpu_seconds(("postgres", "postmaster"))


async def measure(setup: str, servers: list[Server], args: argparse.Namespace) -> str:
    user = f"bench-{setup}"
    targets = [Target(s.name, s.port, {"x-memory-user": user}) for s in servers]
    await seed_memories(targets[0], user, MEMORIES)
    for target in targets:
        await searched_in_memory(target, user)
    loops = []
    for i, target in enumerate(targets):
        share = args.connections // len(targets) + (i < args.connections % len(targets))
        # Request n of a replica's load asks question i * 10**7 + n: no two replicas send the same text.
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
    database_cores = database / elapsed if setup != "sqlite" else None
    return row(COLUMNS, (setup, len(replies) / elapsed, ok, cpu / elapsed, per_request_ms(cpu, len(replies)),
                         database_cores))


async def bench(args: argparse.Namespace, targets: Targets, mock: Server, postgres: PostgresServer | None
                ) -> list[str]:
    lines = []
    for setup in args.setups.split(","):
        if setup == "sqlite":
            urls = [f"sqlite:///{targets.workdir}/{setup}.db"]
        else:
            assert postgres is not None
            database = f"bench_{setup}_{int(time.time())}"
            conn = await asyncpg.connect(postgres.url())
            try:
                await conn.execute(f'CREATE DATABASE "{database}"')
            finally:
                await conn.close()
            urls = [postgres.url(database)] * int(setup.removeprefix("pg"))
        servers = [targets.memproxy(mock.url("/v1"), "warning", args.memproxy_dir, f"{setup}-{i}", store_url=url)
                   for i, url in enumerate(urls)]
        try:
            lines.append(await measure(setup, servers, args))
            print(lines[-1], file=sys.stderr)
        finally:
            for server in servers:
                server.stop()
    return lines




def main() -> int:
    args = parse_args()
    with ExitStack() as stack:
        postgres = None
        if any(s.startswith("pg") for s in args.setups.split(",")):
            postgres = stack.enter_context(throwaway_postgres())
        targets = stack.enter_context(Targets("memproxy-replicas-"))
        lines = run_client(bench(args, targets, targets.mock(), postgres))
    print(f"{args.connections} connections, {MEMORIES} memories for the user, {args.duration:.0f} s a setup;"
          f" logs in {targets.workdir}")
    print(header(COLUMNS))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
