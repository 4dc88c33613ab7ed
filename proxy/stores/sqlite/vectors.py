"""Embeddings on SQLite: the items lacking a vector, saving vectors, and reading them back.

`SQLiteVectors` is mixed into `SQLiteStore`: reads run on its read connections, saves on
its write thread in one IMMEDIATE transaction (queued behind the writer's batches). The
reads a request makes (the marks, the vectors saved since the cached ones, the items of a
few hits) and what the writer reads after each commit (the newest seqs, the items in a
narrow range of seqs) are lookups of a few rows by an index: they run on the event loop's own connection, where a hop to a reader thread
and back cost more than the read (sqlite/readers.py).
Vectors are float32 little-endian BLOBs; the triggers of sqlite/schema.py drop an item's
vectors when its text changes or it is deleted.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from proxy.models import Scope
from proxy.stores.base import EMBEDDING_KINDS, EmbeddingKind, NewEmbedding, StoredVector, Unembedded, VectorMark
from proxy.stores.sqlite.rows import now_ts
from proxy.stores.sqlite.search import HIT_READS
from proxy.stores.vector_sql import table_of

T = TypeVar("T")
FLOAT32_BYTES = 4
# A range of seqs this narrow (the items of the commits just made) is read on the event loop.
NARROW_SEQS = 256


def _agent(scope: Scope, kind: str, alias: str) -> tuple[str, list[Any]]:
    """The searches' agent filter: under isolation, and always for reasoning (per agent)."""
    if scope.agent_isolated or (kind == "reasoning" and scope.agent is not None):
        return f" AND {alias}.agent_id IS ?", [scope.agent]
    return "", []


