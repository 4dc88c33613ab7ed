"""A load measured in slices: latency, throughput and stream figures, and the CPU each process spent."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .figures import per_request_ms, percentile
from .loadgen import ClosedLoop, Run, Target, closed_loop, get_payload, numbered, one, wire_payload
from .mock_upstream import GEMINI_FRAMING_EVENTS, MESSAGES_FRAMING_EVENTS, RESPONSES_FRAMING_EVENTS
from .proc import own_cpu_seconds
from .targets import Server

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

    def expected_events(self, wire: str = "chat") -> int:
        """SSE events a complete stream brings: the chunks and [DONE], or a Messages, Responses or Gemini
        stream's framing."""
        return self.events + {"messages": MESSAGES_FRAMING_EVENTS, "responses": RESPONSES_FRAMING_EVENTS,
                              "gemini": GEMINI_FRAMING_EVENTS}.get(wire, 1)


class Measured:
    """A closed-loop load on one subject, run in slices, with the CPU each process spends in them.

    Its requests are numbered from `first` (the number is in the question's text).
    """

    def __init__(self, subject: Subject, concurrency: int, stream: StreamShape | None, first: int = 0) -> None:
        target = subject.target
        make = wire_payload(target, stream=stream is not None, extra=stream.headers() if stream else None)
        # Warm each connection with a plain request: a whole stream per connection would only cost time.
        self.load = ClosedLoop(target, numbered(make, first), concurrency, warm=wire_payload(target, stream=False))
        self.subject = subject
        self.stream = stream
        self.cpu = [0.0, 0.0, 0.0]  # server, mock, this client

    def _clocks(self) -> tuple[float, float, float]:
        return self.subject.server.cpu_seconds(), self.subject.mock.cpu_seconds(), own_cpu_seconds()

    async def open(self) -> None:
        await self.load.open()

    async def slice(self, duration: float) -> None:
        """Run for `duration` seconds (at least one request)."""
        before = self._clocks()
        await self.load.run(duration)
        self.cpu = [total + b - a for total, a, b in zip(self.cpu, before, self._clocks())]

    def close(self) -> None:
        self.load.close()

    def figures(self) -> Figures:
        """All the slices' figures: latency ones, or streaming ones for a stream."""
        run = self.load.total
        elapsed = max(run.elapsed, 1e-9)
        common = {
            "rate": run.rate, "errors": float(run.errors), "requests": float(len(run.replies)),
            "server_cpu": self.cpu[0] / elapsed, "mock_cpu": self.cpu[1] / elapsed, "client_cpu": self.cpu[2] / elapsed,
            "cpu_ms_per_request": per_request_ms(self.cpu[0], len(run.replies)),
            "memory_ok": sum(r.memory_status == b"ok" for r in run.replies) / max(1, len(run.replies)),
        }
        if self.stream is None:
            return {**common, **_latency_figures(run)}
        return {**common, **_stream_figures(run, self.stream.expected_events(self.subject.target.wire), common)}


def _latency_figures(run: Run) -> Figures:
    times = [r.latency * 1000 for r in run.replies]
    return {"p50_ms": percentile(times, 50), "p99_ms": percentile(times, 99)}


def _stream_figures(run: Run, expected_events: int, common: Figures) -> Figures:
    """Time to first event and to the end, events per read (1.0: no coalescing), CPU per event."""
    first = [((r.first or r.ended) - r.sent) * 1000 for r in run.replies]
    end = [r.latency * 1000 for r in run.replies]
    events = sum(r.events for r in run.replies)
    incomplete = sum(1 for r in run.replies if r.events != expected_events)
    return {
        "ttfc_p50_ms": percentile(first, 50), "ttfc_p99_ms": percentile(first, 99),
        "end_p50_ms": percentile(end, 50), "end_p99_ms": percentile(end, 99),
        "events_per_read": events / max(1, sum(r.event_reads for r in run.replies)),
        "incomplete": float(incomplete), "errors": common["errors"] + incomplete,
        "cpu_us_per_event": 1000 * common["cpu_ms_per_request"] / expected_events,
    }


async def fetch_json(target: Target, path: str) -> dict[str, Any]:
    """GET a small JSON document."""
    reply = await one(target, get_payload(target, path))
    return dict(json.loads(b"".join(reply.body or [])))


async def warm_up(subject: Subject, shape: StreamShape, concurrency: int) -> None:
    """Fill the proxies' upstream pools and run each code path once before anything is measured."""
    target = subject.target
    await closed_loop(target, wire_payload(target, stream=False), concurrency, 0.2)
    await closed_loop(target, wire_payload(target, stream=True, extra=shape.headers()), 4, 0.0)
