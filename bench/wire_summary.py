"""The wires side by side: each Messages-wire, Responses-wire and Gemini-wire target against its
Chat Completions twin.

A target's added latency is measured against its own wire's direct target (`direct-messages`,
`direct-responses`, `direct-gemini`: the mock answering that wire), a Chat Completions target's against
`direct`, each round for itself.
"""

from __future__ import annotations

import statistics
from typing import Any

from harness.figures import differences, median, median_ratio
from harness.report import Criterion
from summary import DIRECT, Summary, _num

# The wires compared with Chat Completions, by the suffix their targets' names carry.
SUFFIXES = {"messages": "-messages", "responses": "-responses", "gemini": "-gemini"}
TITLES = {"messages": "Messages", "responses": "Responses", "gemini": "Gemini"}
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
# Targets for each wire against Chat Completions: memory on within 10% on added p50 at c=1
# and on requests/s at c=32; memory off within this many ms on added p50.
MEMORY_ON_SHARE = 0.10
MEMORY_OFF_MS = 0.2


def _direct(target: str) -> str:
    suffix = next((suffix for suffix in SUFFIXES.values() if target.endswith(suffix)), "")
    return DIRECT + suffix


def added_series(s: Summary, step: str, target: str, metric: str) -> list[float]:
    """(target - its wire's direct) in each round."""
    return differences(s.series(step, target, metric), s.series(step, _direct(target), metric))


def _figure(s: Summary, step: str, target: str, metric: str, how: str) -> list[float]:
    return added_series(s, step, target, metric) if how == "added" else s.series(step, target, metric)


def _pairs(s: Summary, suffix: str) -> list[str]:
    return [t for t in PAIRS if t in s.targets and t + suffix in s.targets]


def wire_table(s: Summary) -> str:
    """Per wire and pair: chat, the wire, wire - chat and wire / chat (medians over the rounds)."""
    tables = []
    for wire, suffix in SUFFIXES.items():
        if not _pairs(s, suffix):
            continue
        lines = [f"{f'{TITLES[wire]} against Chat Completions (medians over rounds)':56}{'chat':>10}{wire:>10}"
                 f"{'w - c':>10}{'w / c':>10}"]
        for base in _pairs(s, suffix):
            lines.append(base)
            for label, step, metric, how in ROWS:
                if step not in s.results:
                    continue
                chat, other = _figure(s, step, base, metric, how), _figure(s, step, base + suffix, metric, how)
                diff = median(differences(other, chat))
                ratio = median_ratio(other, chat)
                lines.append(f"  {label:54}{_num(median(chat)):>10}{_num(median(other)):>10}{_num(diff):>10}"
                             f"{_num(ratio) + 'x' if ratio is not None else '-':>10}")
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


def wire_criteria(s: Summary) -> list[Criterion]:
    """Each wire against Chat Completions, informational (printed, not in the exit status)."""
    out = []
    for wire, suffix in SUFFIXES.items():
        out += _criteria(s, TITLES[wire], suffix)
    return out


def _criteria(s: Summary, title: str, suffix: str) -> list[Criterion]:
    out = []
    off = "memproxy-off"
    if off in _pairs(s, suffix) and "latency_c1" in s.results:
        chat, other = (added_series(s, "latency_c1", t, "p50_ms") for t in (off, off + suffix))
        diff = statistics.median(differences(other, chat))
        out.append(Criterion(f"memory off: {title} added p50 at c=1 within {MEMORY_OFF_MS} ms of Chat Completions",
                             abs(diff) <= MEMORY_OFF_MS,
                             f"{statistics.median(other):.3f} vs {statistics.median(chat):.3f} ms, "
                             f"difference {diff:+.3f} ms", informational=True))
    on = "memproxy-on"
    if on in _pairs(s, suffix):
        if "latency_c1" in s.results:
            chat_p50, other_p50 = (statistics.median(added_series(s, "latency_c1", t, "p50_ms"))
                                   for t in (on, on + suffix))
            out.append(Criterion(f"memory on: {title} added p50 at c=1 <= {1 + MEMORY_ON_SHARE:g} x Chat Completions",
                                 other_p50 <= (1 + MEMORY_ON_SHARE) * chat_p50,
                                 f"{other_p50:.3f} vs {chat_p50:.3f} ms ({other_p50 / chat_p50:.3f}x)"
                                 if chat_p50 else "-", informational=True))
        if "throughput_c32" in s.results:
            ratio = median_ratio(s.series("throughput_c32", on + suffix, "rate"),
                                 s.series("throughput_c32", on, "rate"))
            if ratio is not None:
                out.append(Criterion(f"memory on: {title} requests/s at c=32 >= {1 - MEMORY_ON_SHARE:g} x Chat "
                                     "Completions", ratio >= 1 - MEMORY_ON_SHARE,
                                     f"{ratio:.3f}x (median of per-round ratios)", informational=True))
    return out


def wire_json(s: Summary) -> dict[str, Any]:
    """The wire tables as JSON: wire -> pair -> label -> chat, the wire's figure, ratio."""
    out: dict[str, Any] = {}
    for wire, suffix in SUFFIXES.items():
        pairs = {}
        for base in _pairs(s, suffix):
            rows = {}
            for label, step, metric, how in ROWS:
                if step in s.results:
                    chat, other = _figure(s, step, base, metric, how), _figure(s, step, base + suffix, metric, how)
                    rows[label] = {"chat": median(chat), wire: median(other), "ratio": median_ratio(other, chat)}
            pairs[base] = rows
        if pairs:
            out[wire] = pairs
    return out
