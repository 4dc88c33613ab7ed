"""Import of export records into one user, on the SQLite write connection.

Records arrive validated (proxy.api.jsonl: ids checked, timestamps as unix seconds). An id
the user already has is skipped, so an import can be repeated; so is an entity whose
canonical name the user already holds under another id (names are unique per user), and
a relationship whose ends cannot be found by id or by name. Imported messages are not
queued for extraction: their entities and relationships come in the same file.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Sequence
from typing import Any

from proxy.extracted import canonical_name
from proxy.models import ReasoningStep, Scope
from proxy.stores.base import text_hash
from proxy.stores.sqlite.rows import clean_text, now_ts
from proxy.stores.indexed_text import (
    CONTEXT_MESSAGES,
    context_terms,
    entity_terms,
    index_terms,
    reasoning_terms,
    steps_json,
)


def import_records(conn: sqlite3.Connection, scope: Scope,
                   records: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Add the records to the user; counts of `imported` and `skipped` records per kind."""
    importer = _Importer(conn, scope.user)
    imported: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    for record in records:
        kind = record["kind"]
        (imported if importer.add(record) else skipped)[kind] += 1
    return {"imported": dict(sorted(imported.items())), "skipped": dict(sorted(skipped.items()))}


class _Importer:
    """One import's inserts, inside its transaction."""

    def __init__(self, conn: sqlite3.Connection, user: str) -> None:
        self._conn = conn
        self._user = user
        conn.execute("INSERT INTO users (id, created_at) VALUES (?, ?) ON CONFLICT DO NOTHING", (user, now_ts()))

    def _exists(self, table: str, item_id: str) -> bool:
        return self._conn.execute(f"SELECT 1 FROM {table} WHERE user_id = ? AND id = ?",
                                  (self._user, item_id)).fetchone() is not None

    def _insert(self, sql: str, params: Sequence[Any]) -> bool:
        return self._conn.execute(sql, params).rowcount > 0

    def add(self, r: dict[str, Any]) -> bool:
        """Insert one record; False when it was skipped."""
        adder = {"conversation": self.conversation, "message": self.message, "entity": self.entity,
                 "relationship": self.relationship, "reasoning": self.reasoning}[r["kind"]]
        return adder(r)

    def conversation(self, r: dict[str, Any]) -> bool:
        created = r["created_at"]
        return self._insert(
            "INSERT INTO conversations (user_id, id, agent_id, created_at, last_active_at) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING", (self._user, r["id"], r["agent_id"], created, r["last_active_at"] or created))

    def _conversation_for(self, r: dict[str, Any]) -> None:
        """The conversation an item names, created when the file did not carry it."""
        self._conn.execute(
            "INSERT INTO conversations (user_id, id, agent_id, created_at, last_active_at) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING", (self._user, r["conversation_id"], r["agent_id"], r["created_at"],
                                        r["created_at"]))

    def message(self, r: dict[str, Any]) -> bool:
        if self._exists("messages", r["id"]):
            return False
        self._conversation_for(r)
        content = clean_text(r["content"])
        context = message_context(self._conn, self._user, r["conversation_id"], r["created_at"])
        return self._insert(
            "INSERT INTO messages (id, user_id, conversation_id, agent_id, role, content, content_hash, terms,"
            " context, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (r["id"], self._user, r["conversation_id"], r["agent_id"], r["role"], content, text_hash(content),
             index_terms(content), context, r["created_at"]))

    def entity(self, r: dict[str, Any]) -> bool:
        name = clean_text(r["name"])
        key = canonical_name(name)
        taken = self._conn.execute(
            "SELECT 1 FROM entities WHERE user_id = ? AND (id = ?"
            " OR (ifnull(agent_id, '') = ? AND canonical_name = ?))",
            (self._user, r["id"], r["agent_id"] or "", key)).fetchone()
        if taken is not None or not key:
            return False
        type_, description = clean_text(r["type"]), clean_text(r["description"])
        aliases = [clean_text(a) for a in r["aliases"]]
        return self._insert(
            "INSERT INTO entities (id, user_id, agent_id, name, canonical_name, type, description, memory_type,"
            " confidence, tags, aliases, provenance, name_terms, type_terms, description_terms, created_at, updated_at,"
            " stored_via) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (r["id"], self._user, r["agent_id"], name, key, type_, description, clean_text(r["memory_type"]),
             r["confidence"], _json_list(r["tags"]), json.dumps(aliases), _json_list(r["provenance"]),
             *entity_terms(name, type_, description, aliases), r["created_at"], r["updated_at"] or r["created_at"],
             r.get("stored_via")))

    def _entity_id(self, item_id: str | None, name: str | None) -> str | None:
        """The entity an edge end names: by id when the user has it, else by name."""
        if item_id is not None and self._exists("entities", item_id):
            return item_id
        if name is None or not canonical_name(name):
            return None
        row = self._conn.execute(
            "SELECT id FROM entities WHERE user_id = ? AND canonical_name = ? ORDER BY seq LIMIT 1",
            (self._user, canonical_name(name))).fetchone()
        return None if row is None else str(row[0])

    def relationship(self, r: dict[str, Any]) -> bool:
        if self._exists("relationships", r["id"]):
            return False
        from_id, to_id = self._entity_id(r["from_id"], r["from"]), self._entity_id(r["to_id"], r["to"])
        if from_id is None or to_id is None:
            return False
        return self._insert(
            "INSERT INTO relationships (id, user_id, agent_id, from_id, type, to_id, valid_from, invalid_at,"
            " provenance, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (r["id"], self._user, r["agent_id"], from_id, clean_text(r["type"]), to_id, r["valid_from"],
             r["invalid_at"], _json_list(r["provenance"]), r["created_at"] or r["valid_from"]))

    def reasoning(self, r: dict[str, Any]) -> bool:
        if self._exists("reasoning", r["id"]):
            return False
        self._conversation_for(r)
        steps = tuple(ReasoningStep(clean_text(s["name"]), clean_text(s["arguments"]), clean_text(s["result"]))
                      for s in r["steps"])
        task, answer = clean_text(r["task"]), clean_text(r["answer"])
        return self._insert(
            "INSERT INTO reasoning (id, user_id, agent_id, conversation_id, task, steps, answer, terms, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (r["id"], self._user, r["agent_id"], r["conversation_id"], task, steps_json(steps), answer,
             reasoning_terms(task, steps, answer), r["created_at"]))


def message_context(conn: sqlite3.Connection, user: str, conversation_id: str, at: float) -> str:
    """A new message's `context` column, as the writer computes it: the terms of the messages just before."""
    before = conn.execute(
        "SELECT terms FROM messages WHERE user_id = ? AND conversation_id = ? AND created_at <= ?"
        " ORDER BY created_at DESC, seq DESC LIMIT ?", (user, conversation_id, at, CONTEXT_MESSAGES)).fetchall()
    return context_terms([row[0] for row in reversed(before)])


def _json_list(items: Sequence[str]) -> str:
    return json.dumps([clean_text(item) for item in items])
