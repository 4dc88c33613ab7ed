"""Who created each provider object, in the Store contract, on both backends (ProviderObjects).

Several replicas and processes share the store: whichever records an object first is its
creator for all of them, and a user's deletion takes the user's records with it.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from tests.store_backends import Backend, backend  # noqa: F401  (the fixture)
from proxy.models import Scope
from proxy.stores.base import ProviderObjects

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


async def record_one(store: ProviderObjects, provider: str, object_id: str, user: str, kind: str) -> str:
    return (await store.record_owners(provider, user, [(kind, object_id)], T0))[object_id]


def test_the_first_creator_recorded_is_the_owner_for_every_store_on_the_database(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as one, backend.opened() as other:
            assert await one.owner_of("openai", "resp_1") is None
            assert await record_one(one, "openai", "resp_1", "alice", "response") == "alice"
            # Another replica sees it at once, and cannot take it over.
            assert await other.owner_of("openai", "resp_1") == "alice"
            assert await record_one(other, "openai", "resp_1", "bob", "response") == "alice"
            assert await one.owner_of("openai", "resp_1") == "alice"
            # Ids are per provider, and exact.
            assert await one.owner_of("anthropic", "resp_1") is None
            assert await one.owner_of("openai", "RESP_1") is None
            assert await one.owner_of("openai", "resp_") is None
            assert await record_one(other, "anthropic", "resp_1", "bob", "file") == "bob"
            results = await asyncio.gather(*(record_one(store, "openai", "conv_9", user, "conversation")
                                             for store, user in ((one, "carol"), (other, "dave")) * 3))
            assert len(set(results)) == 1 and await one.owner_of("openai", "conv_9") == results[0]

    asyncio.run(body())


def test_the_ids_of_one_answer_are_recorded_together_each_keeping_its_first_creator(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as one, backend.opened() as other:
            assert await record_one(other, "openai", "msg_2", "bob", "output_item") == "bob"
            owners = await one.record_owners("openai", "alice", [("response", "resp_7"), ("output_item", "msg_1"),
                                                                 ("output_item", "msg_2")], T0)
            assert owners == {"resp_7": "alice", "msg_1": "alice", "msg_2": "bob"}
            assert [await other.owner_of("openai", i) for i in ("resp_7", "msg_1", "msg_2")] == ["alice", "alice", "bob"]
            assert await other.record_owners("openai", "bob", [("response", "resp_7"), ("output_item", "msg_3")],
                                             T0) == {"resp_7": "alice", "msg_3": "bob"}

    asyncio.run(body())


def test_the_owners_of_several_ids_are_read_at_once(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as one, backend.opened() as other:
            assert await one.owners_of("openai", []) == {}
            await one.record_owners("openai", "alice", [("item", "msg_a"), ("item", "msg_b")], T0)
            await other.record_owners("openai", "bob", [("item", "msg_c")], T0)
            await other.record_owners("anthropic", "bob", [("item", "msg_a")], T0)
            assert await other.owners_of("openai", ["msg_c", "msg_a", "msg_never", "msg_b", "MSG_A"]) == {
                "msg_a": "alice", "msg_b": "alice", "msg_c": "bob"}
            assert await one.owners_of("anthropic", ["msg_a", "msg_b"]) == {"msg_a": "bob"}

    asyncio.run(body())


def test_a_users_deletion_takes_their_records(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await record_one(store, "openai", "file-a", "alice", "file")
            await record_one(store, "openai", "file-b", "bob", "file")
            counts = await store.delete_user(Scope("alice"))
            assert counts["provider_objects"] == 1
            assert await store.owner_of("openai", "file-a") is None
            assert await store.owner_of("openai", "file-b") == "bob"

    asyncio.run(body())


def test_replicas_recording_overlapping_ids_in_other_orders_both_finish(backend: Backend) -> None:
    # An answer's ids recorded on one replica as a listing of the same items, newest first, is
    # recorded on another: each must not end up waiting on the row the other holds.
    ids = [f"msg_{n:04d}" for n in range(300)]

    async def body() -> None:
        async with backend.opened() as one, backend.opened() as other:
            for round_ in range(10):
                mine = [("item", f"{i}_{round_}") for i in ids]
                owners = await asyncio.gather(one.record_owners("openai", "alice", mine, T0),
                                              other.record_owners("openai", "alice", mine[::-1], T0))
                assert owners[0] == owners[1] == {object_id: "alice" for _, object_id in mine}

    asyncio.run(body())
