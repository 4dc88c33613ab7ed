"""Reading figures: percentiles, medians, side-by-side differences and ratios, timings of a call.

Every percentile here is by rank: the value at rank q/100 * n (rounded) of the sorted values;
every figure over rounds is the median of the per-round figures, so a slow moment of a shared
machine moves one round, not the result.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (by rank) of `values`, 0.0 when there are none."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def p50_p95(values: Iterable[float], digits: int = 3) -> dict[str, float]:
    """{"p50": ..., "p95": ...}, rounded to `digits`."""
    ordered = sorted(values)
    return {"p50": round(percentile(ordered, 50), digits), "p95": round(percentile(ordered, 95), digits)}


def median(values: Iterable[float]) -> float | None:
    """The median, None when there are no values."""
    listed = list(values)
    return statistics.median(listed) if listed else None


def differences(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """a - b, round by round."""
    return [x - y for x, y in zip(a, b)]


def median_ratio(a: Sequence[float], b: Sequence[float]) -> float | None:
    """The median of the per-round ratios a / b (rounds where b is 0 left out), None when there are none."""
    return median(x / y for x, y in zip(a, b) if y)


@dataclass(frozen=True)
class Paired:
    """Two figures measured side by side, round by round: the per-round differences a - b."""

    a: Sequence[float]
    b: Sequence[float]

    @property
    def rounds(self) -> list[float]:
        return differences(self.a, self.b)

    @property
    def median(self) -> float:
        return statistics.median(self.rounds)

    @property
    def below_zero(self) -> int:
        """Rounds where a was the smaller (for a latency: the faster)."""
        return sum(d < 0 for d in self.rounds)

    @property
    def spread(self) -> tuple[float, float]:
        """The smallest and the largest per-round difference."""
        return min(self.rounds), max(self.rounds)


def per_request_ms(cpu_seconds: float, requests: int) -> float:
    """CPU milliseconds per request (at least one request counted)."""
    return cpu_seconds * 1000 / max(1, requests)


def call_ms(call: Callable[[], object]) -> float:
    """Milliseconds one call of `call` took."""
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def repeat_ms(call: Callable[[], object], repeat: int, warm: bool = True) -> list[float]:
    """Milliseconds of each of `repeat` calls, after one untimed call with `warm` (caches, lazy structures)."""
    if warm:
        call()
    return [call_ms(call) for _ in range(repeat)]
