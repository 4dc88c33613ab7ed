"""How many concurrent streams memproxy holds with zero errors, memory on.

N clients each open one streaming chat completion at once: 20 s streams at 50 events/s
from the mock upstream, through memproxy with memory on (each client one of 20 users, so
every stream is recalled for, accumulated and saved as a turn). For each N it reports:

- errors: a status other than 200, a connection lost, or a stream without `[DONE]`;
- added inter-chunk lateness, p99: each event's arrival at the client against the mock's
  schedule (event k is due k × gap after event 0), minus the same figure for the same N
  streams taken directly from the mock in the same run;
- event-loop responsiveness: `/healthz` answered every 50 ms during the level, p99;
- memproxy's resident memory after the level, and X-Memory-Status `ok` share.

The largest N with zero errors is the figure to report.

    python bench/concurrency.py [--levels 50,100,200,400] [--seconds 20] [--rate 50] [--no-direct]

`--sustained` measures memory under load instead (bench/sustained.py): N clients stream one
request after another for `--duration` seconds, as one user holding `--memory-items` memories;
per level the share of requests whose memory worked, req/s, and memproxy's CPU (by thread, and
with py-spy installed a sampled profile).

    python bench/concurrency.py --sustained [--clients 64,128] [--duration 30] [--memory-items 10000]
                                [--workers 1,2] [--base ../memproxy-main] [--rounds 4] [--store postgres]

`--workers 1,2` measures one process and two worker processes side by side (each its own store,
seeded alike), `--base DIR` adds memproxy from another checkout (one process): the setups take
turns level by level, their order rotating each round. `--store postgres` gives each setup a
database of its own on a PostgreSQL server the run starts, instead of a SQLite file.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import pyspy
from harness.figures import percentile
from harness.loadgen import ClientConnection, Disconnect, Target, chat_payload, connect, get_payload, one, run_client
from harness.measure import StreamShape
from harness.memory import MEMORY_USER, extraction_drained, memory_recovered, searched_in_memory, seed_memories
from harness.report import Column, table
from harness.proc import tree
from harness.targets import REPO, Server, Targets, source_version, throwaway_postgres
from sustained import HEADER, run_sustained, sustained_row, threads_row

USERS = 20
PROBE_EVERY_S = 0.05
ZERO_ERRORS_LEVEL = "largest N with zero errors"
COLUMNS = (Column("N", 6), Column("target", 10, align="<"), Column("errors", 7), Column("late p99 ms", 12, ".2f"),
           Column("added p99 ms", 13, "+.2f"), Column("healthz p50", 10, ".2f"), Column("healthz p99", 10, ".2f"),
           Column("RSS MiB", 8, ".1f"), Column("memory ok", 10, ".1%"))


class TimedConnection(ClientConnection):
    """A client connection that also keeps when each read that completed events arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[tuple[float, int]] = []  # (time, events completed by this read)

    def data_received(self, data: bytes) -> None:
        before = self.reply.events
        super().data_received(data)
        if self.reply.events > before:
            self.arrivals.append((self._now, self.reply.events - before))


@dataclass
class Level:
    """What N concurrent streams saw, through one target."""

    streams: int
    errors: int = 0
    ok_memory: int = 0
    lateness_ms: list[float] = field(default_factory=list)
    probe_ms: list[float] = field(default_factory=list)
    rss_mb: float = 0.0


def lateness(arrivals: list[tuple[float, int]], gap_s: float) -> list[float]:
    """Each event's arrival past its due time, ms; due times count from the first event."""
    if not arrivals:
        return []
    first = arrivals[0][0]
    out, index = [], 0
    for at, count in arrivals:
        for _ in range(count):
            out.append(max(0.0, (at - first - index * gap_s) * 1000))
            index += 1
    return out


