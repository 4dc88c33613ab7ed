"""What hooks keep in the store, on both backends: a turn's rewritten prompt and context, the
context a `stop` hook queues for a conversation's next turn, how both go with a deletion, and
the migrations that added them (SQLite v10, PostgreSQL v7, and the turn's context column after)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

from proxy.models import Scope
from proxy.stores.base import (
    HOOK_CONTEXT_KEEP, DropHookContext, FinishTurn, QueueHookContext, SaveBlock, SaveHookStart, StartTurn, Store,
)
from proxy.stores.generations import Generation
from proxy.stores.postgres.schema import MIGRATIONS as POSTGRES_MIGRATIONS
from proxy.stores.sqlite.schema import MIGRATIONS as SQLITE_MIGRATIONS
from tests.store_backends import Backend, backend  # noqa: F401  (the fixture)

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
ALICE = Scope("alice")
BOB = Scope("bob")


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def turn(scope: Scope, key: str, conversation: str, generation: int = 0, prompt: str | None = None) -> list[Any]:
    """A turn's writes at `generation`: its start, its block (with a hook's rewritten prompt) and its answer."""
    gen = Generation(generation, conversation)
    return [StartTurn(scope, key, conversation, f"h-{key}", T0, f"question {key}", generation=gen),
            SaveBlock(scope, key, f"block of {key}", 1, {}, T0, generation=gen, prompt=prompt),
            FinishTurn(scope, key, conversation, f"answer {key}", T0 + timedelta(seconds=1), generation=gen)]


def queue(scope: Scope, conversation: str, text: str, generation: int = 0) -> QueueHookContext:
    return QueueHookContext(scope, conversation, text, T0, Generation(generation, conversation))


async def prompt_of(store: Store, scope: Scope, key: str) -> str | None:
    found = await store.find_turn(scope, [], f"h-{key}", T0 - timedelta(days=1))
    assert found.turn is not None
    return found.turn.prompt


def test_a_turns_rewritten_prompt_stays_when_its_block_is_computed_again(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply(turn(ALICE, "t1", "c1", prompt="deploy it [rewritten]"))
            assert await prompt_of(store, ALICE, "t1") == "deploy it [rewritten]"
            # After a deletion the block is computed again; the hooks do not run again for the turn.
            await store.apply([SaveBlock(ALICE, "t1", "a newer block", 1, {}, T0, generation=Generation(1, "c1"))])
            assert await prompt_of(store, ALICE, "t1") == "deploy it [rewritten]"

    run(body())


def test_a_turns_hook_context_stays_when_its_block_is_computed_again(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply(turn(ALICE, "t1", "c1")[:1] + [
                SaveBlock(ALICE, "t1", "block\n\nanswer in French", 1, {}, T0, generation=Generation(0, "c1"),
                          context="answer in French")])
            found = await store.find_turn(ALICE, [], "h-t1", T0 - timedelta(days=1))
            assert found.turn is not None and found.turn.context == "answer in French"
            await store.apply([SaveBlock(ALICE, "t1", "a newer block", 1, {}, T0, generation=Generation(1, "c1"))])
            found = await store.find_turn(ALICE, [], "h-t1", T0 - timedelta(days=1))
            assert found.turn is not None and (found.turn.block, found.turn.context) == (
                "a newer block", "answer in French")
            assert (await store.find_turn(BOB, [], "h-t1", T0 - timedelta(days=1))).turn is None

    run(body())


def test_a_turn_without_a_block_keeps_its_hooks_rewrite_and_context_until_one_is_computed(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            gen = Generation(0, "c1")
            # The first step's retrieval was degraded: no block, but what the hooks gave is kept.
            await store.apply(turn(ALICE, "t1", "c1")[:1] + [
                SaveHookStart(ALICE, "t1", "deploy it [rewritten]", "answer in French", T0, gen)])
            found = await store.find_turn(ALICE, [], "h-t1", T0 - timedelta(days=1))
            assert found.turn is not None
            assert (found.turn.block, found.turn.prompt, found.turn.context) == (
                None, "deploy it [rewritten]", "answer in French")
            # A later step computes the block; a late copy of the op no longer changes the turn.
            await store.apply([SaveBlock(ALICE, "t1", "block", 1, {}, T0, generation=gen),
                               SaveHookStart(ALICE, "t1", "other", "other", T0, gen)])
            found = await store.find_turn(ALICE, [], "h-t1", T0 - timedelta(days=1))
            assert found.turn is not None
            assert (found.turn.block, found.turn.prompt, found.turn.context) == (
                "block", "deploy it [rewritten]", "answer in French")
            # Written after a deletion of the turn's conversation that came after the turn began: skipped.
            await store.apply(turn(ALICE, "t2", "c2")[:1])
            assert await store.delete_item(ALICE, "conversation", "c1") is not None
            await store.apply([SaveHookStart(ALICE, "t2", "late", "late", T0, Generation(0, "c2")),
                               SaveHookStart(ALICE, "t2", "too late", None, T0, Generation(0, "c1"))])
            assert await prompt_of(store, ALICE, "t2") == "late"

    run(body())


def test_queued_context_keeps_the_newest_and_a_turn_takes_it_off(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply(turn(ALICE, "t1", "c1") + [queue(ALICE, "c1", f"note {n}")
                                                         for n in range(HOOK_CONTEXT_KEEP + 3)])
            queued = await store.hook_context(ALICE, "c1")
            assert [text for _, text in queued] == [f"note {n}" for n in range(3, HOOK_CONTEXT_KEEP + 3)]
            assert await store.hook_context(BOB, "c1") == []
            await store.apply([DropHookContext(ALICE, "c1", queued[-2][0])])
            assert [text for _, text in await store.hook_context(ALICE, "c1")] == [f"note {HOOK_CONTEXT_KEEP + 2}"]

    run(body())


def test_deleting_a_user_counts_and_takes_its_queued_context_and_rewritten_prompts(backend: Backend) -> None:
    async def body() -> dict[str, int]:
        async with backend.opened() as store:
            await store.apply(turn(ALICE, "t1", "c1", prompt="secret [rewritten]") + turn(BOB, "b1", "c1")
                              + [queue(ALICE, "c1", "alice's reminder"), queue(ALICE, "c1", "another"),
                                 queue(BOB, "c1", "bob's reminder")])
            counts = await store.delete_user(ALICE)
            assert await store.hook_context(ALICE, "c1") == []
            assert [text for _, text in await store.hook_context(BOB, "c1")] == ["bob's reminder"]
        assert await backend.sql("SELECT count(*) FROM turns WHERE prompt IS NOT NULL") == [(0,)]
        return counts

    counts = run(body())
    assert (counts["hook_context"], counts["turns"]) == (2, 1)


def test_deleting_a_conversation_takes_its_queued_context_only(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply(turn(ALICE, "t1", "c1") + turn(ALICE, "t2", "c2")
                              + [queue(ALICE, "c1", "for c1"), queue(ALICE, "c2", "for c2")])
            assert await store.delete_item(ALICE, "conversation", "c1") is not None
            assert await store.hook_context(ALICE, "c1") == []
            assert [text for _, text in await store.hook_context(ALICE, "c2")] == ["for c2"]

    run(body())


def test_context_a_turn_queues_after_its_users_or_conversations_deletion_is_dropped(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply(turn(ALICE, "t1", "c1") + turn(ALICE, "t2", "c2") + turn(BOB, "b1", "c1"))
            assert await store.delete_item(ALICE, "conversation", "c1") is not None
            # The stop hooks of turns begun before the deletion answer after it.
            await store.apply([queue(ALICE, "c1", "late for c1"), queue(ALICE, "c2", "late for c2"),
                               queue(BOB, "c1", "bob's")])
            assert await store.hook_context(ALICE, "c1") == []
            assert [text for _, text in await store.hook_context(ALICE, "c2")] == ["late for c2"]
            await store.delete_user(ALICE)
            await store.apply(turn(ALICE, "t3", "c3", 0) + [queue(ALICE, "c3", "late for c3", 0)])
            assert await store.hook_context(ALICE, "c3") == []
            # A turn begun after the deletions queues as usual; so did the other user's.
            generation = (await store.find_turn(ALICE, [], "none", T0)).generation
            await store.apply(turn(ALICE, "t4", "c4", generation) + [queue(ALICE, "c4", "new", generation)])
            assert [text for _, text in await store.hook_context(ALICE, "c4")] == ["new"]
            assert [text for _, text in await store.hook_context(BOB, "c1")] == ["bob's"]

    run(body())


def test_context_for_a_conversation_the_store_does_not_have_is_skipped_and_the_batch_commits(
        backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([QueueHookContext(ALICE, "nowhere", "lost", T0)] + turn(ALICE, "t1", "c1"))
            assert await store.hook_context(ALICE, "nowhere") == []
            assert await prompt_of(store, ALICE, "t1") is None  # the turn after it was saved

    run(body())


def _migrations(backend: Backend) -> tuple[str, ...]:
    return SQLITE_MIGRATIONS if backend.name == "sqlite" else POSTGRES_MIGRATIONS


def _hooks_version(backend: Backend) -> int:
    return 10 if backend.name == "sqlite" else 7


def test_a_database_of_the_version_before_hooks_migrates_and_keeps_its_turns(backend: Backend) -> None:
    latest = len(_migrations(backend))
    assert "hook_context" in _migrations(backend)[_hooks_version(backend) - 1]

    async def body() -> None:
        async with backend.opened() as store:
            await store.apply(turn(ALICE, "t1", "c1"))
        # Back to the version before hooks: no prompt or context column, no queue, no version rows.
        await backend.sql("DROP TABLE hook_context")
        await backend.sql("ALTER TABLE turns DROP COLUMN prompt")
        await backend.sql("ALTER TABLE turns DROP COLUMN hook_context")
        await backend.sql("DELETE FROM schema_version WHERE version >= ?", _hooks_version(backend))
        async with backend.opened() as store:
            assert await prompt_of(store, ALICE, "t1") is None
            await store.apply([SaveBlock(ALICE, "t1", "again", 1, {}, T0, generation=Generation(1, "c1"),
                                         prompt="rewritten", context="context"), queue(ALICE, "c1", "queued")])
            assert await prompt_of(store, ALICE, "t1") == "rewritten"
            found = await store.find_turn(ALICE, [], "h-t1", T0 - timedelta(days=1))
            assert found.turn is not None and found.turn.context == "context"
            assert [text for _, text in await store.hook_context(ALICE, "c1")] == ["queued"]
        assert await backend.sql("SELECT max(version) FROM schema_version") == [(latest,)]

    run(body())


def test_the_hooks_migration_runs_again_over_its_own_work(backend: Backend) -> None:
    latest = len(_migrations(backend))

    async def body() -> None:
        async with backend.opened() as store:
            await store.apply(turn(ALICE, "t1", "c1", prompt="kept") + [queue(ALICE, "c1", "kept too")])
        await backend.sql("DELETE FROM schema_version WHERE version >= ?", _hooks_version(backend))  # rows lost
        async with backend.opened() as store:
            assert await prompt_of(store, ALICE, "t1") == "kept"
            assert [text for _, text in await store.hook_context(ALICE, "c1")] == ["kept too"]
        assert await backend.sql("SELECT max(version) FROM schema_version") == [(latest,)]

    run(body())
