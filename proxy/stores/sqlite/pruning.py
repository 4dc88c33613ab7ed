"""Deleted messages take what was derived only from them (stores/provenance.py), on SQLite."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from proxy.stores.provenance import Change, Drop, KeepEdge, KeepEntity, edge_change, entity_change, remaining

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
    edges = cursor.execute(f"SELECT seq, provenance FROM relationships {_NAMING.format('relationships')}",
                           (user, listed)).fetchall()
    for edge in edges:
        _apply(conn, "relationships", edge_change(edge, deleted))
    entities = cursor.execute(f"SELECT seq, name, type, description, aliases, provenance FROM entities"
                              f" {_NAMING.format('entities')}", (user, listed)).fetchall()
    for entity in entities:
        kept = remaining(entity["provenance"], deleted)
        texts = [row[0] for row in conn.execute(
            "SELECT content FROM messages WHERE user_id = ? AND id IN (SELECT value FROM json_each(?))",
            (user, json.dumps(kept)))]
        _apply(conn, "entities", entity_change(entity, deleted, texts))


def _apply(conn: sqlite3.Connection, table: str, change: Change) -> None:
    match change:
        case Drop(seq):
            conn.execute(f"DELETE FROM {table} WHERE seq = ?", (seq,))
        case KeepEdge(seq, provenance):
            conn.execute("UPDATE relationships SET provenance = ? WHERE seq = ?", (provenance, seq))
        case KeepEntity(seq, description, aliases, provenance, terms):
            conn.execute("UPDATE entities SET description = ?, aliases = ?, provenance = ?, name_terms = ?,"
                         " type_terms = ?, description_terms = ? WHERE seq = ?",
                         (description, aliases, provenance, *terms, seq))
