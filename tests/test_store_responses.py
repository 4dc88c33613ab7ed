"""Recorded response ids (the Responses wire's `previous_response_id`) on both stores: a
chain read back to its first response, forks, isolation between users, and deletion."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from proxy.models import Scope
from proxy.stores.base import FinishTurn, RecordResponse, ResponseChain, StartTurn
from tests.store_backends import Backend, backend  # noqa: F401  (the fixture)

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
ALICE = Scope("alice")


def step(key: str, question: str, answer: str, response_id: str, parent: str | None, minute: int,
         conv: str = "c1") -> list[object]:
    at = T0 + timedelta(minutes=minute)
    return [StartTurn(ALICE, key, conv, f"h-{key}", at, question),
            FinishTurn(ALICE, key, conv, answer, at + timedelta(seconds=1)),
            RecordResponse(ALICE, response_id, key, conv, parent, at + timedelta(seconds=1))]


def test_a_chain_reads_back_to_its_first_response_and_a_fork_sees_only_its_own(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([*step("t1", "q1", "a1", "resp_1", None, 0),
                               *step("t2", "q2", "a2", "resp_2", "resp_1", 1),
                               *step("t3", "q3", "a3", "resp_3", "resp_2", 2),
                               *step("t4", "q4", "a4", "resp_4", "resp_1", 3)])  # a fork from resp_1
            assert await store.response_chain(ALICE, "resp_3") == ResponseChain("c1", ("q1", "a1", "q2", "a2", "q3",
                                                                                        "a3"))
            assert await store.response_chain(ALICE, "resp_4") == ResponseChain("c1", ("q1", "a1", "q4", "a4"))
            assert await store.response_chain(ALICE, "resp_unknown") is None
            assert await store.response_chain(Scope("bob"), "resp_3") is None  # ids belong to their user
            assert await store.response_chain(ALICE, "bad \ud800 id") is None
            # A step whose turn the store does not know records nothing (and fails nothing).
            await store.apply([RecordResponse(ALICE, "resp_9", "t-missing", "c1", None, T0)])
            assert await store.response_chain(ALICE, "resp_9") is None
            # The same id again (a retried write) keeps the first record.
            await store.apply([RecordResponse(ALICE, "resp_1", "t2", "c1", "resp_x", T0)])
            assert await store.response_chain(ALICE, "resp_1") == ResponseChain("c1", ("q1", "a1"))

    asyncio.run(body())


def test_deleting_a_conversation_or_the_user_takes_its_response_ids(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([*step("t1", "q1", "a1", "resp_1", None, 0),
                               *step("t2", "q2", "a2", "resp_2", None, 1, conv="c2")])
            assert await store.delete_item(ALICE, "conversation", "c1") is not None
            assert await store.response_chain(ALICE, "resp_1") is None
            assert await store.response_chain(ALICE, "resp_2") == ResponseChain("c2", ("q2", "a2"))
            await store.delete_user(ALICE)
            assert await backend.sql("SELECT count(*) FROM responses") == [(0,)]

    asyncio.run(body())


def test_a_response_the_client_saw_under_its_first_round_s_id_names_the_provider_s_last(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            at = T0 + timedelta(minutes=1)
            await store.apply([StartTurn(ALICE, "t1", "c1", "h-t1", at, "q1"),
                               RecordResponse(ALICE, "resp_first", "t1", "c1", None, at, provider_id="resp_last"),
                               RecordResponse(ALICE, "resp_plain", "t1", "c1", None, at)])
            assert await store.provider_response(ALICE, "c1", "resp_first") == "resp_last"
            assert await store.provider_response(ALICE, "c1", "resp_plain") is None
            assert await store.provider_response(Scope("bob"), "c1", "resp_first") is None
            assert await store.provider_response(ALICE, "c1", "resp_unknown") is None
            assert await store.provider_response(ALICE, "c2", "resp_first") is None  # another conversation's

    asyncio.run(body())
