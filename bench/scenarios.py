"""What one benchmark step measures: latency, throughput, streaming, and the disconnect storm."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from loadgen import Run, Target, chat_payload, closed_loop, get_payload, one
from processes import Server

Figures = dict[str, float]


@dataclass
class Subject:
    """A target as the benchmark drives it: where requests go and which process serves them."""

    target: Target
    server: Server
    mock: Server


@dataclass(frozen=True)
class StreamShape:
    """The mock's stream for the streaming figures: chunk events (plus [DONE]) and their spacing."""

    events: int
    gap_ms: float

    def headers(self) -> dict[str, str]:
        return {"x-mock-events": str(self.events), "x-mock-delay-ms": str(self.gap_ms)}

    @property
    def expected_events(self) -> int:
        return self.events + 1  # and [DONE]


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of `values`, 0.0 when there are none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


async def _measured(subject: Subject, stream: StreamShape | None, concurrency: int, duration: float
                    ) -> tuple[Run, Figures]:
    """One closed-loop run, with the CPU each process spent during it."""
    target = subject.target
    make = chat_payload(target, stream=stream is not None, extra=stream.headers() if stream else None)
    before = (subject.server.cpu_seconds(), subject.mock.cpu_seconds(), time.process_time())
    warm = chat_payload(target, stream=False)  # a whole stream per connection would only cost time
    run = await closed_loop(target, make, concurrency, duration, min_requests=2, warm=warm)
    after = (subject.server.cpu_seconds(), subject.mock.cpu_seconds(), time.process_time())
    spent = [b - a for a, b in zip(before, after)]
    elapsed = max(run.elapsed, 1e-9)
    return run, {
        "rate": run.rate, "errors": float(run.errors), "requests": float(len(run.replies)),
        "server_cpu": spent[0] / elapsed, "mock_cpu": spent[1] / elapsed, "client_cpu": spent[2] / elapsed,
        "cpu_ms_per_request": 1000 * spent[0] / max(1, len(run.replies)),
    }


async def latency(subject: Subject, concurrency: int, duration: float) -> Figures:
    """Non-streamed chat completions: latency percentiles, rate and CPU per request."""
    run, figures = await _measured(subject, None, concurrency, duration)
    times = [r.latency * 1000 for r in run.replies]
    return {**figures, "p50_ms": percentile(times, 50), "p99_ms": percentile(times, 99)}


async def streaming(subject: Subject, concurrency: int, duration: float, shape: StreamShape) -> Figures:
    """Streamed chat completions: time to first event and to the end, coalescing, streams/s."""
    run, figures = await _measured(subject, shape, concurrency, duration)
    first = [((r.first or r.ended) - r.sent) * 1000 for r in run.replies]
    end = [r.latency * 1000 for r in run.replies]
    events = sum(r.events for r in run.replies)
    incomplete = sum(1 for r in run.replies if r.events != shape.expected_events)
    return {
        **figures, "ttfc_p50_ms": percentile(first, 50), "ttfc_p99_ms": percentile(first, 99),
        "end_p50_ms": percentile(end, 50), "end_p99_ms": percentile(end, 99),
        "events_per_read": events / max(1, sum(r.event_reads for r in run.replies)),
        "incomplete": float(incomplete), "errors": figures["errors"] + incomplete,
        "cpu_us_per_event": 1e6 * figures["cpu_ms_per_request"] / 1000 / max(1, shape.expected_events),
    }


async def fetch_json(target: Target, path: str) -> dict[str, Any]:
    """GET a small JSON document."""
    reply = await one(target, get_payload(target, path))
    return dict(json.loads(b"".join(reply.body or [])))


async def warm_up(subject: Subject, shape: StreamShape) -> None:
    """Fill the proxies' upstream pools and run each code path once before anything is measured."""
    await closed_loop(subject.target, chat_payload(subject.target, stream=False), 64, 0.2)
    await closed_loop(subject.target, chat_payload(subject.target, stream=True, extra=shape.headers()), 4, 0.0)
