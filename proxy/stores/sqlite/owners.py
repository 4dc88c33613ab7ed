"""Who created each provider object memproxy saw created with its own key, on SQLite (ProviderObjects)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from proxy.stores.sqlite.rows import to_ts

T = TypeVar("T")


class SQLiteProviderObjects:
    """The ProviderObjects role of SQLiteStore (the host provides the connections)."""

    async def _lookup(self, sql: str, params: Sequence[Any]) -> list[sqlite3.Row]:  # provided by SQLiteStore
        raise NotImplementedError

    async def _on_writer(self, body: Callable[[sqlite3.Connection], T]) -> T:  # provided by SQLiteAdmin
        raise NotImplementedError

    async def record_owners(self, provider: str, user: str, objects: Sequence[tuple[str, str]], at: datetime
                            ) -> dict[str, str]:
        """Record `user` as each object's creator unless one is recorded, in one transaction; the
        creator of each, by id."""

        def record(conn: sqlite3.Connection) -> dict[str, str]:
            conn.executemany("INSERT INTO provider_objects (provider, object_id, user_id, kind, created_at)"
                             " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                             [(provider, object_id, user, kind, to_ts(at)) for kind, object_id in objects])
            return {object_id: str(conn.execute(
                "SELECT user_id FROM provider_objects WHERE provider = ? AND object_id = ?",
                (provider, object_id)).fetchone()[0]) for _, object_id in objects}

        return await self._on_writer(record)

    async def owner_of(self, provider: str, object_id: str) -> str | None:
        """The recorded creator of the object, None when memproxy never saw it created."""
        rows = await self._lookup("SELECT user_id FROM provider_objects WHERE provider = ? AND object_id = ?",
                                  [provider, object_id])
        return str(rows[0]["user_id"]) if rows else None

    async def owners_of(self, provider: str, object_ids: Sequence[str]) -> dict[str, str]:
        """The recorded creator of each object that has one, by id; on the event loop's read
        connection, so never behind the write lock."""
        rows = await self._lookup("SELECT p.object_id, p.user_id FROM json_each(?) j JOIN provider_objects p"
                                  " ON p.provider = ? AND p.object_id = j.value",
                                  [json.dumps(list(object_ids)), provider])
        return {str(row["object_id"]): str(row["user_id"]) for row in rows}
