"""The store contract for a step's tool calls kept per turn, on both backends: a database made
before they were keyed by (user, call id, turn) migrates, keeps its rows, and takes an id that
another turn reuses."""

from __future__ import annotations

from datetime import timedelta

from proxy.stores.base import RecordToolCalls
from proxy.stores.postgres.schema import MIGRATIONS as POSTGRES_MIGRATIONS
from proxy.stores.sqlite.schema import MIGRATIONS as SQLITE_MIGRATIONS
from tests.store_backends import Backend, backend  # noqa: F401  (the fixture)
from tests.test_store_contract import ALICE, T0, key, run, start

# The DDL of the table as it was before (keyed by user and call id alone), per backend.
_BEFORE = {
    "sqlite": (
        "CREATE TABLE turn_tool_calls_before (user_id TEXT NOT NULL, call_id TEXT NOT NULL, turn_key TEXT NOT NULL,"
        " name TEXT NOT NULL, arguments TEXT NOT NULL, created_at REAL NOT NULL, exchange TEXT,"
        " PRIMARY KEY (user_id, call_id),"
        " FOREIGN KEY (user_id, turn_key) REFERENCES turns(user_id, turn_key) ON DELETE CASCADE)",
        "INSERT INTO turn_tool_calls_before SELECT user_id, call_id, turn_key, name, arguments, created_at, exchange"
        " FROM turn_tool_calls",
        "DROP TABLE turn_tool_calls",
        "ALTER TABLE turn_tool_calls_before RENAME TO turn_tool_calls",
        "CREATE INDEX turn_tool_calls_turn ON turn_tool_calls(user_id, turn_key)",
    ),
    "postgres": (
        "ALTER TABLE turn_tool_calls DROP CONSTRAINT turn_tool_calls_pkey",
        "ALTER TABLE turn_tool_calls ADD PRIMARY KEY (user_id, call_id)",
    ),
}


def _version(backend: Backend) -> int:
    """The migration that keys the calls per turn."""
    return 13 if backend.name == "sqlite" else 10


def _latest(backend: Backend) -> int:
    return len(SQLITE_MIGRATIONS if backend.name == "sqlite" else POSTGRES_MIGRATIONS)


def test_a_database_keyed_by_call_id_alone_migrates_and_keeps_its_calls(backend: Backend) -> None:
    later = T0 + timedelta(hours=1)
    assert "turn_tool_calls" in (SQLITE_MIGRATIONS if backend.name == "sqlite" else POSTGRES_MIGRATIONS)[
        _version(backend) - 1]

    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([start(ALICE, "k1"), start(ALICE, "k2", conv="c2", at=later),
                               RecordToolCalls(ALICE, "k1", (("call_0", "search", "{}"),), T0, exchange="first's")])
        for statement in _BEFORE[backend.name]:
            await backend.sql(statement)
        await backend.sql("DELETE FROM schema_version WHERE version >= ?", _version(backend))
        async with backend.opened() as store:  # migrates
            assert await store.memory_exchanges(ALICE, "k1", ["call_0"]) == {"call_0": "first's"}
            await store.apply([RecordToolCalls(ALICE, "k2", (("call_0", "fetch", "{}"),), later, exchange="second's")])
            assert await store.memory_exchanges(ALICE, "k1", ["call_0"]) == {"call_0": "first's"}
            assert await store.memory_exchanges(ALICE, "k2", ["call_0"]) == {"call_0": "second's"}
            assert key((await store.find_turn(ALICE, ["call_0"], "h-k1", later)).turn) == "k1"
        assert await backend.sql("SELECT max(version) FROM schema_version") == [(_latest(backend),)]
        # The script run again over its own work (a version row lost) keeps every row.
        await backend.sql("DELETE FROM schema_version WHERE version >= ?", _version(backend))
        async with backend.opened() as store:
            assert await store.memory_exchanges(ALICE, "k1", ["call_0"]) == {"call_0": "first's"}
            assert await store.memory_exchanges(ALICE, "k2", ["call_0"]) == {"call_0": "second's"}
        assert await backend.sql("SELECT max(version) FROM schema_version") == [(_latest(backend),)]
        assert sorted(await backend.sql("SELECT turn_key, call_id FROM turn_tool_calls")) == [
            ("k1", "call_0"), ("k2", "call_0")]

    run(body())
