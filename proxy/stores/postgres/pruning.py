"""Deleted messages take what was derived only from them (stores/provenance.py), on PostgreSQL."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from proxy.extracted import USER_NODE, canonical_name
from proxy.stores.graph_merge import SetEdgeProvenance
from proxy.stores.provenance import (
    Change,
    Drop,
    KeepEntity,
    edge_change,
    edges_provenance,
    entity_change,
    remaining,
    user_name_check,
)

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
    for edge in await conn.fetch(f"SELECT seq, from_id, type, valid_from, provenance FROM relationships {_NAMING}",
                                 user, listed):
        change = edge_change(edge, deleted)
        await _apply(conn, "relationships", change)
        if isinstance(change, Drop):
            # What it had closed is current again, or closed by the next fact that remains.
            await conn.execute(
                "UPDATE relationships AS r SET invalid_at = (SELECT min(n.valid_from) FROM relationships n"
                " WHERE n.user_id = r.user_id AND n.from_id = r.from_id AND n.type = r.type"
                " AND n.valid_from > r.valid_from)"
                " WHERE r.user_id = $1 AND r.from_id = $2 AND r.type = $3 AND r.invalid_at = $4",
                user, edge["from_id"], edge["type"], edge["valid_from"])
    entities = await conn.fetch(
        f"SELECT seq, id, agent_id, name, type, description, aliases, provenance, stored_via FROM entities {_NAMING}", user, listed)
    for entity in entities:
        named_by: list[str] = []
        kept = remaining(entity["provenance"], deleted)
        if not kept:
            named_by = kept = edges_provenance(row["provenance"] for row in await conn.fetch(
                "SELECT provenance FROM relationships WHERE user_id = $1 AND (from_id = $2 OR to_id = $2)"
                " ORDER BY seq", user, entity["id"]))
        texts = [row["content"] for row in await conn.fetch(
            "SELECT content FROM messages WHERE user_id = $1 AND id = ANY($2::text[])", user, kept)]
        await _apply(conn, "entities", entity_change(entity, deleted, texts, named_by,
                                                     await _name_said(conn, user, entity),
                                                     stored=entity["stored_via"] is not None))


async def _name_said(conn: asyncpg.Connection, user: str, entity: asyncpg.Record) -> bool:
    """Whether a remaining message of the user holds the user's node's stated name (any, not
    only its provenance: that keeps the newest ids only), or its name cannot go back to the
    unnamed node's (another entity has it)."""
    name = user_name_check(entity)
    if name is None:
        return True
    return bool(await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM messages WHERE user_id = $1 AND strpos(content, $2) > 0)"
        " OR EXISTS (SELECT 1 FROM entities WHERE user_id = $1 AND coalesce(agent_id, '') = coalesce($3, '')"
        " AND canonical_name = $4 AND seq <> $5)",
        user, name, entity["agent_id"], canonical_name(USER_NODE), entity["seq"]))


async def _apply(conn: asyncpg.Connection, table: str, change: Change) -> None:
    match change:
        case Drop(seq):
            await conn.execute(f"DELETE FROM {table} WHERE seq = $1", seq)
        case SetEdgeProvenance(seq, provenance):
            await conn.execute("UPDATE relationships SET provenance = $1 WHERE seq = $2", provenance, seq)
        case KeepEntity(seq, name, canonical, description, aliases, provenance, terms):
            await conn.execute("UPDATE entities SET name = $1, canonical_name = $2, description = $3, aliases = $4,"
                               " provenance = $5, name_terms = $6, type_terms = $7, description_terms = $8"
                               " WHERE seq = $9", name, canonical, description, aliases, provenance, *terms, seq)
