"""Deleted messages take what was derived only from them (stores/provenance.py), on SQLite."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

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

# Rows of the user whose provenance names one of the messages in the JSON list parameter.
_NAMING = ("WHERE user_id = ? AND EXISTS (SELECT 1 FROM json_each({0}.provenance) p"
           " WHERE p.value IN (SELECT value FROM json_each(?)))")


def conversation_messages(conn: sqlite3.Connection, user: str, conversation_id: str) -> list[str]:
    """The ids of a conversation's messages (read before it is deleted)."""
    return [row[0] for row in conn.execute("SELECT id FROM messages WHERE user_id = ? AND conversation_id = ?",
                                           (user, conversation_id))]


def prune_graph(conn: sqlite3.Connection, user: str, deleted_messages: Sequence[str]) -> None:
    """Delete or rewrite the user's edges and entities derived from the deleted messages."""
    if not deleted_messages:
        return
    deleted, listed = set(deleted_messages), json.dumps(list(deleted_messages))
    cursor = conn.cursor()
    cursor.row_factory = sqlite3.Row
    edges = cursor.execute(f"SELECT seq, from_id, type, valid_from, provenance FROM relationships"
                           f" {_NAMING.format('relationships')}", (user, listed)).fetchall()
    for edge in edges:
        change = edge_change(edge, deleted)
        _apply(conn, "relationships", change)
        if isinstance(change, Drop):
            # What it had closed is current again, or closed by the next fact that remains.
            conn.execute("UPDATE relationships AS r SET invalid_at = (SELECT min(n.valid_from) FROM relationships n"
                         " WHERE n.user_id = r.user_id AND n.from_id = r.from_id AND n.type = r.type"
                         " AND n.valid_from > r.valid_from)"
                         " WHERE r.user_id = ? AND r.from_id = ? AND r.type = ? AND r.invalid_at = ?",
                         (user, edge["from_id"], edge["type"], edge["valid_from"]))
    entities = cursor.execute(f"SELECT seq, id, agent_id, name, type, description, aliases, provenance, stored_via FROM entities"
                              f" {_NAMING.format('entities')}", (user, listed)).fetchall()
    for entity in entities:
        named_by: list[str] = []
        kept = remaining(entity["provenance"], deleted)
        if not kept:
            named_by = kept = edges_provenance(row[0] for row in conn.execute(
                "SELECT provenance FROM relationships WHERE user_id = ? AND (from_id = ? OR to_id = ?) ORDER BY seq",
                (user, entity["id"], entity["id"])))
        texts = [row[0] for row in conn.execute(
            "SELECT content FROM messages WHERE user_id = ? AND id IN (SELECT value FROM json_each(?))",
            (user, json.dumps(kept)))]
        _apply(conn, "entities", entity_change(entity, deleted, texts, named_by, _name_said(conn, user, entity),
                                               stored=entity["stored_via"] is not None))


def _name_said(conn: sqlite3.Connection, user: str, entity: sqlite3.Row) -> bool:
    """Whether a remaining message of the user holds the user's node's stated name (any, not
    only its provenance: that keeps the newest ids only), or its name cannot go back to the
    unnamed node's (another entity has it)."""
    name = user_name_check(entity)
    if name is None:
        return True
    return conn.execute(
        "SELECT EXISTS (SELECT 1 FROM messages WHERE user_id = ? AND instr(content, ?) > 0)"
        " OR EXISTS (SELECT 1 FROM entities WHERE user_id = ? AND ifnull(agent_id, '') = ifnull(?, '')"
        " AND canonical_name = ? AND seq <> ?)",
        (user, name, user, entity["agent_id"], canonical_name(USER_NODE), entity["seq"])).fetchone()[0] == 1


def _apply(conn: sqlite3.Connection, table: str, change: Change) -> None:
    match change:
        case Drop(seq):
            conn.execute(f"DELETE FROM {table} WHERE seq = ?", (seq,))
        case SetEdgeProvenance(seq, provenance):
            conn.execute("UPDATE relationships SET provenance = ? WHERE seq = ?", (provenance, seq))
        case KeepEntity(seq, name, canonical, description, aliases, provenance, terms):
            conn.execute("UPDATE entities SET name = ?, canonical_name = ?, description = ?, aliases = ?,"
                         " provenance = ?, name_terms = ?, type_terms = ?, description_terms = ? WHERE seq = ?",
                         (name, canonical, description, aliases, provenance, *terms, seq))
