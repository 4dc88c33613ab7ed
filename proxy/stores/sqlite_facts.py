"""The graph's writes on the SQLite write connection: one message's facts, or its failure.

`RecordFacts` first takes its item off the extraction queue; when the item is already gone
(applied before, or its message or user deleted meanwhile) nothing is written, so a
repeated op is harmless and a late one never brings a deleted user back.

Entities merge by canonical name per user (per agent under isolation): the first name
stays the name, other spellings become aliases, descriptions accumulate, every message
that mentioned the entity is kept as provenance. The user's own node is the one entity
of type `user`; it keeps its id and edges when renamed to the user's stated name. A name
the user asks to be called joins its aliases, or names it while it has no stated name.
Relationships start at the message's time; a new fact of a single-valued type closes the
current edge of the same subject and type (`invalid_at`) instead of deleting it, so the past stays known.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from proxy.ids import new_id
from proxy.extracted import (  # the one merge key
    USER_NODE,
    USER_TYPE,
    canonical_name,
)
from proxy.stores.base import EntityFact, ExtractionFailed, RecordFacts, RelationFact
from proxy.stores.sqlite_rows import clean_text, entity_terms, to_ts

PROVENANCE_KEEP = 200  # message ids kept per entity or edge, the most recent
ALIASES_KEEP = 20
DESCRIPTION_MAX_CHARS = 600
DESCRIPTION_SEPARATOR = " | "
NAME_MAX_CHARS = 200
ERROR_MAX_CHARS = 1000

Run = Callable[[str, Sequence[Any]], list[sqlite3.Row]]


def runner(conn: sqlite3.Connection) -> Run:
    """Execute on `conn`, rows by column name (the write connection itself returns tuples)."""
    cursor = conn.cursor()
    cursor.row_factory = sqlite3.Row

    def run(sql: str, params: Sequence[Any]) -> list[sqlite3.Row]:
        return cursor.execute(sql, params).fetchall()

    return run


def record_failure(conn: sqlite3.Connection, op: ExtractionFailed) -> None:
    """Count the attempt; the item waits until `retry_at`, or is parked with its error."""
    conn.execute(
        "UPDATE extraction_queue SET attempts = attempts + 1, next_attempt_at = ?, last_error = ?, parked = ?"
        " WHERE id = ? AND user_id = ?",
        (to_ts(op.retry_at), clean_text(op.error)[:ERROR_MAX_CHARS], int(op.park), op.queue_id, op.scope.user),
    )


def record_facts(conn: sqlite3.Connection, op: RecordFacts) -> None:
    """Dequeue the message and merge its entities and relationships into the user's graph."""
    run = runner(conn)
    # The message id too: SQLite hands a deleted item's queue id to the next item queued.
    taken = run("DELETE FROM extraction_queue WHERE id = ? AND user_id = ? AND message_id = ? RETURNING id",
                (op.queue_id, op.scope.user, op.message_id))
    if not taken:
        return
    graph = Graph(run, op)
    ids: dict[str, str] = {}
    user_key, alias_key = canonical_name(op.user_node or ""), canonical_name(op.user_alias or "")
    if user_key:
        ids[user_key] = graph.user_node(op.user_node or "")
    if alias_key:
        ids[alias_key] = graph.user_alias(op.user_alias or "")
    for fact in op.entities:
        key = canonical_name(fact.name)
        if key and key not in (user_key, alias_key):
            ids[key] = graph.entity(fact, key)
    for relation in op.relationships:
        graph.relate(relation, ids)


def _merged_list(held: str, new: Sequence[str], keep: int) -> str:
    """A JSON list with `new` items appended once each, the most recent `keep` kept."""
    items = list(json.loads(held))
    items += [item for item in dict.fromkeys(new) if item not in items]
    return json.dumps(items[-keep:])


def merged_description(held: str, new: str) -> str:
    """Descriptions of one entity, each once, the newest kept when they grow past the cap."""
    new = " ".join(new.split())
    if not new or new in held:
        return held
    parts = [*(held.split(DESCRIPTION_SEPARATOR) if held else []), new]
    while len(parts) > 1 and len(DESCRIPTION_SEPARATOR.join(parts)) > DESCRIPTION_MAX_CHARS:
        parts.pop(0)
    return DESCRIPTION_SEPARATOR.join(parts)[:DESCRIPTION_MAX_CHARS]


