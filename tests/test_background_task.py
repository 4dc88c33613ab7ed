"""A background loop runs under its name from start, and stop cancels it and waits for its end."""

from __future__ import annotations

import asyncio

from proxy.memory.background_task import BackgroundTask


def test_start_runs_the_loop_under_its_name_and_stop_waits_for_its_end() -> None:
    async def scenario() -> None:
        passes: list[str | None] = []
        ended = asyncio.Event()

        async def loop() -> None:
            try:
                while True:
                    current = asyncio.current_task()
                    passes.append(current.get_name() if current is not None else None)
                    await asyncio.sleep(0)
            finally:
                await asyncio.sleep(0)  # the cleanup a loop does after its cancellation is waited for
                ended.set()

        task = BackgroundTask("memproxy-test", loop)
        await task.stop()  # never started: nothing to stop
        assert passes == []
        task.start()
        while len(passes) < 3:
            await asyncio.sleep(0)
        await task.stop()
        assert ended.is_set()
        assert set(passes) == {"memproxy-test"}
        stopped_at = len(passes)
        await asyncio.sleep(0.01)
        assert len(passes) == stopped_at
        await task.stop()  # stopped twice: the second finds nothing to stop

    asyncio.run(scenario())


def test_a_loop_that_fails_does_not_fail_its_stop() -> None:
    async def scenario() -> None:
        async def broken() -> None:
            raise RuntimeError("a bug in the loop")

        task = BackgroundTask("memproxy-broken", broken)
        task.start()
        await asyncio.sleep(0)
        await task.stop()

    asyncio.run(scenario())