class SQLiteVectors:
    """The embeddings half of SQLiteStore (the host provides the connections)."""

    async def _read(self, work: Callable[[sqlite3.Connection], T], *, here: bool = False) -> T:  # SQLiteStore's
        raise NotImplementedError

    async def _on_writer(self, body: Callable[[sqlite3.Connection], T]) -> T:  # provided by SQLiteAdmin
        raise NotImplementedError

    async def unembedded(self, model: str, kind: EmbeddingKind, *, after: int = 0, limit: int = 64,
                         user: str | None = None, upto: int | None = None) -> list[Unembedded]:
        """Items of `kind` with seq above `after` (and at most `upto`) and no vector for `model`, by seq."""
        t = table_of(kind)
        mine, params = ("", list[object]()) if user is None else (" AND x.user_id = ?", [user])
        if upto is not None:
            mine, params = mine + " AND x.seq <= ?", [*params, upto]
        sql = (f"SELECT x.seq, x.id, x.user_id, x.agent_id, {t.cut_text} AS text, {t.group} AS grp FROM {t.table} x"
               f" WHERE x.seq > ?{mine} AND {t.text} <> '' AND NOT EXISTS (SELECT 1 FROM embeddings e"
               " WHERE e.user_id = x.user_id AND e.kind = ? AND e.item_id = x.id AND e.model = ?)"
               " ORDER BY x.seq LIMIT ?")
        args = [after, *params, kind, model, limit]
        narrow = upto is not None and upto - after <= NARROW_SEQS
        rows = await self._read(lambda conn: conn.execute(sql, args).fetchall(), here=narrow)
        return [Unembedded(Scope(row["user_id"], agent=row["agent_id"]), kind, row["id"], row["seq"], row["text"],
                           row["grp"]) for row in rows]

    async def save_embeddings(self, model: str, vectors: Sequence[NewEmbedding]) -> int:
        """Save the vectors whose items still read their text; how many were saved."""
        if not vectors:
            return 0
        now = now_ts()

        def save(conn: sqlite3.Connection) -> int:
            saved = 0
            for v in vectors:
                t = table_of(v.kind)
                cursor = conn.execute(
                    "INSERT INTO embeddings (user_id, kind, item_id, model, dim, vector, created_at)"
                    " SELECT ?, ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM"
                    f" {t.table} x WHERE x.user_id = ? AND x.id = ? AND {t.cut_text} = ?)"
                    " ON CONFLICT (user_id, kind, item_id, model) DO UPDATE SET dim = excluded.dim,"
                    " vector = excluded.vector, created_at = excluded.created_at",
                    (v.user, v.kind, v.item_id, model, len(v.vector) // FLOAT32_BYTES, v.vector, now,
                     v.user, v.item_id, v.text))
                saved += cursor.rowcount
            return saved

        return await self._on_writer(save)

    async def newest_seqs(self) -> dict[EmbeddingKind, int]:
        """The highest item seq of each kind, every user's (0 for none)."""
        sql = "SELECT " + ", ".join(f"(SELECT ifnull(max(seq), 0) FROM {table_of(kind).table})"
                                    for kind in EMBEDDING_KINDS)
        row = await self._read(lambda conn: conn.execute(sql).fetchone(), here=True)
        return {kind: int(row[n]) for n, kind in enumerate(EMBEDDING_KINDS)}

    async def vectors(self, scope: Scope, kind: EmbeddingKind, model: str, *, after: int = 0,
                      newest: int | None = None) -> list[StoredVector]:
        """Every vector of the user for this kind and model saved after row `after`, each agent's, by rowid."""
        t = table_of(kind)
        sql = (f"SELECT e.rowid AS seq, e.item_id, {t.group} AS grp, x.agent_id, e.vector FROM embeddings e"
               f" JOIN {t.table} x ON x.user_id = e.user_id AND x.id = e.item_id"
               " WHERE e.user_id = ? AND e.kind = ? AND e.model = ? AND e.rowid > ? ORDER BY e.rowid")
        # A first load, or a catch-up past another process's large import or a reindex, reads many
        # vectors: a reader thread's work. A few rows since the cached ones are read on the loop.
        narrow = after > 0 and newest is not None and newest - after <= NARROW_SEQS
        rows = await self._read(lambda conn: conn.execute(sql, (scope.user, kind, model, after)).fetchall(),
                                here=narrow)
        return [StoredVector(row["item_id"], row["grp"], row["agent_id"], bytes(row["vector"]), row["seq"])
                for row in rows]

    async def vector_marks(self, scope: Scope, model: str) -> dict[EmbeddingKind, VectorMark]:
        """The user's newest vector row of each kind for `model`: one probe of embeddings_newest each."""
        newest = ("SELECT rowid, created_at FROM embeddings WHERE user_id = ? AND kind = ? AND model = ?"
                  " ORDER BY rowid DESC LIMIT 1")

        def read(conn: sqlite3.Connection) -> dict[EmbeddingKind, VectorMark]:
            marks: dict[EmbeddingKind, VectorMark] = {}
            for kind in EMBEDDING_KINDS:
                row = conn.execute(newest, (scope.user, kind, model)).fetchone()
                if row is not None:
                    marks[kind] = VectorMark(int(row[0]), float(row[1]))
            return marks

        return await self._read(read, here=True)

    async def embedded_items(self, scope: Scope, kind: EmbeddingKind, item_ids: Sequence[str], model: str
                             ) -> list[Any]:
        """The items among `item_ids` that still hold a vector for `model`, agent-filtered as the searches are."""
        if not item_ids:
            return []
        # The columns a search's hit is read with, as a tuple: an item's other columns (its index
        # text, as long as its text) are not read, and a tuple costs less than a sqlite3.Row.
        index, item = HIT_READS[kind]
        x = index.alias
        agent, agent_params = _agent(scope, kind, x)
        sql = (f"SELECT {x}.seq, {index.columns} FROM json_each(?) AS wanted CROSS JOIN {index.table} {x}"
               f" ON {x}.user_id = ? AND {x}.id = wanted.value WHERE EXISTS (SELECT 1 FROM embeddings v"
               f" WHERE v.user_id = {x}.user_id AND v.kind = ? AND v.item_id = {x}.id AND v.model = ?){agent}"
               f" ORDER BY {x}.id")
        params = [json.dumps(list(item_ids)), scope.user, kind, model, *agent_params]

        def read(conn: sqlite3.Connection) -> list[Any]:
            cursor = conn.cursor()
            cursor.row_factory = None
            return [item(row) for row in cursor.execute(sql, params)]

        return await self._read(read, here=True)
