"""Streaming clients in a closed loop, memory on, against a seeded store: how many keep their memory.

N clients each stream one chat completion after another for a fixed time (the mock's stream:
`events` chunks `gap_ms` apart, so each lasts about events × gap), all as one user holding
`--memory-items` stored memories, every request a new question. The figures per level: the
share of requests with `X-Memory-Status: ok`, the others by their degraded reason, errors,
requests/s, and the CPU of memproxy (per thread), the mock and this client.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from harness.figures import percentile
from harness.loadgen import Disconnect, Reply, Target, chat_payload, connect
from harness.memory import MEMORY_USER
from harness.proc import own_cpu_seconds, thread_cpu, tree
from harness.report import Column, header, row
from harness.targets import Server


@dataclass
class Sustained:
    """What N streaming clients in a closed loop saw, and what the processes spent meanwhile."""

    clients: int
    seconds: float = 0.0
    errors: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    first_event_ms: list[float] = field(default_factory=list)
    server_cpu: float = 0.0  # cores: CPU seconds per wall second
    server_threads: dict[str, float] = field(default_factory=dict)  # thread name -> cores
    mock_cpu: float = 0.0
    client_cpu: float = 0.0
    sources_cut: int = 0  # retrieval sources skipped at their deadline (the block was built without them)

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    @property
    def ok_share(self) -> float:
        return self.statuses["ok"] / self.requests if self.requests else 0.0

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def degraded(self) -> str:
        """Every status other than ok, with its count: `retrieval timeout 12, circuit open 3`."""
        rest = [(s.removeprefix("degraded: "), n) for s, n in self.statuses.most_common() if s != "ok"]
        return ", ".join(f"{s} {n}" for s, n in rest) or "none"




async def run_sustained(target: Target, server: Server, mock: Server, clients: int, seconds: float,
                        stream_headers: dict[str, str], expected_events: int, first: int,
                        thread_names: dict[int, str], ramp_s: float = 0.0) -> Sustained:
    """`clients` connections streaming memory-on requests back to back for `seconds`; client i
    starts `i * ramp_s / clients` seconds in (0: all at once, a burst of cold requests first)."""
    level = Sustained(clients)
    memory_on = Target(target.name, target.port, {"x-memory-user": MEMORY_USER})
    make = chat_payload(memory_on, stream=True, extra=stream_headers)
    numbers = iter(range(first, first + 10_000_000))
    conns = [await connect(target) for _ in range(clients)]
    deadline = time.perf_counter() + seconds

    def count(reply: Reply) -> None:
        complete = reply.status == 200 and reply.events >= expected_events
        level.errors += not complete
        level.statuses[reply.memory_status.decode() or "absent"] += 1
        if reply.first is not None:
            level.first_event_ms.append((reply.first - reply.sent) * 1000)

    async def client(i: int) -> None:
        await asyncio.sleep(i * ramp_s / clients)
        while time.perf_counter() < deadline:
            try:
                count(await conns[i].request(make(next(numbers))))
            except Disconnect:
                level.errors += 1
                conns[i] = await connect(target)

    log_from = server.log.stat().st_size
    server_before, mock_before, client_before = server.cpu_seconds(), mock.cpu_seconds(), own_cpu_seconds()
    threads_before = process_threads(server.pid, thread_names)
    started = time.perf_counter()
    try:
        await asyncio.gather(*(client(i) for i in range(clients)))
    finally:
        for conn in conns:
            conn.close()
    level.seconds = time.perf_counter() - started
    level.server_cpu = (server.cpu_seconds() - server_before) / level.seconds
    level.mock_cpu = (mock.cpu_seconds() - mock_before) / level.seconds
    level.client_cpu = (own_cpu_seconds() - client_before) / level.seconds
    threads_after = process_threads(server.pid, thread_names)
    level.server_threads = {name: (spent - threads_before.get(name, 0.0)) / level.seconds
                            for name, spent in threads_after.items()}
    level.sources_cut = sources_cut(server.log, log_from)
    return level


def process_threads(pid: int, names: dict[int, str]) -> dict[str, float]:
    """CPU seconds of memproxy by thread name (`names`, from py-spy), and with `--workers`, of each worker
    process as a whole (`worker <pid>`): the supervisor's own threads are idle."""
    spent = thread_cpu(pid, names)
    for member in tree(pid)[1:]:
        spent[f"worker {member}"] = sum(thread_cpu(member, {}).values())
    return spent


def sources_cut(log: Path, start: int) -> int:
    """Retrieval sources memproxy logged as skipped (`retrieval: source ... failed`) past byte `start` of its log."""
    with open(log, "rb") as handle:
        handle.seek(start)
        return handle.read().count(b"retrieval: source ")


COLUMNS = (Column("clients", 7), Column("requests", 8), Column("req/s", 6, ".1f"), Column("ok", 7, ".1%"),
           Column("errors", 6), Column("first event p50/p99 ms", 22), Column("memproxy CPU", 12, ".2f"),
           Column("mock CPU", 8, ".2f"), Column("client CPU", 10, ".2f"), Column("sources cut", 11),
           Column("degraded", 0, align="<"))
HEADER = header(COLUMNS)


def sustained_row(level: Sustained) -> str:
    first = f"{percentile(level.first_event_ms, 50):.0f} / {percentile(level.first_event_ms, 99):.0f}"
    return row(COLUMNS, (level.clients, level.requests, level.rate, level.ok_share, level.errors, first,
                         level.server_cpu, level.mock_cpu, level.client_cpu, level.sources_cut, level.degraded()))


def threads_row(level: Sustained) -> str:
    """memproxy's CPU by thread, cores, busiest first."""
    busy = sorted(((cores, name) for name, cores in level.server_threads.items() if cores >= 0.005), reverse=True)
    return f"{'':>7} memproxy threads, cores: " + ", ".join(f"{name} {cores:.2f}" for cores, name in busy)
