"""Who created each provider object memproxy saw created with its own key, on PostgreSQL (ProviderObjects)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

from proxy.stores.postgres.rows import utc


class PostgresProviderObjects:
    """The ProviderObjects role of PostgresStore: one statement each, no user lock (a row is
    written once, and the first creator recorded stays)."""

    async def _fetch(self, sql: str, args: Sequence[Any]) -> list[asyncpg.Record]:  # provided by PostgresStore
        raise NotImplementedError

    async def record_owner(self, provider: str, object_id: str, user: str, kind: str, at: datetime) -> str:
        """Record `user` as the object's creator unless one is recorded; the creator."""
        rows = await self._fetch(
            "WITH added AS (INSERT INTO provider_objects (provider, object_id, user_id, kind, created_at)"
            " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING user_id)"
            " SELECT user_id FROM added UNION ALL"
            " SELECT user_id FROM provider_objects WHERE provider = $1 AND object_id = $2 LIMIT 1",
            [provider, object_id, user, kind, utc(at)])
        if rows:
            return str(rows[0]["user_id"])
        # Another replica recorded it meanwhile, after this statement's snapshot was taken.
        return await self.owner_of(provider, object_id) or user

    async def owner_of(self, provider: str, object_id: str) -> str | None:
        """The recorded creator of the object, None when memproxy never saw it created."""
        rows = await self._fetch("SELECT user_id FROM provider_objects WHERE provider = $1 AND object_id = $2",
                                 [provider, object_id])
        return str(rows[0]["user_id"]) if rows else None
