"""Embeddings on PostgreSQL: the items lacking a vector, saving vectors, and reading them back.

`PostgresVectors` is mixed into `PostgresStore`, as `SQLiteVectors` is into `SQLiteStore`
(sqlite/vectors.py is the reference). Vectors are `real[]`; they cross the wire as
`array_send` bytes, turned into float32 little-endian by numpy rather than one Python
float per component (a user's 100k vectors of 1,536 floats would be 150M objects).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import asyncpg
import numpy as np

from proxy.models import Scope
from proxy.stores.base import EMBEDDING_KINDS, EmbeddingKind, NewEmbedding, StoredVector, Unembedded, VectorMark
from proxy.stores.postgres.reads import Args, agent_clause
from proxy.stores.postgres.rows import entity_from_record, message_from_record, trace_from_record
from proxy.stores.vector_sql import table_of

T = TypeVar("T")
# array_send of a one-dimensional real[]: ndim, has-nulls flag, element type, length and
# lower bound (five int32), then each element as its int32 length and big-endian float32.
_ARRAY_HEADER = 20
_FROM_RECORD: dict[str, Callable[[asyncpg.Record], Any]] = {
    "message": message_from_record, "entity": entity_from_record, "reasoning": trace_from_record,
}


def float32_bytes(sent: bytes) -> bytes:
    """array_send bytes of a real[] as float32 little-endian."""
    pairs = np.frombuffer(sent, dtype=">f4", offset=_ARRAY_HEADER).reshape(-1, 2)
    return pairs[:, 1].astype("<f4").tobytes()


class PostgresVectors:
    """The embeddings half of PostgresStore (the host provides the pool)."""

    async def _fetch(self, sql: str, args: Sequence[Any]) -> list[asyncpg.Record]:  # provided by PostgresStore
        raise NotImplementedError

    async def _locked(self, users: Iterable[str], body: Callable[[asyncpg.Connection], Awaitable[T]]
                      ) -> T:  # provided by PostgresStore
        raise NotImplementedError

    async def unembedded(self, model: str, kind: EmbeddingKind, *, after: int = 0, limit: int = 64,
                         user: str | None = None, upto: int | None = None) -> list[Unembedded]:
        """Items of `kind` with seq above `after` (and at most `upto`) and no vector for `model`, by seq."""
        t, args = table_of(kind), Args()
        mine = "" if user is None else f" AND x.user_id = {args(user)}"
        mine += "" if upto is None else f" AND x.seq <= {args(upto)}"
        rows = await self._fetch(
            f"SELECT x.seq, x.id, x.user_id, x.agent_id, {t.cut_text} AS text, {t.group} AS grp FROM {t.table} x"
            f" WHERE x.seq > {args(after)}{mine} AND {t.text} <> '' AND NOT EXISTS (SELECT 1 FROM embeddings e"
            f" WHERE e.user_id = x.user_id AND e.kind = {args(kind)} AND e.item_id = x.id AND e.model = {args(model)})"
            f" ORDER BY x.seq LIMIT {args(limit)}", args)
        return [Unembedded(Scope(row["user_id"], agent=row["agent_id"]), kind, row["id"], row["seq"], row["text"],
                           row["grp"]) for row in rows]

    async def save_embeddings(self, model: str, vectors: Sequence[NewEmbedding]) -> int:
        """Save the vectors whose items still read their text; how many were saved."""
        if not vectors:
            return 0
        by_kind: dict[str, list[NewEmbedding]] = {}
        for v in vectors:
            by_kind.setdefault(v.kind, []).append(v)

        async def save(conn: asyncpg.Connection) -> int:
            saved = 0
            for kind, rows in sorted(by_kind.items()):
                t = table_of(kind)
                result = await conn.execute(
                    "INSERT INTO embeddings (user_id, kind, item_id, model, dim, vector, created_at)"
                    " SELECT v.user_id, $1, v.item_id, $2, cardinality(v.vector), v.vector, now()"
                    " FROM unnest($3::text[], $4::text[], $5::text[]) WITH ORDINALITY AS v0(user_id, item_id, text, n)"
                    " CROSS JOIN LATERAL (SELECT v0.user_id, v0.item_id,"
                    " ($6::real[])[v0.n * $7 - $7 + 1 : v0.n * $7] AS vector) v"
                    f" WHERE EXISTS (SELECT 1 FROM {t.table} x WHERE x.user_id = v.user_id AND x.id = v.item_id"
                    f" AND {t.cut_text} = v0.text)"
                    " ON CONFLICT (user_id, kind, item_id, model) DO UPDATE SET dim = excluded.dim,"
                    " vector = excluded.vector, created_at = excluded.created_at",
                    kind, model, [r.user for r in rows], [r.item_id for r in rows], [r.text for r in rows],
                    *_packed(rows))
                saved += int(result.split()[-1])
            return saved

        return await self._locked(sorted({v.user for v in vectors}), save)

    async def newest_seqs(self) -> dict[EmbeddingKind, int]:
        """The highest item seq of each kind, every user's (0 for none)."""
        columns = ", ".join(f"(SELECT coalesce(max(seq), 0) FROM {table_of(kind).table}) AS {kind}"
                            for kind in EMBEDDING_KINDS)
        (row,) = await self._fetch(f"SELECT {columns}", [])
        return {kind: int(row[kind]) for kind in EMBEDDING_KINDS}

    async def vectors(self, scope: Scope, kind: EmbeddingKind, model: str, *, after: int = 0,
                      newest: int | None = None) -> list[StoredVector]:
        """Every vector of the user for this kind and model saved after row seq `after`, each agent's, by seq."""
        t = table_of(kind)
        rows = await self._fetch(
            f"SELECT e.seq, e.item_id, {t.group} AS grp, x.agent_id, array_send(e.vector) AS sent FROM embeddings e"
            f" JOIN {t.table} x ON x.user_id = e.user_id AND x.id = e.item_id"
            " WHERE e.user_id = $1 AND e.kind = $2 AND e.model = $3 AND e.seq > $4 ORDER BY e.seq",
            [scope.user, kind, model, after])
        return [StoredVector(row["item_id"], row["grp"], row["agent_id"], float32_bytes(row["sent"]), row["seq"])
                for row in rows]

    async def vector_marks(self, scope: Scope, model: str) -> dict[EmbeddingKind, VectorMark]:
        """The user's newest vector row of each kind for `model`: one probe of embeddings_newest each."""
        rows = await self._fetch(
            "SELECT k.kind, n.seq, extract(epoch FROM n.created_at)::float8 AS saved_at"
            " FROM unnest($3::text[]) AS k(kind) CROSS JOIN LATERAL (SELECT e.seq, e.created_at FROM embeddings e"
            " WHERE e.user_id = $1 AND e.kind = k.kind AND e.model = $2 ORDER BY e.seq DESC LIMIT 1) n",
            [scope.user, model, list(EMBEDDING_KINDS)])
        return {row["kind"]: VectorMark(int(row["seq"]), float(row["saved_at"])) for row in rows}

    async def embedded_items(self, scope: Scope, kind: EmbeddingKind, item_ids: Sequence[str], model: str
                             ) -> list[Any]:
        """The items among `item_ids` that still hold a vector for `model`, agent-filtered as the searches are."""
        if not item_ids:
            return []
        t, args = table_of(kind), Args()
        wanted, user = args(list(item_ids)), args(scope.user)
        agent = agent_clause(scope, "x", args, per_agent=kind == "reasoning")
        rows = await self._fetch(
            f"SELECT x.* FROM {t.table} x WHERE x.user_id = {user} AND x.id = ANY({wanted}::text[])"
            f" AND EXISTS (SELECT 1 FROM embeddings e WHERE e.user_id = x.user_id AND e.kind = {args(kind)}"
            f" AND e.item_id = x.id AND e.model = {args(model)}){agent} ORDER BY x.id", args)
        shape = _FROM_RECORD[kind]
        return [shape(row) for row in rows]


def _packed(rows: Sequence[NewEmbedding]) -> tuple[list[float], int]:
    """The vectors as one flat real[] and their (common) length: one parameter, not one per vector."""
    dims = {len(r.vector) for r in rows}
    if len(dims) != 1:
        raise ValueError("vectors of one save differ in length")
    flat = np.frombuffer(b"".join(r.vector for r in rows), dtype="<f4")
    return flat.tolist(), dims.pop() // 4
