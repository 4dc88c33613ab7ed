"""The graph's writes on PostgreSQL: one message's facts (RecordFacts), as sqlite_facts.py.

The same merge, step for step: the op first takes its item off the extraction queue, and
writes nothing when the item is already gone (applied before by this or another replica,
or its message or user deleted meanwhile), so a repeated or late op is harmless. Entities
merge by canonical name per user (per agent under isolation); the user's own node keeps
its id and edges when renamed, and takes a name the user asks to be called as an alias
(or as its name while it has no stated one); a single-valued relationship closes the
current edge of the same subject and type instead of deleting it. It runs inside the
batch's transaction, after the user's advisory lock, so two replicas never merge into one
user's graph at once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import asyncpg

from proxy.ids import new_id
from proxy.extracted import USER_NODE, canonical_name
from proxy.stores.base import EntityFact, RecordFacts, RelationFact
from proxy.stores.postgres_rows import clean_text, utc
from proxy.stores.sqlite_facts import (
    ALIASES_KEEP,
    NAME_MAX_CHARS,
    PROVENANCE_KEEP,
    USER_TYPE,
    _merged_list,
    merged_description,
)
from proxy.stores.sqlite_rows import entity_terms


async def record_facts(conn: asyncpg.Connection, op: RecordFacts) -> None:
    """Dequeue the message and merge its entities and relationships into the user's graph."""
    taken = await conn.fetchval("DELETE FROM extraction_queue WHERE id = $1 AND user_id = $2 AND message_id = $3"
                                " RETURNING id", op.queue_id, op.scope.user, op.message_id)
    if taken is None:
        return
    graph = Graph(conn, op)
    await conn.execute("INSERT INTO users (id, created_at) VALUES ($1, $2) ON CONFLICT DO NOTHING", graph.user, graph.at)
    ids: dict[str, str] = {}
    user_key, alias_key = canonical_name(op.user_node or ""), canonical_name(op.user_alias or "")
    if user_key:
        ids[user_key] = await graph.user_node(op.user_node or "")
    if alias_key:
        ids[alias_key] = await graph.user_alias(op.user_alias or "")
    for fact in op.entities:
        key = canonical_name(fact.name)
        if key and key not in (user_key, alias_key):
            ids[key] = await graph.entity(fact, key)
    for relation in op.relationships:
        await graph.relate(relation, ids)


def _name(text: str) -> str:
    return clean_text(" ".join(text.split()))[:NAME_MAX_CHARS]


