"""Who created each provider object, in the Store contract, on both backends (ProviderObjects).

Several replicas and processes share the store: whichever records an object first is its
creator for all of them, and a user's deletion takes the user's records with it.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from tests.store_backends import Backend, backend  # noqa: F401  (the fixture)
from proxy.models import Scope

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def test_the_first_creator_recorded_is_the_owner_for_every_store_on_the_database(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as one, backend.opened() as other:
            assert await one.owner_of("openai", "resp_1") is None
            assert await one.record_owner("openai", "resp_1", "alice", "response", T0) == "alice"
            # Another replica sees it at once, and cannot take it over.
            assert await other.owner_of("openai", "resp_1") == "alice"
            assert await other.record_owner("openai", "resp_1", "bob", "response", T0) == "alice"
            assert await one.owner_of("openai", "resp_1") == "alice"
            # Ids are per provider, and exact.
            assert await one.owner_of("anthropic", "resp_1") is None
            assert await one.owner_of("openai", "RESP_1") is None
            assert await one.owner_of("openai", "resp_") is None
            assert await other.record_owner("anthropic", "resp_1", "bob", "file", T0) == "bob"
            results = await asyncio.gather(*(store.record_owner("openai", "conv_9", user, "conversation", T0)
                                             for store, user in ((one, "carol"), (other, "dave")) * 3))
            assert len(set(results)) == 1 and await one.owner_of("openai", "conv_9") == results[0]

    asyncio.run(body())


def test_a_users_deletion_takes_their_records(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.record_owner("openai", "file-a", "alice", "file", T0)
            await store.record_owner("openai", "file-b", "bob", "file", T0)
            counts = await store.delete_user(Scope("alice"))
            assert counts["provider_objects"] == 1
            assert await store.owner_of("openai", "file-a") is None
            assert await store.owner_of("openai", "file-b") == "bob"

    asyncio.run(body())
