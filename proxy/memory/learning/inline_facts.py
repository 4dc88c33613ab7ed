"""A user message's rules facts, extracted as the message is saved and written right behind it.

"I live in Porto and my manager is Dana." followed at once by "Who is my manager?" must
find Dana. Through the extraction queue the next request waited for a pass of the worker
(claim, extract, commit) that began after the message committed: under a steady stream of
one user's requests that pass was always one behind, and the wait ran to its bound
(pending_facts.py). So in rules mode a short user message is mined when its turn starts
(on the event loop when very short, else in a thread: extractors.py), and its facts go to
the writer as a RecordFacts of their own, right behind the message. The turn's answer ends
once they are committed, as it ends once the turn is, so the user's next request finds them
without waiting; a request running beside the turn (the user's parallel requests) is not
its next, and does not wait for them.

The queue still backs it up. The message is queued as always, due only after
QUEUE_BACKUP_S, and the facts' write takes it off the queue by its message id; if that
write never lands (the process died, the rules raised), the worker mines the message then,
and whichever of the two writes comes second finds the item gone and applies nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from datetime import datetime, timedelta

from proxy.memory.learning.facts import record_of
from proxy.memory.learning.worker import head
from proxy.memory.learning.extractors import Extractor, RulesExtractor
from proxy.memory.writer import WriteQueueFull, Writer
from proxy.models import Scope

log = logging.getLogger("memproxy.extraction")

# Longer messages go through the queue: the rules cost about 9 µs a character, and a
# message's facts should not wait behind a long paste's.
INLINE_MAX_CHARS = 2000
# How long the queue item of a message mined inline waits before the worker may take it.
QUEUE_BACKUP_S = 30.0


def queue_from(at: datetime) -> datetime:
    """When the worker may take the queue item of a message mined inline, said at `at`."""
    return at + timedelta(seconds=QUEUE_BACKUP_S)


class InlineFacts:
    """Mines user messages as their turns start and writes their facts behind them."""

    def __init__(self, writer: Writer, rules: Extractor, *, isolate_agents: bool) -> None:
        self._writer = writer
        self._isolate_agents = isolate_agents
        # The extraction worker's own: the rules run one message at a time per process.
        self._rules = rules
        self._running: set[asyncio.Task[None]] = set()

    @staticmethod
    def takes(text: str) -> bool:
        """Whether a message of this text is mined inline (else the queue has it)."""
        return 0 < len(text) <= INLINE_MAX_CHARS

    def record(self, scope: Scope, message_id: str, text: str, at: datetime) -> asyncio.Future[None]:
        """Mine `text` (the message as saved) and write its facts; the future ends once they are
        committed, or the write failed (the queue then has the message). It never raises."""
        scope = dataclasses.replace(scope, agent_isolated=self._isolate_agents and scope.agent is not None)
        rules = self._rules
        try:
            found = rules.now(head(text), None) if isinstance(rules, RulesExtractor) else None
            if found is not None:
                # Mined here: the write is submitted at once, and its commit is watched by a callback
                # rather than a task of its own.
                written = self._writer.submit(record_of(scope, None, message_id, at, found))
                ended = written.get_loop().create_future()
                written.add_done_callback(lambda done: self._written(done, ended, scope, message_id))
                return ended
        except Exception as exc:  # the queue item stays: the worker mines the message later
            self._unwritten(exc, scope, message_id)
            ended = asyncio.get_running_loop().create_future()
            ended.set_result(None)
            return ended
        task = asyncio.get_running_loop().create_task(self._record(scope, message_id, text, at))
        self._running.add(task)  # held: a task nobody references may be collected mid-flight
        task.add_done_callback(self._running.discard)
        return task

    def _written(self, written: asyncio.Future[None], ended: asyncio.Future[None], scope: Scope,
                 message_id: str) -> None:
        exc = None if written.cancelled() else written.exception()
        if exc is not None and not isinstance(exc, WriteQueueFull):  # a full queue was counted and logged
            self._unwritten(exc, scope, message_id)
        if not ended.done():
            ended.set_result(None)

    async def _record(self, scope: Scope, message_id: str, text: str, at: datetime) -> None:
        try:
            found = await self._rules(head(text), None)
            await self._writer.submit(record_of(scope, None, message_id, at, found))
        except WriteQueueFull:  # the writer counted and logged it; the worker mines the message later
            pass
        except Exception as exc:  # the queue item stays: the worker mines the message later
            self._unwritten(exc, scope, message_id)

    @staticmethod
    def _unwritten(exc: BaseException, scope: Scope, message_id: str) -> None:
        log.warning("extraction: facts of message %s of user %s not written with it (%s: %s); the queue has it",
                    message_id, scope.user, type(exc).__name__, str(exc)[:200])
