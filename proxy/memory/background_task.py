"""A loop memory runs in the background of one app (the extraction worker, the vector filler).

Started inside the running loop, stopped at once: whatever its pass had in flight is left
for the next start to do again, which the loops are built for (their work lives in the
store, not in the task).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


class BackgroundTask:
    """One named coroutine run as a task until stopped."""

    def __init__(self, name: str, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.name = name
        self._run = run
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin running (inside the running loop)."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        """Cancel the task and wait for it to end; nothing when it was never started."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
