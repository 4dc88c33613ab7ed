"""Do other streams still get one event per read while memproxy runs retrieval? (issue 4)

memproxy serves a store bench/retrieval.py built. Memory-off streams are measured alone
(the baseline) and beside a closed loop of memory-on requests for the store's user, whose
questions are retrieval.py's queries; the two take turns in slices, so both see the same
machine.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.figures import percentile
from harness.loadgen import ClosedLoop, Run, Target, fixed_count, request_payload, run_client
from harness.measure import Measured, StreamShape, Subject
from harness.report import Column, Criterion, header, row
from harness.rounds import alternating
from harness.targets import Targets

# The memory-off streams: overhead.py's shape, 50 events 5 ms apart, four at a time.
STREAM = StreamShape(events=50, gap_ms=5.0)
STREAMS = 4
# Memory-on requests run this much longer than a slice, so they cover every stream's tail.
TAIL_S = STREAM.events * STREAM.gap_ms / 1000 + 0.2
WARM_QUERIES = 20
# Request numbers of the loaded streams start here; the baseline's at 0 (no repeated request).
LOADED_NUMBERS = 10**7
MAX_EVENTS_PER_READ = 1.05  # as overhead.py's criterion
# The X-Memory-Status ok share the memory-on load needs to count as retrieval running (as
# overhead.py's): a request whose memory was skipped is fast and loads nothing.
MIN_RETRIEVAL_OK = 0.99


@dataclass(frozen=True)
class StreamLoad:
    """How long and how hard: slices of `seconds`, `rounds` of each, `connections` memory-on."""

    seconds: float = 1.0
    rounds: int = 3
    connections: int = 4


@dataclass(frozen=True)
class Ask:
    """One memory-on question: retrieval.py's Query as a chat request."""

    text: str
    visible: tuple[str, ...]  # the request's other messages: system, then an earlier answer
    conversation: str | None  # None: a conversation the store has nothing of


def ask_payloads(target: Target, user: str, asks: Sequence[Ask]) -> list[bytes]:
    """Non-streamed chat requests with memory on for `user`, nothing saved."""
    out = []
    for ask in asks:
        system, *earlier = ask.visible
        messages = [{"role": "system", "content": system}]
        messages += [{"role": "assistant", "content": text} for text in earlier]
        messages.append({"role": "user", "content": ask.text})
        body = json.dumps({"model": "bench-model", "stream": False, "messages": messages}).encode()
        headers = {"content-type": "application/json", "authorization": "Bearer sk-bench",
                   "x-memory-user": user, "x-memory-persist": "false"}
        if ask.conversation is not None:
            headers["x-memory-conversation"] = ask.conversation
        out.append(request_payload(target, "POST", "/v1/chat/completions", body, headers))
    return out


async def _measure(subject: Subject, on: Target, payloads: list[bytes], load: StreamLoad) -> dict[str, Any]:
    """Baseline and loaded stream slices, alternating which goes first; the memory-on replies."""
    def make(n: int) -> bytes:
        return payloads[n % len(payloads)]

    await fixed_count(on, make, 2, WARM_QUERIES)  # the page cache and the stemmer
    alone = Measured(subject, STREAMS, STREAM)
    beside = Measured(subject, STREAMS, STREAM, first=LOADED_NUMBERS)
    recall = ClosedLoop(on, lambda n: make(WARM_QUERIES + n), load.connections)
    for opened in (alone, beside):
        await opened.open()
    await recall.open()
    try:
        for r in range(load.rounds):
            for loaded in alternating((False, True), r):
                if loaded:
                    await asyncio.gather(beside.slice(load.seconds), recall.run(load.seconds + TAIL_S))
                else:
                    await alone.slice(load.seconds)
    finally:
        for measured in (alone, beside):
            measured.close()
        recall.close()
    return {"alone": alone.figures(), "beside": beside.figures(), "recall": recall.total}


def _recall_figures(run: Run) -> dict[str, Any]:
    replies = run.replies
    times = [r.latency * 1000 for r in replies]
    return {
        "retrievals": len(replies), "errors": run.errors,
        "ok": sum(r.memory_status == b"ok" for r in replies),
        "not_ok": sum(r.memory_status != b"ok" for r in replies),
        "injected": sum(r.memory_injected > 0 for r in replies),
        "request_p50_ms": round(percentile(times, 50), 3), "request_p95_ms": round(percentile(times, 95), 3),
    }


