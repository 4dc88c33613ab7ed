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

    async def record_owners(self, provider: str, user: str, objects: Sequence[tuple[str, str]], at: datetime
                            ) -> dict[str, str]:
        """Record `user` as each object's creator unless one is recorded, in one statement; the
        creator of each, by id."""
        # Rows inserted in one order on every replica: two replicas recording overlapping ids in
        # other orders (an answer's, a listing's newest first) would each wait on the other's row.
        ordered = sorted(objects, key=lambda each: each[1].encode())
        kinds, ids = [kind for kind, _ in ordered], [object_id for _, object_id in ordered]
        rows = await self._fetch(
            "WITH wanted AS (SELECT * FROM unnest($2::text[], $3::text[]) AS w(object_id, kind)),"
            " added AS (INSERT INTO provider_objects (provider, object_id, user_id, kind, created_at)"
            " SELECT $1, object_id, $4, kind, $5 FROM wanted ORDER BY object_id COLLATE \"C\""
            " ON CONFLICT DO NOTHING RETURNING object_id, user_id)"
            " SELECT object_id, user_id FROM added UNION ALL"
            " SELECT p.object_id, p.user_id FROM provider_objects p JOIN wanted USING (object_id)"
            " WHERE p.provider = $1 AND p.object_id NOT IN (SELECT object_id FROM added)",
            [provider, ids, kinds, user, utc(at)])
        owners = {str(row["object_id"]): str(row["user_id"]) for row in rows}
        for object_id in ids:
            if object_id not in owners:
                # Another replica recorded it meanwhile, after this statement's snapshot was taken.
                owners[object_id] = await self.owner_of(provider, object_id) or user
        return owners

    async def owner_of(self, provider: str, object_id: str) -> str | None:
        """The recorded creator of the object, None when memproxy never saw it created."""
        rows = await self._fetch("SELECT user_id FROM provider_objects WHERE provider = $1 AND object_id = $2",
                                 [provider, object_id])
        return str(rows[0]["user_id"]) if rows else None

    async def owners_of(self, provider: str, object_ids: Sequence[str]) -> dict[str, str]:
        """The recorded creator of each object that has one, by id: one SELECT, which no writer
        holds up."""
        rows = await self._fetch("SELECT object_id, user_id FROM provider_objects"
                                 " WHERE provider = $1 AND object_id = ANY($2::text[])", [provider, list(object_ids)])
        return {str(row["object_id"]): str(row["user_id"]) for row in rows}
