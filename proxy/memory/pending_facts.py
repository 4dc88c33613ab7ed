"""A user's next request finds the rules facts of the turn just saved.

"I live in Porto and my manager is Dana." followed at once by "Who is my manager?" must
find Dana, but extraction runs in the background, polling its queue. So each saved
message is noted when its write commits; the extraction worker counts its passes over the
queue; and a user's retrieval first waits, briefly and bounded, until a pass that began
after the user's last committed message has ended, waking the worker so the pass starts at
once. A user with nothing pending does not wait at all. Rules extraction costs about half
a millisecond a message, so the wait is a few milliseconds; an LLM extractor is not waited
for (the caller only waits in rules mode).
"""

from __future__ import annotations

import asyncio
from collections import Counter


class PendingFacts:
    """Which users have messages the extraction worker has not passed over yet, and the wait for them."""

    def __init__(self) -> None:
        self._writing: Counter[str] = Counter()  # user -> message writes not committed yet
        self._wanted: dict[str, int] = {}  # user -> the first pass that sees all their committed messages
        self._started = 0  # passes begun
        self._ended = 0  # passes ended: every pass up to this one is done
        self._changed = asyncio.Condition()
        self.wake = asyncio.Event()  # set to cut the worker's idle wait short

    def saving(self, user: str, done: asyncio.Future[None]) -> None:
        """A message of the user goes to the store; `done` completes when it is committed."""
        self._writing[user] += 1
        done.add_done_callback(lambda _: self._committed(user))

    def _committed(self, user: str) -> None:
        self._writing[user] -= 1
        if self._writing[user] <= 0:
            del self._writing[user]
        self._wanted[user] = self._started + 1  # the next pass to begin claims it
        asyncio.get_running_loop().create_task(self._notify())

    def begin(self) -> int:
        """The worker begins a pass over the queue; its number."""
        self._started += 1
        self.wake.clear()
        return self._started

    async def end(self, number: int) -> None:
        """The worker's pass `number` is over: its users' facts are stored."""
        self._ended = max(self._ended, number)
        for user in [u for u, wanted in self._wanted.items() if wanted <= self._ended]:
            del self._wanted[user]
        await self._notify()

    def pending(self, user: str) -> bool:
        """True while a message of the user is being written or waits for a pass."""
        return user in self._writing or self._wanted.get(user, 0) > self._ended

    async def settled(self, user: str, timeout_s: float) -> bool:
        """Wait at most `timeout_s` for the user's pending facts; True when nothing is pending."""
        if not self.pending(user):
            return True
        try:
            async with asyncio.timeout(timeout_s):
                async with self._changed:
                    while self.pending(user):
                        self.wake.set()
                        await self._changed.wait()
        except TimeoutError:
            return False
        return True

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