class Graph:
    """One RecordFacts op's view of the user's graph, inside the batch's transaction."""

    def __init__(self, conn: asyncpg.Connection, op: RecordFacts) -> None:
        self._conn = conn
        self.user = op.scope.user
        self.agent = op.scope.agent if op.scope.agent_isolated else None
        self.message_id = op.message_id
        self.at = utc(op.at)

    async def _by_name(self, key: str) -> asyncpg.Record | None:
        return await self._conn.fetchrow(
            "SELECT * FROM entities WHERE user_id = $1 AND coalesce(agent_id, '') = $2 AND canonical_name = $3",
            self.user, self.agent or "", key)

    async def _related(self, one: str, other: str) -> bool:
        return bool(await self._conn.fetchval(
            "SELECT 1 FROM relationships WHERE user_id = $1 AND ((from_id = $2 AND to_id = $3)"
            " OR (from_id = $3 AND to_id = $2)) LIMIT 1", self.user, one, other))

    async def _user_row(self) -> asyncpg.Record | None:
        return await self._conn.fetchrow(
            "SELECT * FROM entities WHERE user_id = $1 AND coalesce(agent_id, '') = $2 AND type = $3"
            " ORDER BY seq LIMIT 1", self.user, self.agent or "", USER_TYPE)

    async def _insert(self, name: str, key: str, type_: str, description: str, confidence: float) -> str:
        entity_id = new_id()
        await self._conn.execute(
            "INSERT INTO entities (id, user_id, agent_id, name, canonical_name, type, description, confidence,"
            " provenance, name_terms, type_terms, description_terms, created_at, updated_at)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13)",
            entity_id, self.user, self.agent, name, key, clean_text(type_), description, confidence,
            json.dumps([self.message_id]), *entity_terms(name, type_, description), self.at,
        )
        return entity_id

    async def _update(self, row: asyncpg.Record, *, name: str | None = None, key: str | None = None,
                      type_: str = "", description: str = "", aliases: Sequence[str] = (), confidence: float = 0.0,
                      provenance: Sequence[str] = ()) -> None:
        """Merge into an entity row; the indexed text is rewritten only when it changed."""
        name, key = name or row["name"], key or row["canonical_name"]
        new_type = row["type"] or clean_text(type_)
        held_aliases = json.loads(row["aliases"])
        alias_list = [a for a in json.loads(_merged_list(row["aliases"], aliases, ALIASES_KEEP)) if a != name]
        text = (name, new_type, merged_description(row["description"], description), alias_list)
        if text != (row["name"], row["type"], row["description"], held_aliases) or key != row["canonical_name"]:
            await self._conn.execute(
                "UPDATE entities SET name = $1, canonical_name = $2, type = $3, description = $4, aliases = $5,"
                " name_terms = $6, type_terms = $7, description_terms = $8 WHERE seq = $9",
                name, key, new_type, text[2], json.dumps(alias_list),
                *entity_terms(name, new_type, text[2], alias_list), row["seq"],
            )
        await self._conn.execute(
            "UPDATE entities SET confidence = GREATEST(confidence, $1), provenance = $2, updated_at = $3"
            " WHERE seq = $4",
            confidence, _merged_list(row["provenance"], [*provenance, self.message_id], PROVENANCE_KEEP), self.at,
            row["seq"],
        )

    async def entity(self, fact: EntityFact, key: str) -> str:
        """The id of the entity `fact` names, created or merged into."""
        name = _name(fact.name)
        description = clean_text(" ".join(fact.description.split()))
        row = await self._by_name(key)
        if row is None:
            return await self._insert(name, key, fact.type, merged_description("", description), fact.confidence)
        await self._update(row, type_=fact.type, description=description, aliases=[name], confidence=fact.confidence)
        return str(row["id"])

    async def user_node(self, name: str) -> str:
        """The user's own node, created, or renamed to a stated name (keeping its id and edges)."""
        name = _name(name)
        key = canonical_name(name)
        node, named = await self._user_row(), await self._by_name(key)
        if node is None:
            if named is None:
                return await self._insert(name, key, USER_TYPE, "", 1.0)
            # An entity already carries the user's stated name: it becomes the user's node.
            await self._conn.execute("UPDATE entities SET type = $1, type_terms = $2 WHERE seq = $3",
                                     USER_TYPE, entity_terms("", USER_TYPE, "")[1], named["seq"])
            await self._update(await self._by_name(key) or named)
            return str(named["id"])
        if key == canonical_name(USER_NODE) or key == node["canonical_name"]:
            await self._update(node)
            return str(node["id"])
        if named is not None and named["id"] != node["id"] and await self._related(node["id"], named["id"]):
            await self._update(node, aliases=[name])  # someone else of that name: see sqlite_facts.py
            return str(node["id"])
        old_name = node["name"]
        if named is not None and named["id"] != node["id"]:
            await self._absorb(node, named)
        renamed = await self._by_name(node["canonical_name"]) or node
        keep_old = [] if canonical_name(old_name) == canonical_name(USER_NODE) else [old_name]
        await self._update(renamed, name=name, key=key, aliases=keep_old)
        return str(node["id"])

    async def user_alias(self, alias: str) -> str:
        """The user's node with `alias` among its aliases; named `alias` while it has no stated name.
        An entity already called `alias` is left alone, as in sqlite_facts.py."""
        alias = _name(alias)
        key = canonical_name(alias)
        node = await self._user_row()
        if node is None and await self._by_name(key) is not None:
            await self.user_node(USER_NODE)  # someone else is called `alias`: a "User" node takes it as an alias
            node = await self._user_row()
        if node is None or (node["canonical_name"] == canonical_name(USER_NODE) and await self._by_name(key) is None):
            return await self.user_node(alias)
        await self._update(node, aliases=[alias] if key != node["canonical_name"] else [])
        return str(node["id"])

    async def _absorb(self, node: asyncpg.Record, other: asyncpg.Record) -> None:
        """Fold another entity into the user's node: its edges, aliases, description, provenance."""
        for column in ("from_id", "to_id"):
            await self._conn.execute(f"UPDATE relationships SET {column} = $1 WHERE user_id = $2 AND {column} = $3",
                                     node["id"], self.user, other["id"])
        await self._conn.execute("DELETE FROM relationships WHERE user_id = $1 AND from_id = $2 AND to_id = $2",
                                 self.user, node["id"])
        await self._conn.execute("DELETE FROM entities WHERE seq = $1", other["seq"])
        current = await self._by_name(node["canonical_name"]) or node
        await self._update(current, description=other["description"],
                           aliases=[other["name"], *json.loads(other["aliases"])], confidence=other["confidence"],
                           provenance=json.loads(other["provenance"]))

    async def relate(self, relation: RelationFact, ids: dict[str, str]) -> None:
        """Add one edge between entities of this op (or already stored), closing what it replaces."""
        from_id = await self._resolve(relation.from_name, ids)
        to_id = await self._resolve(relation.to_name, ids)
        type_ = clean_text(relation.type.strip())
        if from_id is None or to_id is None or from_id == to_id or not type_:
            return
        current = await self._conn.fetch(
            "SELECT seq, to_id, valid_from, provenance FROM relationships WHERE user_id = $1 AND from_id = $2"
            " AND type = $3 AND invalid_at IS NULL", self.user, from_id, type_)
        same = [row for row in current if row["to_id"] == to_id]
        if same:
            await self._conn.execute("UPDATE relationships SET provenance = $1 WHERE seq = $2",
                                     _merged_list(same[0]["provenance"], [self.message_id], PROVENANCE_KEEP),
                                     same[0]["seq"])
            return
        invalid_at = None
        if relation.single_valued:
            # A fact older than the current one (an item retried late) arrives already replaced.
            newer = [row["valid_from"] for row in current if row["valid_from"] > self.at]
            invalid_at = min(newer) if newer else None
            if invalid_at is None:
                await self._conn.execute(
                    "UPDATE relationships SET invalid_at = $1 WHERE user_id = $2 AND from_id = $3 AND type = $4"
                    " AND invalid_at IS NULL", self.at, self.user, from_id, type_)
        await self._insert_edge(from_id, type_, to_id, invalid_at)

    async def _insert_edge(self, from_id: str, type_: str, to_id: str, invalid_at: Any) -> None:
        await self._conn.execute(
            "INSERT INTO relationships (id, user_id, agent_id, from_id, type, to_id, valid_from, invalid_at,"
            " provenance, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $7)",
            new_id(), self.user, self.agent, from_id, type_, to_id, self.at, invalid_at, json.dumps([self.message_id]),
        )

    async def _resolve(self, name: str, ids: dict[str, str]) -> str | None:
        key = canonical_name(name)
        if key in ids:
            return ids[key]
        row = await self._by_name(key) if key else None
        return None if row is None else str(row["id"])
