"""A circuit breaker, so a broken store does not add its timeout to every request.

What counts as a failure: an error from the store or from retrieval, and a timeout while the
store answers nobody. A recall that times out while the store answers other reads and
recalls met a busy proxy, not a broken store: under load the store still answers, and the recalls
time out because they queued behind each other for the event loop, the reader threads and
the GIL. Opening the circuit then would switch memory off for everyone, for OPEN_FOR_S,
just when most recalls still work. So such a timeout degrades its own request and leaves
the count alone.
"""

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
        self._last_success = float("-inf")  # time.monotonic() of the last recall that succeeded

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
        self._last_success = time.monotonic()
        self._failures = 0
        if self._opened_at is not None:
            self._opened_at = None
            self._metrics.circuit_open.set(0)

    def timed_out(self, quiet_s: float, store_answered_at: float = float("-inf")) -> None:
        """A recall that read the store ran out of time: a failure only when the store answered
        nothing for `quiet_s`, neither a recall nor (`store_answered_at`, time.monotonic(), where the
        store tells) a single read. Otherwise the store answers, and this recall was late."""
        if time.monotonic() - max(self._last_success, store_answered_at) > quiet_s:
            self.failed()

    def failed(self) -> None:
        self._failures += 1
        if self._failures >= self._failures_to_open and self._opened_at is None:
            self._opened_at = time.monotonic()
            self._metrics.circuit_open.set(1)
