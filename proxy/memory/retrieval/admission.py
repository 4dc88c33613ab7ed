"""Admission of recalls: a few at a time, the newest first, none started too late.

Every recall makes several reads, and a read is a hand-off to a reader thread and back.
When all the recalls of a burst run at once, their reads queue behind each other and each
recall waits for every other one's reads: all of them finish late together, and past
`memory.retrieval_timeout_ms` all of them fail. Admitted a few at a time, each one runs
alone with its reads and finishes in a few ms.

A queue served in arrival order fails under sustained load: the wait grows to the
deadline, every recall that gets its turn has no time left to finish, and none succeeds.
So the turn goes to the newest recall waiting, which has its whole budget left, and a
recall waits only until its `start_by`: past it, it gives up before reading anything (the
request goes on without memory at once). Under load the recalls that fail are the ones
that waited longest, and as many succeed as the store can serve.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class RecallGate:
    """At most `running` recalls at once; the others wait for a turn, the newest first."""

    def __init__(self, running: int) -> None:
        if running < 1:
            raise ValueError(f"a recall gate needs running >= 1, not {running}")
        self._running_max = running
        self._running = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @asynccontextmanager
    async def admitted(self, start_by: float) -> AsyncIterator[None]:
        """Hold a turn for the block's duration; TimeoutError when none came by `start_by` (event-loop time)."""
        await self._enter(start_by)
        try:
            yield
        finally:
            self._leave()

    async def _enter(self, start_by: float) -> None:
        if self._running < self._running_max and not self._waiters:
            self._running += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout_at(start_by):
                await waiter  # _leave hands its turn over: _running already counts this recall
        except (asyncio.CancelledError, TimeoutError):
            if not waiter.cancelled():
                self._leave()  # given the turn just as it gave up: pass it on
            elif waiter in self._waiters:  # else _leave already passed over it
                self._waiters.remove(waiter)
            raise

    def _leave(self) -> None:
        while self._waiters:
            waiter = self._waiters.pop()
            if not waiter.done():
                waiter.set_result(None)  # the turn goes straight to the newest recall waiting
                return
        self._running -= 1