async def one_stream(target: Target, payload: bytes, events: int, gap_s: float, level: Level) -> None:
    loop = asyncio.get_running_loop()
    try:
        _, conn = await loop.create_connection(TimedConnection, target.host, target.port)
        try:
            reply = await conn.request(payload, keep_body=True)
        finally:
            conn.close()
    except (Disconnect, OSError):
        level.errors += 1
        return
    body = b"".join(reply.body or [])
    if reply.status != 200 or not body.rstrip().endswith(b"data: [DONE]") or reply.events < events + 1:
        level.errors += 1
        return
    level.ok_memory += reply.memory_status == b"ok"
    level.lateness_ms.extend(lateness(conn.arrivals, gap_s))


async def probe(target: Target, stop: asyncio.Event, level: Level) -> None:
    """GET /healthz every PROBE_EVERY_S on its own connection: how long the event loop takes to answer."""
    conn = await connect(target)
    payload = get_payload(target, "/healthz")
    try:
        while not stop.is_set():
            reply = await conn.request(payload)
            level.probe_ms.append(reply.latency * 1000)
            await asyncio.sleep(PROBE_EVERY_S)
    finally:
        conn.close()


async def run_level(target: Target, server: Server | None, streams: int, events: int, gap_s: float,
                    memory: bool, first: int) -> Level:
    level = Level(streams)
    payloads = []
    for n in range(streams):
        headers = {"x-memory-user": f"concurrency-user-{n % USERS}"} if memory else {}
        make = chat_payload(Target(target.name, target.port, headers), stream=True)
        payloads.append(make(first + n))
    stop = asyncio.Event()
    prober = asyncio.create_task(probe(target, stop, level)) if server is not None else None
    await asyncio.gather(*(one_stream(target, payload, events, gap_s, level) for payload in payloads))
    stop.set()
    if prober is not None and server is not None:
        await prober
        level.rss_mb = server.rss_mb()
    return level


def row(name: str, level: Level, direct: Level | None) -> tuple[Any, ...]:
    """A level's line of the table (COLUMNS), through one target; `direct`: the same N from the mock."""
    def ms(values: list[float], q: float) -> float | None:
        return percentile(values, q) if values else None

    added = None
    if direct is not None and direct.lateness_ms and level.lateness_ms:
        added = percentile(level.lateness_ms, 99) - percentile(direct.lateness_ms, 99)
    served = level.streams - level.errors
    ok = level.ok_memory / served if name == "memproxy" and served else None
    return (level.streams, name, level.errors, ms(level.lateness_ms, 99), added, ms(level.probe_ms, 50),
            ms(level.probe_ms, 99), level.rss_mb or None, ok)


async def main_async(args: argparse.Namespace, mock: Server, memproxy: Server) -> list[str]:
    gap_s = 1 / args.rate
    events = int(args.seconds * args.rate)
    proxied = Target("memproxy", memproxy.port)
    direct = Target("direct", mock.port)
    rows = []
    held = 0
    first = 0
    for streams in args.levels:
        base = None
        if not args.no_direct:
            print(f"{streams} streams from the mock directly ...", file=sys.stderr)
            base = await run_level(direct, None, streams, events, gap_s, False, first)
        print(f"{streams} streams through memproxy ...", file=sys.stderr)
        level = await run_level(proxied, memproxy, streams, events, gap_s, True, first)
        first += streams
        if base is not None:
            rows.append(row("direct", base, None))
        rows.append(row("memproxy", level, base))
        if level.errors == 0:
            held = max(held, streams)
    return [table(COLUMNS, rows), f"{ZERO_ERRORS_LEVEL}: {held or 'none'}"]


@dataclass
class Setup:
    """One memproxy measured in the sustained run: its label, its process, its own seeded store."""

    label: str
    server: Server
    names: dict[int, str] = field(default_factory=dict)  # thread id -> name (py-spy), one process only