class Graph:
    """One RecordFacts op's view of the user's graph, inside the batch's transaction."""

    def __init__(self, run: Run, op: RecordFacts) -> None:
        self._run = run
        self.user = op.scope.user
        self.agent = op.scope.agent if op.scope.agent_isolated else None
        self.message_id = op.message_id
        self.at = to_ts(op.at)
        run("INSERT INTO users (id, created_at) VALUES (?, ?) ON CONFLICT DO NOTHING", (self.user, self.at))

    def _by_name(self, key: str) -> sqlite3.Row | None:
        rows = self._run("SELECT * FROM entities WHERE user_id = ? AND ifnull(agent_id, '') = ? AND canonical_name = ?",
                         (self.user, self.agent or "", key))
        return rows[0] if rows else None

    def _related(self, one: str, other: str) -> bool:
        return bool(self._run("SELECT 1 FROM relationships WHERE user_id = ? AND ((from_id = ? AND to_id = ?)"
                              " OR (from_id = ? AND to_id = ?)) LIMIT 1", (self.user, one, other, other, one)))

    def _user_row(self) -> sqlite3.Row | None:
        rows = self._run("SELECT * FROM entities WHERE user_id = ? AND ifnull(agent_id, '') = ? AND type = ?"
                         " ORDER BY seq LIMIT 1", (self.user, self.agent or "", USER_TYPE))
        return rows[0] if rows else None

    def _insert(self, name: str, key: str, type_: str, description: str, confidence: float) -> str:
        entity_id = new_id()
        self._run(
            "INSERT INTO entities (id, user_id, agent_id, name, canonical_name, type, description, confidence,"
            " provenance, name_terms, type_terms, description_terms, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (entity_id, self.user, self.agent, name, key, type_, description, confidence,
             json.dumps([self.message_id]), *entity_terms(name, type_, description), self.at, self.at),
        )
        return entity_id

    def _update(self, row: sqlite3.Row, *, name: str | None = None, key: str | None = None, type_: str = "",
                description: str = "", aliases: Sequence[str] = (), confidence: float = 0.0,
                provenance: Sequence[str] = ()) -> None:
        """Merge into an entity row; the indexed text is rewritten only when it changed."""
        name, key = name or row["name"], key or row["canonical_name"]
        new_type = row["type"] or type_
        held_aliases = json.loads(row["aliases"])
        alias_list = [a for a in json.loads(_merged_list(row["aliases"], aliases, ALIASES_KEEP)) if a != name]
        text = (name, new_type, merged_description(row["description"], description), alias_list)
        if text != (row["name"], row["type"], row["description"], held_aliases) or key != row["canonical_name"]:
            self._run(
                "UPDATE entities SET name = ?, canonical_name = ?, type = ?, description = ?, aliases = ?,"
                " name_terms = ?, type_terms = ?, description_terms = ? WHERE seq = ?",
                (name, key, new_type, text[2], json.dumps(alias_list),
                 *entity_terms(name, new_type, text[2], alias_list), row["seq"]),
            )
        self._run(
            "UPDATE entities SET confidence = max(confidence, ?), provenance = ?, updated_at = ? WHERE seq = ?",
            (confidence, _merged_list(row["provenance"], [*provenance, self.message_id], PROVENANCE_KEEP),
             self.at, row["seq"]),
        )

    def entity(self, fact: EntityFact, key: str) -> str:
        """The id of the entity `fact` names, created or merged into."""
        name = clean_text(" ".join(fact.name.split()))[:NAME_MAX_CHARS]
        description = clean_text(" ".join(fact.description.split()))
        row = self._by_name(key)
        if row is None:
            return self._insert(name, key, fact.type, merged_description("", description), fact.confidence)
        self._update(row, type_=fact.type, description=description, aliases=[name], confidence=fact.confidence)
        return str(row["id"])

    def user_node(self, name: str) -> str:
        """The user's own node, created, or renamed to a stated name (keeping its id and edges)."""
        name = clean_text(" ".join(name.split()))[:NAME_MAX_CHARS]
        key = canonical_name(name)
        placeholder = key == canonical_name(USER_NODE)
        node = self._user_row()
        named = self._by_name(key)
        if node is None:
            if named is None:
                return self._insert(name, key, USER_TYPE, "", 1.0)
            # An entity already carries the user's stated name: it becomes the user's node.
            self._run("UPDATE entities SET type = ?, type_terms = ? WHERE seq = ?",
                      (USER_TYPE, entity_terms("", USER_TYPE, "")[1], named["seq"]))
            self._update(self._by_name(key) or named)
            return str(named["id"])
        if placeholder or key == node["canonical_name"]:
            self._update(node)
            return str(node["id"])
        if named is not None and named["id"] != node["id"] and self._related(node["id"], named["id"]):
            # Someone the user has an edge to is someone else who shares the name ("my friend
            # Tom", then "my name is Tom"): left alone, the name is an alias of the user's node.
            self._update(node, aliases=[name])
            return str(node["id"])
        old_name = node["name"]
        if named is not None and named["id"] != node["id"]:
            self._absorb(node, named)
        renamed = self._by_name(node["canonical_name"]) or node
        keep_old = [] if canonical_name(old_name) == canonical_name(USER_NODE) else [old_name]
        self._update(renamed, name=name, key=key, aliases=keep_old)
        return str(node["id"])

    def user_alias(self, alias: str) -> str:
        """The user's node with `alias` among its aliases; named `alias` while it has no stated name.

        An entity already called `alias` is left alone: unlike a stated name, a nickname is
        often someone else's name too ("my friend Ally").
        """
        alias = clean_text(" ".join(alias.split()))[:NAME_MAX_CHARS]
        key = canonical_name(alias)
        node = self._user_row()
        if node is None and self._by_name(key) is not None:
            self.user_node(USER_NODE)  # someone else is called `alias`: a "User" node takes it as an alias
            node = self._user_row()
        if node is None or (node["canonical_name"] == canonical_name(USER_NODE) and self._by_name(key) is None):
            return self.user_node(alias)
        self._update(node, aliases=[alias] if key != node["canonical_name"] else [])
        return str(node["id"])

    def _absorb(self, node: sqlite3.Row, other: sqlite3.Row) -> None:
        """Fold another entity into the user's node: its edges, aliases, description, provenance."""
        for column in ("from_id", "to_id"):
            self._run(f"UPDATE relationships SET {column} = ? WHERE user_id = ? AND {column} = ?",
                      (node["id"], self.user, other["id"]))
        self._run("DELETE FROM relationships WHERE user_id = ? AND from_id = ? AND to_id = ?",
                  (self.user, node["id"], node["id"]))
        self._run("DELETE FROM entities WHERE seq = ?", (other["seq"],))
        current = self._by_name(node["canonical_name"]) or node
        self._update(current, description=other["description"],
                     aliases=[other["name"], *json.loads(other["aliases"])], confidence=other["confidence"],
                     provenance=json.loads(other["provenance"]))

    def relate(self, relation: RelationFact, ids: dict[str, str]) -> None:
        """Add one edge between entities of this op (or already stored), closing what it replaces."""
        from_id = self._resolve(relation.from_name, ids)
        to_id = self._resolve(relation.to_name, ids)
        type_ = clean_text(relation.type.strip())
        if from_id is None or to_id is None or from_id == to_id or not type_:
            return
        current = self._run(
            "SELECT seq, to_id, valid_from, provenance FROM relationships WHERE user_id = ? AND from_id = ?"
            " AND type = ? AND invalid_at IS NULL", (self.user, from_id, type_))
        same = [row for row in current if row["to_id"] == to_id]
        if same:
            self._run("UPDATE relationships SET provenance = ? WHERE seq = ?",
                      (_merged_list(same[0]["provenance"], [self.message_id], PROVENANCE_KEEP), same[0]["seq"]))
            return
        invalid_at = None
        if relation.single_valued:
            # A fact older than the current one (an item retried late) arrives already replaced.
            newer = [row["valid_from"] for row in current if row["valid_from"] > self.at]
            invalid_at = min(newer) if newer else None
            if invalid_at is None:
                self._run("UPDATE relationships SET invalid_at = ? WHERE user_id = ? AND from_id = ? AND type = ?"
                          " AND invalid_at IS NULL", (self.at, self.user, from_id, type_))
        self._run(
            "INSERT INTO relationships (id, user_id, agent_id, from_id, type, to_id, valid_from, invalid_at,"
            " provenance, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (new_id(), self.user, self.agent, from_id, type_, to_id, self.at, invalid_at,
             json.dumps([self.message_id]), self.at),
        )

    def _resolve(self, name: str, ids: dict[str, str]) -> str | None:
        key = canonical_name(name)
        if key in ids:
            return ids[key]
        row = self._by_name(key) if key else None
        return None if row is None else str(row["id"])
