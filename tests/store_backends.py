"""The two store backends behind one test interface, for the contract suite.

Each backend opens its real store (a SQLite file; a fresh schema on the session's
PostgreSQL server) and offers the few raw-SQL hooks the tests need to set a scene or
check a table: rows the write ops cannot make yet (entities, edges), an injected
failure, and reads of tables the protocol does not expose.
"""

from __future__ import annotations

import re
import sqlite3
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from proxy.stores.base import Store
from proxy.stores.postgres.store import PostgresStore
from proxy.stores.sqlite.store import SQLiteStore
from proxy.stores.indexed_text import entity_terms

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Each backend in turn: a SQLite file, then a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        return SQLiteBackend(tmp_path / "m.db")
    return PostgresBackend(request.getfixturevalue("pg_url"))


class Backend:
    """A store under test plus raw SQL on its database (`?` placeholders on both)."""

    name = ""

    def store(self) -> Store:
        """A new, unopened store on this backend's database."""
        raise NotImplementedError

    async def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        """Run one statement; its rows as tuples."""
        raise NotImplementedError

    def stamp(self, at: datetime) -> Any:
        """A timestamp as this backend's columns hold it."""
        raise NotImplementedError

    async def fail_on_message(self, content: str) -> None:
        """Make inserting a message with this content fail with 'injected failure'."""
        raise NotImplementedError

    @asynccontextmanager
    async def opened(self) -> AsyncIterator[Any]:
        """An open store, closed afterwards."""
        store = self.store()
        await store.open()
        try:
            yield store
        finally:
            await store.close()

    async def add_entity(self, user: str, name: str, type_: str = "", description: str = "",
                         agent: str | None = None) -> str:
        """An entity written as the extraction work writes it."""
        eid = uuid.uuid4().hex
        zero = self.stamp(EPOCH)
        await self.sql("INSERT INTO users (id, created_at) VALUES (?, ?) ON CONFLICT DO NOTHING", user, zero)
        await self.sql(
            "INSERT INTO entities (id, user_id, agent_id, name, canonical_name, type, description, name_terms,"
            " type_terms, description_terms, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            eid, user, agent, name, " ".join(name.lower().split()), type_, description,
            *entity_terms(name, type_, description), zero, zero,
        )
        return eid

    async def add_edge(self, user: str, from_id: str, type_: str, to_id: str, *, valid_from: datetime,
                       invalid_at: datetime | None = None) -> str:
        """A relationship between two entities of the user."""
        rid = uuid.uuid4().hex
        await self.sql(
            "INSERT INTO relationships (id, user_id, from_id, type, to_id, valid_from, invalid_at, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            rid, user, from_id, type_, to_id, self.stamp(valid_from),
            None if invalid_at is None else self.stamp(invalid_at), self.stamp(EPOCH),
        )
        return rid


class SQLiteBackend(Backend):
    """A SQLite file in the test's temporary directory."""

    name = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path

    def store(self) -> Store:
        return SQLiteStore(str(self.path))

    async def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with closing(sqlite3.connect(self.path)) as db, db:
            db.execute("PRAGMA foreign_keys=ON")
            return [tuple(row) for row in db.execute(query, params).fetchall()]

    def stamp(self, at: datetime) -> Any:
        return at.timestamp()

    async def fail_on_message(self, content: str) -> None:
        await self.sql("CREATE TRIGGER fault BEFORE INSERT ON messages WHEN new.content = ?"
                       " BEGIN SELECT RAISE(ABORT, 'injected failure'); END".replace("?", _quote(content)))


class PostgresBackend(Backend):
    """A fresh schema on the session's PostgreSQL server."""

    name = "postgres"

    def __init__(self, url: str) -> None:
        self.url = url

    def store(self) -> Store:
        return PostgresStore(self.url)

    async def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        numbered = iter(range(1, 1000))
        query = re.sub(r"\?", lambda _: f"${next(numbered)}", query)
        conn = await asyncpg.connect(self.url)
        try:
            return [tuple(row) for row in await conn.fetch(query, *params)]
        finally:
            await conn.close()

    def stamp(self, at: datetime) -> Any:
        return at

    async def fail_on_message(self, content: str) -> None:
        await self.sql(
            "CREATE FUNCTION fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            f" IF NEW.content = {_quote(content)} THEN RAISE EXCEPTION 'injected failure'; END IF;"
            " RETURN NEW; END $$"
        )
        await self.sql("CREATE TRIGGER fault BEFORE INSERT ON messages FOR EACH ROW EXECUTE FUNCTION fault()")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