def served_copy(store: Path, into: Path) -> Path:
    """A copy of the store for memproxy to serve, with nothing waiting for extraction.

    The bench wrote its messages the way turns are saved, so each one is queued for fact
    extraction; memproxy's extraction worker would work through them all during the
    measurement, beside the retrievals, and change the store.
    """
    copy = into / store.name
    with closing(sqlite3.connect(store)) as source, closing(sqlite3.connect(copy)) as target:
        source.backup(target)
        with target:
            target.execute("DELETE FROM extraction_queue")
    return copy


def stream_batching(store: Path, user: str, asks: Sequence[Ask], load: StreamLoad, workdir: Path) -> dict[str, Any]:
    """Start the mock and memproxy on a copy of `store`, measure, stop them; the figures of one size."""
    with Targets(f"{store.stem}-", parent=workdir) as targets:
        logs = targets.workdir
        served = served_copy(store, logs)
        try:
            mock = targets.mock(STREAM.events, STREAM.gap_ms)
            server = targets.memproxy(mock.url("/v1"), store_path=served)
            rss_start = server.rss_mb()
            off = Target("memproxy-off", server.port)
            on = Target("memproxy-on", server.port)
            measured = run_client(_measure(Subject(off, server, mock), on, ask_payloads(on, user, asks), load))
            rss_end = server.rss_mb()
        finally:
            targets.stop()
            for path in logs.glob(served.name + "*"):  # and its -wal and -shm
                path.unlink()
    alone, beside = measured["alone"], measured["beside"]
    return {
        "events_per_read": round(beside["events_per_read"], 3),
        "events_per_read_alone": round(alone["events_per_read"], 3),
        "streams": int(beside["requests"]), "streams_alone": int(alone["requests"]),
        "incomplete": int(beside["incomplete"] + alone["incomplete"]),
        "stream_errors": int(beside["errors"] + alone["errors"]),
        **_recall_figures(measured["recall"]),
        "server_rss_mb_start": round(rss_start, 1), "server_rss_mb_end": round(rss_end, 1),
        "logs": str(logs),
    }


def streams_table(rows: list[dict[str, Any]]) -> str:
    """Per size: events per read alone and beside retrieval, the streams, and the memory-on requests."""
    # The first line of titles spans columns: events per read and streams, each alone and beside.
    columns = (Column("items", 8), Column("alone", 7, ".3f"), Column("beside", 7, ".3f"), Column("alone", 6),
               Column("beside", 6), Column("errors", 7), Column("requests", 10), Column("ok", 5),
               Column("memories", 9), Column("p50 / p95 ms", 19))
    out = ["memory-off streams through memproxy, alone and beside memory-on requests (each a retrieval);"
           " events per read 1.0 = no batching",
           f"{'':>8} {'events per read':>15} {'streams':>13} {'stream':>7} {'memory-on':>10} {'not':>5}"
           f" {'with':>9} {'memory-on request':>19}", header(columns)]
    for size, s in ((r["size"], r["streams"]) for r in rows if "streams" in r):
        out.append(row(columns, (size, s["events_per_read_alone"], s["events_per_read"], s["streams_alone"],
                                 s["streams"], s["stream_errors"], s["retrievals"], s["not_ok"], s["injected"],
                                 f"{s['request_p50_ms']:.2f} / {s['request_p95_ms']:<7.2f}")))
    return "\n".join(out)


def no_batching(size: int, s: dict[str, Any]) -> Criterion:
    """Events per read beside retrieval within the limit, every stream whole, and retrieval really ran."""
    ran = s["retrievals"] > 0 and s["ok"] >= MIN_RETRIEVAL_OK * s["retrievals"] and s["errors"] == 0
    passed = s["events_per_read"] <= MAX_EVENTS_PER_READ and s["stream_errors"] == 0 and ran
    detail = (f"{s['events_per_read']:.3f} events per read beside retrieval (limit {MAX_EVENTS_PER_READ};"
              f" alone {s['events_per_read_alone']:.3f}), {s['stream_errors']} stream errors;"
              f" {s['retrievals']} memory-on requests beside them, {s['not_ok']} not ok, {s['errors']} errors"
              f" (need ok on {MIN_RETRIEVAL_OK:.0%}, no errors), {s['injected']} with memories injected")
    return Criterion(f"no batching of other streams while retrieval runs, {size:,} items", passed, detail)
