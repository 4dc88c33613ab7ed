"""Recalls waiting for a turn to read are admitted newest first, and none after its `start_by`."""

from __future__ import annotations

import asyncio

import pytest

from proxy.memory.retrieval.admission import RecallGate


async def _recall(gate: RecallGate, name: str, start_by: float, admitted: list[str], hold: asyncio.Event) -> None:
    async with gate.admitted(start_by):
        admitted.append(name)
        await hold.wait()


def test_waiting_recalls_get_their_turn_newest_first() -> None:
    async def run() -> list[str]:
        gate, admitted, hold = RecallGate(1), [], asyncio.Event()
        far = asyncio.get_running_loop().time() + 60
        first = asyncio.create_task(_recall(gate, "first", far, admitted, hold))
        await asyncio.sleep(0)
        waiting = []
        for name in ("a", "b", "c"):
            waiting.append(asyncio.create_task(_recall(gate, name, far, admitted, hold)))
            await asyncio.sleep(0)
        assert (gate.running, gate.waiting, admitted) == (1, 3, ["first"])
        hold.set()  # each recall leaves at once, handing its turn on
        await asyncio.gather(first, *waiting)
        assert (gate.running, gate.waiting) == (0, 0)
        return admitted

    assert asyncio.run(run()) == ["first", "c", "b", "a"]


def test_a_recall_past_its_start_by_gives_up_and_the_next_gets_the_turn() -> None:
    async def run() -> tuple[list[str], BaseException | None]:
        gate, admitted, hold = RecallGate(1), [], asyncio.Event()
        now = asyncio.get_running_loop().time()
        first = asyncio.create_task(_recall(gate, "first", now + 60, admitted, hold))
        await asyncio.sleep(0)
        patient = asyncio.create_task(_recall(gate, "patient", now + 60, admitted, hold))
        await asyncio.sleep(0)
        late = asyncio.create_task(_recall(gate, "late", now + 0.05, admitted, hold))
        await asyncio.sleep(0.1)  # past the newest waiter's start_by
        assert (gate.running, gate.waiting) == (1, 1)
        hold.set()
        await asyncio.gather(first, patient)
        assert (gate.running, gate.waiting) == (0, 0)
        return admitted, late.exception()

    admitted, gave_up = asyncio.run(run())
    assert admitted == ["first", "patient"]
    assert isinstance(gave_up, TimeoutError)


def test_a_gate_admits_up_to_its_running_count_at_once() -> None:
    async def run() -> tuple[int, int]:
        gate, admitted, hold = RecallGate(2), [], asyncio.Event()
        far = asyncio.get_running_loop().time() + 60
        tasks = [asyncio.create_task(_recall(gate, str(n), far, admitted, hold)) for n in range(3)]
        await asyncio.sleep(0)
        counts = (gate.running, gate.waiting)
        hold.set()
        await asyncio.gather(*tasks)
        return counts

    assert asyncio.run(run()) == (2, 1)
    with pytest.raises(ValueError, match="running >= 1"):
        RecallGate(0)
