"""Targets measured side by side: the order they take turns in, and a burst of requests on one of them.

On a shared machine a figure measured in one block catches whatever else ran then. Here the
targets take turns within each round, the order changing from round to round, so a burst of
outside load hits them alike; the figures to read are the medians over rounds of per-round
differences or ratios (figures.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from .figures import per_request_ms, percentile
from .loadgen import ClosedLoop
from .targets import Server

T = TypeVar("T")


def alternating(items: Sequence[T], round_no: int) -> list[T]:
    """The items in order on even rounds, reversed on odd ones: each is first as often as last."""
    return list(items) if round_no % 2 == 0 else list(items)[::-1]


def rotating(items: Sequence[T], round_no: int) -> list[T]:
    """The items rotated by `round_no`: each goes first in turn."""
    shift = round_no % len(items) if items else 0
    return list(items[shift:]) + list(items[:shift])


@dataclass(frozen=True)
class Burst:
    """One burst's figures: latency p50 and p99, the server's CPU per request, errors."""

    p50_ms: float
    p99_ms: float
    cpu_ms: float
    requests: int
    errors: int


async def burst(load: ClosedLoop, server: Server, requests: int) -> Burst:
    """`requests` requests on `load`'s open connections, with the CPU `server` spent meanwhile.

    A fixed count, not a duration: with memory on, the faster side would otherwise save more
    turns, and its later searches would have more to match. Connections the server closed while
    the load sat idle (past its keep-alive) are opened again first.
    """
    await load.reopen_closed()
    cpu = server.cpu_seconds()
    run = await load.run(0.0, min_requests=requests)
    latencies = [reply.latency * 1000 for reply in run.replies]
    return Burst(percentile(latencies, 50), percentile(latencies, 99),
                 per_request_ms(server.cpu_seconds() - cpu, len(latencies)), len(latencies), run.errors)
