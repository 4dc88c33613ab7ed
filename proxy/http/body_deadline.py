"""How long a client may take to send a request body.

A pause longer than `server.body_timeout_s` ends it, and so does a pace slower than
MIN_BYTES_PER_S on average after the first `body_timeout_s`: a body trickled a byte every few
seconds never pauses long, yet held its connection, and with enough of them every slot under
`server.max_connections`, so the application's own chats were refused.
"""

from __future__ import annotations

import asyncio

from proxy.errors import RequestTimeout

MIN_BYTES_PER_S = 1024


class BodyDeadline:
    """The time left for the next part of one request's body."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self._loop = asyncio.get_running_loop()
        self._started = self._loop.time()
        self._received = 0

    def received(self, size: int) -> None:
        self._received += size

    def wait_s(self) -> float:
        """Seconds the next part may take; RequestTimeout when the body is already too slow."""
        left = self._started + self.idle_s + self._received / MIN_BYTES_PER_S - self._loop.time()
        if left <= 0:
            raise self.expired()
        return min(self.idle_s, left)

    def expired(self) -> RequestTimeout:
        """The error for a body that missed its deadline."""
        return RequestTimeout(
            f"the request body did not arrive in time: no part of it for {self.idle_s:g} s, or slower than "
            f"{MIN_BYTES_PER_S} bytes a second after the first {self.idle_s:g} s (server.body_timeout_s); "
            f"{self._received} bytes in {self._loop.time() - self._started:.1f} s")
