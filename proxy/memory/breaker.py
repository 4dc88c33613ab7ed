"""A circuit breaker, so a broken store does not add its timeout to every request."""

from __future__ import annotations

import time

from proxy.metrics import Metrics

FAILURES_TO_OPEN = 5
OPEN_FOR_S = 15.0


class CircuitBreaker:
    """Opens after consecutive failures; after a pause lets one request try again."""

    def __init__(self, metrics: Metrics, *, failures_to_open: int = FAILURES_TO_OPEN,
                 open_for_s: float = OPEN_FOR_S) -> None:
        self._metrics = metrics
        self._failures_to_open = failures_to_open
        self._open_for_s = open_for_s
        self._failures = 0
        self._opened_at: float | None = None

    @property
    def is_open(self) -> bool:
        return self._opened_at is not None

    def allow(self) -> bool:
        """Whether to try memory now (half-open: one try once the pause is over)."""
        if self._opened_at is None:
            return True
        if time.monotonic() - self._opened_at >= self._open_for_s:
            self._opened_at = time.monotonic()  # the next try gets a fresh pause if it fails
            return True
        return False

    def succeeded(self) -> None:
        self._failures = 0
        if self._opened_at is not None:
            self._opened_at = None
            self._metrics.circuit_open.set(0)

    def failed(self) -> None:
        self._failures += 1
        if self._failures >= self._failures_to_open and self._opened_at is None:
            self._opened_at = time.monotonic()
            self._metrics.circuit_open.set(1)
