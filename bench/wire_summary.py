"""The two wires side by side: each Messages-wire target against its Chat Completions twin.

A Messages target's added latency is measured against `direct-messages` (the mock answering
the Messages wire), a Chat Completions target's against `direct`, each round for itself.
"""

from __future__ import annotations

import statistics
from typing import Any

from summary import DIRECT, Criterion, Summary, _num

SUFFIX = "-messages"
PAIRS = ("memproxy-off", "memproxy-on", "memproxy-on-ro")
# (label, step, metric, how): "added" is minus the wire's own direct, "value" the figure itself.
ROWS: tuple[tuple[str, str, str, str], ...] = (
    ("added p50 ms, c=1", "latency_c1", "p50_ms", "added"),
    ("added p99 ms, c=1", "latency_c1", "p99_ms", "added"),
    ("added p50 ms, c=8", "latency_c8", "p50_ms", "added"),
    ("requests/s, c=32", "throughput_c32", "rate", "value"),
    ("server CPU ms/request, c=32", "throughput_c32", "cpu_ms_per_request", "value"),
    ("requests/s, c=64", "throughput_c64", "rate", "value"),
    ("added first event ms, stream c=1", "stream_c1", "ttfc_p50_ms", "added"),
    ("streams/s, c=32", "stream_c32", "rate", "value"),
    ("X-Memory-Status ok, share, c=1", "latency_c1", "memory_ok", "value"),
)
# Targets for the Messages wire against Chat Completions: memory on within 10% on added p50
# at c=1 and on requests/s at c=32; memory off within this many ms on added p50.
MEMORY_ON_SHARE = 0.10
MEMORY_OFF_MS = 0.2


def _direct(target: str) -> str:
    return DIRECT + SUFFIX if target.endswith(SUFFIX) else DIRECT


def added_series(s: Summary, step: str, target: str, metric: str) -> list[float]:
    """(target - its wire's direct) in each round."""
    return [a - b for a, b in zip(s.series(step, target, metric), s.series(step, _direct(target), metric))]


def _figure(s: Summary, step: str, target: str, metric: str, how: str) -> list[float]:
    return added_series(s, step, target, metric) if how == "added" else s.series(step, target, metric)


def _pairs(s: Summary) -> list[str]:
    return [t for t in PAIRS if t in s.targets and t + SUFFIX in s.targets]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(chat: list[float], messages: list[float]) -> float | None:
    """Median of the per-round ratios messages / chat."""
    return _median([m / c for c, m in zip(chat, messages) if c])


def wire_table(s: Summary) -> str:
    """Per pair: chat, messages, messages - chat and messages / chat (medians over the rounds)."""
    if not _pairs(s):
        return ""
    lines = [f"{'the two wires (medians over rounds)':44}{'chat':>10}{'messages':>10}{'m - c':>10}{'m / c':>10}"]
    for base in _pairs(s):
        lines.append(base)
        for label, step, metric, how in ROWS:
            if step not in s.results:
                continue
            chat, messages = _figure(s, step, base, metric, how), _figure(s, step, base + SUFFIX, metric, how)
            diff = _median([m - c for c, m in zip(chat, messages)])
            ratio = _ratio(chat, messages)
            lines.append(f"  {label:42}{_num(_median(chat)):>10}{_num(_median(messages)):>10}{_num(diff):>10}"
                         f"{_num(ratio) + 'x' if ratio is not None else '-':>10}")
    return "\n".join(lines)


def wire_criteria(s: Summary) -> list[Criterion]:
    """The Messages wire against Chat Completions, informational (printed, not in the exit status)."""
    out = []
    off = "memproxy-off"
    if off in _pairs(s) and "latency_c1" in s.results:
        chat, messages = (added_series(s, "latency_c1", t, "p50_ms") for t in (off, off + SUFFIX))
        diff = statistics.median([m - c for c, m in zip(chat, messages)])
        out.append(Criterion(f"memory off: Messages added p50 at c=1 within {MEMORY_OFF_MS} ms of Chat Completions",
                             abs(diff) <= MEMORY_OFF_MS,
                             f"{statistics.median(messages):.3f} vs {statistics.median(chat):.3f} ms, "
                             f"difference {diff:+.3f} ms", informational=True))
    on = "memproxy-on"
    if on in _pairs(s):
        if "latency_c1" in s.results:
            chat_p50, messages_p50 = (statistics.median(added_series(s, "latency_c1", t, "p50_ms"))
                                      for t in (on, on + SUFFIX))
            out.append(Criterion(f"memory on: Messages added p50 at c=1 <= {1 + MEMORY_ON_SHARE:g} x Chat Completions",
                                 messages_p50 <= (1 + MEMORY_ON_SHARE) * chat_p50,
                                 f"{messages_p50:.3f} vs {chat_p50:.3f} ms ({messages_p50 / chat_p50:.3f}x)"
                                 if chat_p50 else "-", informational=True))
        if "throughput_c32" in s.results:
            ratio = _ratio(s.series("throughput_c32", on, "rate"), s.series("throughput_c32", on + SUFFIX, "rate"))
            if ratio is not None:
                out.append(Criterion(f"memory on: Messages requests/s at c=32 >= {1 - MEMORY_ON_SHARE:g} x Chat "
                                     "Completions", ratio >= 1 - MEMORY_ON_SHARE,
                                     f"{ratio:.3f}x (median of per-round ratios)", informational=True))
    return out


def wire_json(s: Summary) -> dict[str, Any]:
    """The wire table as JSON: pair -> label -> chat, messages, ratio."""
    out: dict[str, Any] = {}
    for base in _pairs(s):
        rows = {}
        for label, step, metric, how in ROWS:
            if step in s.results:
                chat, messages = _figure(s, step, base, metric, how), _figure(s, step, base + SUFFIX, metric, how)
                rows[label] = {"chat": _median(chat), "messages": _median(messages), "ratio": _ratio(chat, messages)}
        out[base] = rows
    return out