async def prepared(args: argparse.Namespace, setup: Setup) -> list[str]:
    """Seed the setup's store and warm it up; the lines that say how long that took."""
    target = Target("memproxy", setup.server.port)
    lines = []
    if args.memory_items:
        print(f"{setup.label}: seeding {args.memory_items} memories for {MEMORY_USER} ...", file=sys.stderr)
        seeded = await seed_memories(target, MEMORY_USER, args.memory_items)
        lines.append(f"{setup.label}: seeded {seeded['items']:.0f} memories in {seeded['seconds']:.1f} s, "
                     f"{seeded['errors']:.0f} errors")
        drained = await extraction_drained(target)
        lines.append(f"{setup.label}: their extraction queue drained {drained:.1f} s after seeding "
                     "(-1: not within its bound)")
    warm = Target("memproxy", setup.server.port, {"x-memory-user": MEMORY_USER, "x-memory-persist": "false"})
    for n in range(20):
        await one(warm, chat_payload(warm, stream=False)(n))
    built = await searched_in_memory(target, MEMORY_USER)
    lines.append(f"{setup.label}: the user's searches answered from memory {built:.1f} s after the warm-up "
                 "(-1: not within its bound)")
    if pyspy.available() and len(tree(setup.server.pid)) == 1:
        setup.names = pyspy.thread_names(setup.server.pid)
    return lines


async def sustained_async(args: argparse.Namespace, mock: Server, setups: list[Setup], workdir: Path) -> list[str]:
    """Seed and warm up every setup, then every level of streaming clients on each setup in turn
    (the setups' order rotates round by round), round after round."""
    shape = StreamShape(args.stream_events, args.stream_gap_ms)
    lines = []
    for setup in setups:
        lines += await prepared(args, setup)
    lines.append(f"{'setup':<12} " + HEADER)
    first = 1_000_000
    for r in range(args.rounds):
        for clients in args.clients:
            for setup in setups[r % len(setups):] + setups[:r % len(setups)]:
                target = Target("memproxy", setup.server.port)
                waited = await memory_recovered(target, MEMORY_USER)
                print(f"round {r + 1}: {setup.label}, {clients} streaming clients for {args.duration:g} s "
                      f"(breaker closed after {waited:.1f} s) ...", file=sys.stderr)
                profile = workdir / f"profile-r{r + 1}-c{clients}-{setup.label}.raw"
                sampler = pyspy.record(setup.server.pid, args.duration, profile) if args.profile else None
                level = await run_sustained(target, setup.server, mock, clients, args.duration, shape.headers(),
                                            shape.expected_events(), first, setup.names, args.ramp)
                first += 1_000_000
                lines += [f"{setup.label:<12} " + sustained_row(level), f"{'':<12} " + threads_row(level)]
                if sampler is not None:
                    await asyncio.to_thread(sampler.wait)
                    lines += [f"{'':>7} py-spy, {profile.name}:"] + pyspy.summary(profile)
                print(f"{setup.label:<12} " + sustained_row(level), file=sys.stderr)
    return lines


def sustained(args: argparse.Namespace) -> int:
    with Targets("memproxy-sustained-") as targets, ExitStack() as cleanup:
        postgres = cleanup.enter_context(throwaway_postgres()) if args.store == "postgres" else None

        def store_url(name: str) -> str | None:
            """A database of the setup's own on the run's PostgreSQL server (None: a SQLite file of its own)."""
            if postgres is None:
                return None
            run_client(created_database(postgres.url(), name))
            return postgres.url(name)

        mock = targets.mock(args.stream_events, args.stream_gap_ms)
        setups = [Setup(f"workers {n}", targets.memproxy(mock.url("/v1"), source=args.memproxy_dir,
                                                        name=f"memproxy-w{n}", workers=n,
                                                        store_url=store_url(f"bench_w{n}")))
                  for n in args.workers]
        if args.base is not None:
            setups.append(Setup("base", targets.memproxy(mock.url("/v1"), source=args.base, name="memproxy-base",
                                                         store_url=store_url("bench_base"))))
        started = time.perf_counter()
        lines = run_client(sustained_async(args, mock, setups, targets.workdir))
        elapsed = time.perf_counter() - started
    base = f"; base: {source_version(args.base)}, one process" if args.base is not None else ""
    print(f"memproxy {source_version(args.memproxy_dir)}{base}: streaming clients in a closed loop, "
          f"{args.duration:g} s per level ({f'joining over {args.ramp:g} s' if args.ramp else 'all starting at once'}), "
          f"streams of {args.stream_events} chunks {args.stream_gap_ms:g} ms apart, memory on for "
          f"{MEMORY_USER} ({args.memory_items} memories, every request saved, {args.store}); {elapsed:.0f} s;"
          f" logs in {targets.workdir}")
    print("CPU in cores (CPU seconds per wall second), each setup's workers summed; 2 cores here are shared by "
          "memproxy, the mock and this client")
    for line in lines:
        print(line)
    return 0


