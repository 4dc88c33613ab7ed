"""SQLite and PostgreSQL rank a search alike: the same items, in the same order, with the same scores.

A store is chosen for deployment, not for recall: a user moving from one SQLite process to
replicas on PostgreSQL must find what they found before. Random histories (two users, three
agents, five conversations each, answers on half the turns) are written to both stores and
searched in every scope a recall uses; then the case where equal scores are reached by
different terms, whose order only the summation order decides.
"""

from __future__ import annotations

import asyncio
import math
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from proxy.models import Scope
from proxy.stores.base import FinishTurn, StartTurn, WriteOp
from proxy.stores.postgres.store import PostgresStore
from proxy.stores.sqlite.store import SQLiteStore

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
WORDS = "apple berry cherry date elder fig grape honey iris jade kiwi lemon mango".split()
Store = SQLiteStore | PostgresStore
Ranked = list[tuple[str, str, datetime, float]]


def history(rng: random.Random, turns: int) -> list[WriteOp]:
    ops: list[WriteOp] = []
    for i in range(turns):
        user = rng.choice(["alice", "alice", "alice", "bob"])
        scope = Scope(user, agent=rng.choice(["a1", "a2", None]))
        conversation = f"{user}-c{rng.randrange(5)}"
        said = " ".join(rng.choice(WORDS[:rng.randrange(3, len(WORDS))]) for _ in range(rng.randrange(1, 7)))
        at = T0 + timedelta(minutes=i)
        ops.append(StartTurn(scope, f"t{i}", conversation, f"h{i}", at, said))
        if rng.random() < 0.5:
            answer = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 5)))
            ops.append(FinishTurn(scope, f"t{i}", conversation, answer, at + timedelta(seconds=1)))
    return ops


async def searches(store: Store, seed: int) -> list[tuple[Any, Ranked]]:
    rng = random.Random(seed)
    found = []
    for _ in range(120):
        terms = [rng.choice([*WORDS, "zzz"]) for _ in range(rng.randrange(1, 6))]
        if rng.random() < 0.2:
            terms.append(terms[0])  # a word said twice in the query
        scope = rng.choice([Scope("alice"), Scope("alice", agent="a1", agent_isolated=True),
                            Scope("alice", agent=None, agent_isolated=True)])
        where: dict[str, Any] = rng.choice([
            {}, {"exclude_conversation_id": f"alice-c{rng.randrange(5)}"},
            {"conversation_ids": [f"alice-c{rng.randrange(5)}", f"alice-c{rng.randrange(5)}"]}])
        limit = rng.choice([1, 3, 5, 50])
        hits = await store.search_messages(scope, terms, limit=limit, **where)
        found.append(((terms, scope, where, limit), [(m.content, m.conversation_id, m.created_at, s) for m, s in hits]))
    return found


def on_both(tmp_path: Path, pg_url: str, ops: list[WriteOp], search: Any) -> tuple[Any, Any]:
    async def body() -> list[Any]:
        results = []
        for store in (SQLiteStore(str(tmp_path / "memory.db")), PostgresStore(pg_url)):
            await store.open()
            try:
                for n in range(0, len(ops), 50):
                    await store.apply(ops[n:n + 50])
                results.append(await search(store))
            finally:
                await store.close()
        return results

    sqlite, postgres = asyncio.run(body())
    return sqlite, postgres


@pytest.mark.parametrize("seed", range(6))
def test_random_histories_are_searched_alike(tmp_path: Path, pg_url: str, seed: int) -> None:
    rng = random.Random(seed)
    ops = history(rng, rng.choice([60, 300]))
    sqlite, postgres = on_both(tmp_path, pg_url, ops, lambda store: searches(store, seed))
    differ = [(query, a, b) for (query, a), (_, b) in zip(sqlite, postgres, strict=True)
              if [hit[:3] for hit in a] != [hit[:3] for hit in b]
              or not all(math.isclose(x[3], y[3], rel_tol=1e-9) for x, y in zip(a, b))]
    assert not differ, "\n\n".join(f"{q}\nsqlite     {a}\npostgresql {b}" for q, a, b in differ[:3])


def test_equal_scores_reached_by_different_terms_tie_alike(tmp_path: Path, pg_url: str) -> None:
    """honey, grape and elder are each in two messages and mango in three, so the first three
    messages all score idf(2) + idf(2) + idf(3), by different terms. Floating-point sums in
    another order differ in the last bit: PostgreSQL summed by term and ranked them otherwise."""
    texts = ["honey grape mango", "grape mango elder", "honey elder mango"] + ["pad pad pad"] * 8
    ops: list[WriteOp] = [StartTurn(Scope("alice"), f"t{n}", f"c{n}", f"h{n}", T0 + timedelta(minutes=n), text)
                          for n, text in enumerate(texts)]

    async def search(store: Store) -> list[tuple[str, float]]:
        return [(m.content, s) for m, s in await store.search_messages(
            Scope("alice"), ["honey", "grape", "mango", "elder"], limit=10)]

    sqlite, postgres = on_both(tmp_path, pg_url, ops, search)
    assert {content for content, _ in sqlite[:3]} == set(texts[:3])
    assert postgres == sqlite
