"""Deleted messages take what was derived only from them (stores/provenance.py), on PostgreSQL."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from proxy.stores.provenance import Change, Drop, KeepEdge, KeepEntity, edge_change, entity_change, remaining

# Rows of the user whose provenance (a JSON list in text) names one of the messages in $2.
_NAMING = "WHERE user_id = $1 AND provenance::jsonb ?| $2::text[]"


async def conversation_messages(conn: asyncpg.Connection, user: str, conversation_id: str) -> list[str]:
    """The ids of a conversation's messages (read before it is deleted)."""
    rows = await conn.fetch("SELECT id FROM messages WHERE user_id = $1 AND conversation_id = $2",
                            user, conversation_id)
    return [row["id"] for row in rows]


async def prune_graph(conn: asyncpg.Connection, user: str, deleted_messages: Sequence[str]) -> None:
    """Delete or rewrite the user's edges and entities derived from the deleted messages."""
    if not deleted_messages:
        return
    deleted, listed = set(deleted_messages), list(deleted_messages)
    for edge in await conn.fetch(f"SELECT seq, provenance FROM relationships {_NAMING}", user, listed):
        await _apply(conn, "relationships", edge_change(edge, deleted))
    entities = await conn.fetch(f"SELECT seq, name, type, description, aliases, provenance FROM entities {_NAMING}",
                                user, listed)
    for entity in entities:
        kept = remaining(entity["provenance"], deleted)
        texts = [row["content"] for row in await conn.fetch(
            "SELECT content FROM messages WHERE user_id = $1 AND id = ANY($2::text[])", user, kept)]
        await _apply(conn, "entities", entity_change(entity, deleted, texts))


async def _apply(conn: asyncpg.Connection, table: str, change: Change) -> None:
    match change:
        case Drop(seq):
            await conn.execute(f"DELETE FROM {table} WHERE seq = $1", seq)
        case KeepEdge(seq, provenance):
            await conn.execute("UPDATE relationships SET provenance = $1 WHERE seq = $2", provenance, seq)
        case KeepEntity(seq, description, aliases, provenance, terms):
            await conn.execute("UPDATE entities SET description = $1, aliases = $2, provenance = $3, name_terms = $4,"
                               " type_terms = $5, description_terms = $6 WHERE seq = $7",
                               description, aliases, provenance, *terms, seq)