async def created_database(server_url: str, name: str) -> None:
    """CREATE DATABASE `name` on the server at `server_url`."""
    import asyncpg

    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="50,100,200,400", help="concurrent streams, one level after another")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each stream")
    parser.add_argument("--rate", type=float, default=50.0, help="events per second in each stream")
    parser.add_argument("--no-direct", action="store_true", help="skip the direct baseline of each level")
    sustained_mode = parser.add_argument_group("--sustained: streaming clients in a closed loop, memory on")
    sustained_mode.add_argument("--sustained", action="store_true", help="measure memory under load instead")
    sustained_mode.add_argument("--clients", default="64,128", help="concurrent streaming clients per level")
    sustained_mode.add_argument("--duration", type=float, default=30.0, help="seconds per level")
    sustained_mode.add_argument("--rounds", type=int, default=1, help="times every level runs")
    sustained_mode.add_argument("--stream-events", type=int, default=50, help="chunk events per stream")
    sustained_mode.add_argument("--stream-gap-ms", type=float, default=20.0, help="time between two chunk events")
    sustained_mode.add_argument("--memory-items", type=int, default=10_000, help="memories stored for the user first")
    sustained_mode.add_argument("--ramp", type=float, default=0.0,
                                help="seconds over which the clients join (0: all at once)")
    sustained_mode.add_argument("--profile", action="store_true", help="sample memproxy with py-spy at each level")
    sustained_mode.add_argument("--memproxy-dir", type=Path, default=REPO, help="run memproxy from this checkout")
    sustained_mode.add_argument("--workers", default="1",
                                help="worker processes (memproxy serve --workers): a list measures each side by side")
    sustained_mode.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite",
                                help="each setup's store: a SQLite file, or a database on a PostgreSQL server "
                                     "the run starts (needs initdb and pg_ctl)")
    sustained_mode.add_argument("--base", type=Path, default=None,
                                help="also measure memproxy from this checkout (one process), side by side")
    args = parser.parse_args(argv)
    args.levels = [int(n) for n in args.levels.split(",") if n.strip()]
    args.clients = [int(n) for n in args.clients.split(",") if n.strip()]
    args.workers = [int(n) for n in args.workers.split(",") if n.strip()]
    args.memproxy_dir = args.memproxy_dir.resolve()
    args.base = args.base.resolve() if args.base is not None else None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.sustained:
        return sustained(args)
    events = int(args.seconds * args.rate)
    with Targets("memproxy-concurrency-") as targets:
        mock = targets.mock(events, 1000 / args.rate)
        memproxy = targets.memproxy(mock.url("/v1"))
        started = time.perf_counter()
        lines = run_client(main_async(args, mock, memproxy))
        elapsed = time.perf_counter() - started
    print(f"streams of {events} events at {args.rate:g}/s ({args.seconds:g} s), memory on for {USERS} users, "
          f"SQLite store, one worker; {elapsed:.0f} s; logs in {targets.workdir}")
    print("late: an event's arrival past its due time on the mock's schedule; added: memproxy's late p99 minus "
          "direct's at the same N; healthz: /healthz answered every 50 ms meanwhile")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
