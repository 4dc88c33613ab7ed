"""Who created each provider object memproxy saw created with its own key, on SQLite (ProviderObjects)."""

from __future__ import annotations

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

    async def record_owner(self, provider: str, object_id: str, user: str, kind: str, at: datetime) -> str:
        """Record `user` as the object's creator unless one is recorded; the creator."""

        def record(conn: sqlite3.Connection) -> str:
            conn.execute("INSERT INTO provider_objects (provider, object_id, user_id, kind, created_at)"
                         " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                         (provider, object_id, user, kind, to_ts(at)))
            row = conn.execute("SELECT user_id FROM provider_objects WHERE provider = ? AND object_id = ?",
                               (provider, object_id)).fetchone()
            return str(row[0])

        return await self._on_writer(record)

    async def owner_of(self, provider: str, object_id: str) -> str | None:
        """The recorded creator of the object, None when memproxy never saw it created."""
        rows = await self._lookup("SELECT user_id FROM provider_objects WHERE provider = ? AND object_id = ?",
                                  [provider, object_id])
        return str(rows[0]["user_id"]) if rows else None
