"""A user's next request finds the rules facts of the turn just saved.

"I live in Porto and my manager is Dana." followed at once by "Who is my manager?" must
find Dana, but extraction runs in the background, polling its queue. So each saved
message is noted when its write commits; the extraction worker counts its passes over the
queue; and a user's retrieval first waits, briefly and bounded, until a pass that began
after the user's last committed message has ended. Each commit wakes the worker, so the
pass overlaps the rest of the turn (the answer still streaming) instead of starting when
the next request asks; its facts commit at once, not after the writer's wait for company.
A user with nothing pending does not wait at all. A short user message is mined as it is
saved and its turn's answer ends once its facts are written (inline_facts.py); it is noted
here only when its turn's step ends with its facts still being written (the upstream
failed, the client left, the commit outran its bound), so the user's next request waits
for that write and no pass. An LLM extractor is not waited for (the caller only waits in
rules mode).

A request waits only for what was pending when it asked: the writes then in flight, and
one pass after them. Messages of the same user saved later (the user's other requests
running meanwhile, an agent's parallel calls) are not its past: waiting for them too, a
user with a steady stream of turns never settled, and every request waited out its whole
bound (a quarter of `memory.retrieval_timeout_ms`) before its recall could begin.
"""

from __future__ import annotations

import asyncio


class PendingFacts:
    """Which users have messages the extraction worker has not passed over yet, and the wait for them."""

    def __init__(self) -> None:
        self._writing: dict[str, set[int]] = {}  # user -> tickets of message writes not committed yet
        self._tickets = 0  # tickets handed out: one a write
        self._for_worker: set[int] = set()  # tickets of writes whose facts the worker is to extract
        self._wanted: dict[str, int] = {}  # user -> the first pass that sees all their committed messages
        self._started = 0  # passes begun
        self._ended = 0  # passes ended: every pass up to this one is done
        # Set, and replaced by a new one, at every change: a wait looks again when its event is
        # set. Nothing to lock, so a commit wakes the waits at once, without a task of its own.
        self._changed = asyncio.Event()
        self.wake = asyncio.Event()  # set to cut the worker's idle wait short

    def saving(self, user: str, done: asyncio.Future[None], *, with_facts: bool = False) -> None:
        """A message of the user goes to the store; `done` completes when it is committed, and when
        `with_facts`, its facts with it (inline_facts.py): no pass of the worker is then waited for."""
        self._tickets += 1
        ticket = self._tickets
        self._writing.setdefault(user, set()).add(ticket)
        if not with_facts:
            self._for_worker.add(ticket)
        done.add_done_callback(lambda _: self._committed(user, ticket, with_facts))

    def _committed(self, user: str, ticket: int, with_facts: bool) -> None:
        writing = self._writing[user]
        writing.discard(ticket)
        self._for_worker.discard(ticket)
        if not writing:
            del self._writing[user]
        if not with_facts:
            self._wanted[user] = self._started + 1  # the next pass to begin claims it
            self.wake.set()  # the user's next request will want this pass: begin it now
        self._notify()

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
        self._notify()

    def pending(self, user: str) -> bool:
        """True while a message of the user is being written or waits for a pass."""
        return user in self._writing or self._wanted.get(user, 0) > self._ended

    def awaits_worker(self, user: str) -> bool:
        """True while a message of the user whose facts the worker extracts is being written or
        waits for a pass: a message said after it must not have its facts written first."""
        return self._wanted.get(user, 0) > self._ended or not self._for_worker.isdisjoint(self._writing.get(user, ()))

    async def settled(self, user: str, timeout_s: float) -> bool:
        """Wait at most `timeout_s` for the facts pending now (not those of writes begun later);
        True when they are stored."""
        if not self.pending(user):
            return True
        in_flight = frozenset(self._writing.get(user, ()))
        try:
            async with asyncio.timeout(timeout_s):
                while in_flight & self._writing.get(user, set()):
                    await self._changed.wait()
                # The pass that sees those writes: fixed now, so later commits do not move it.
                wanted = self._wanted.get(user, 0)
                while self._ended < wanted:
                    self.wake.set()
                    await self._changed.wait()
        except TimeoutError:
            return False
        return True

    def _notify(self) -> None:
        """Wake every wait to look again (each waits on the event current when it looked)."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
