"""Import of export records into one user, on PostgreSQL (sqlite/import_records.py is the reference).

Records arrive validated (proxy.api.jsonl: ids checked, timestamps as unix seconds). An id
the user already has is skipped, so an import can be repeated; so is an entity whose
canonical name the user already holds under another id, and a relationship whose ends
cannot be found by id or by name. Imported messages are not queued for extraction: their
entities and relationships come in the same file.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from itertools import groupby
from datetime import UTC, datetime
from typing import Any

import asyncpg

from proxy.extracted import canonical_name
from proxy.models import ReasoningStep, Scope
from proxy.stores.base import text_hash
from proxy.stores.postgres.rows import clean_text
from proxy.stores.postgres.schema import CONTEXT_SQL
from proxy.stores.indexed_text import entity_terms, index_terms, reasoning_terms, steps_json


async def import_records(conn: asyncpg.Connection, scope: Scope,
                         records: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Add the records to the user; counts of `imported` and `skipped` records per kind."""
    importer = _Importer(conn, scope.user)
    await conn.execute("INSERT INTO users (id, created_at) VALUES ($1, now()) ON CONFLICT DO NOTHING", scope.user)
    imported: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    for kind, run in groupby(records, key=lambda r: str(r["kind"])):
        group = list(run)
        if kind == "message":  # the bulk of a history: one pipelined round trip for a run of them
            added = await importer.messages(group)
            for counts, n in ((imported, added), (skipped, len(group) - added)):
                if n:
                    counts[kind] += n
            continue
        for record in group:
            (imported if await importer.add(record) else skipped)[kind] += 1
    return {"imported": dict(sorted(imported.items())), "skipped": dict(sorted(skipped.items()))}


# A message, with the conversation it names when the file did not carry it; its context is
# computed after the messages imported before it (each execution sees the previous ones).
_IMPORT_MESSAGE = (
    "WITH c AS (INSERT INTO conversations (user_id, id, agent_id, created_at, last_active_at)"
    " VALUES ($2, $3, $4, $9, $9) ON CONFLICT DO NOTHING)"
    " INSERT INTO messages (id, user_id, conversation_id, agent_id, role, content, content_hash, terms, context,"
    f" created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, {CONTEXT_SQL.format('$2', '$3', '$9')}, $9)"
    " ON CONFLICT DO NOTHING"
)


def _time(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, tz=UTC)


def _json_list(items: Sequence[str]) -> str:
    return json.dumps([clean_text(item) for item in items])


class _Importer:
    """One import's inserts, inside its transaction."""

    def __init__(self, conn: asyncpg.Connection, user: str) -> None:
        self._conn = conn
        self._user = user

    async def _exists(self, table: str, item_id: str) -> bool:
        return await self._conn.fetchval(f"SELECT 1 FROM {table} WHERE user_id = $1 AND id = $2",
                                         self._user, item_id) is not None

    async def _insert(self, sql: str, *args: Any) -> bool:
        return str(await self._conn.execute(sql, *args)).split()[-1] != "0"

    async def add(self, r: dict[str, Any]) -> bool:
        """Insert one record; False when it was skipped."""
        adder = {"conversation": self.conversation, "entity": self.entity, "relationship": self.relationship,
                 "reasoning": self.reasoning}[r["kind"]]
        return bool(await adder(r))

    async def conversation(self, r: dict[str, Any]) -> bool:
        created = _time(r["created_at"])
        return await self._insert(
            "INSERT INTO conversations (user_id, id, agent_id, created_at, last_active_at) VALUES ($1, $2, $3, $4, $5)"
            " ON CONFLICT DO NOTHING", self._user, r["id"], r["agent_id"], created,
            _time(r["last_active_at"]) or created)

    async def _conversation_for(self, r: dict[str, Any]) -> None:
        """The conversation an item names, created when the file did not carry it."""
        await self._conn.execute(
            "INSERT INTO conversations (user_id, id, agent_id, created_at, last_active_at) VALUES ($1, $2, $3, $4, $4)"
            " ON CONFLICT DO NOTHING", self._user, r["conversation_id"], r["agent_id"], _time(r["created_at"]))

    async def messages(self, records: list[dict[str, Any]]) -> int:
        """Insert the messages whose ids the user does not have (nor an earlier record); how many."""
        held = {row["id"] for row in await self._conn.fetch(
            "SELECT id FROM messages WHERE user_id = $1 AND id = ANY($2::text[])", self._user,
            [r["id"] for r in records])}
        new: list[dict[str, Any]] = []
        for r in records:
            if r["id"] not in held:
                held.add(r["id"])
                new.append(r)
        if new:
            await self._conn.executemany(_IMPORT_MESSAGE, [self._message_args(r) for r in new])
        return len(new)

    def _message_args(self, r: dict[str, Any]) -> tuple[Any, ...]:
        content = clean_text(r["content"])
        return (r["id"], self._user, r["conversation_id"], r["agent_id"], r["role"], content, text_hash(content),
                index_terms(content), _time(r["created_at"]))

    async def entity(self, r: dict[str, Any]) -> bool:
        name = clean_text(r["name"])
        key = canonical_name(name)
        taken = await self._conn.fetchval(
            "SELECT 1 FROM entities WHERE user_id = $1 AND (id = $2 OR (coalesce(agent_id, '') = $3"
            " AND canonical_name = $4))", self._user, r["id"], r["agent_id"] or "", key)
        if taken is not None or not key:
            return False
        type_, description = clean_text(r["type"]), clean_text(r["description"])
        aliases = [clean_text(a) for a in r["aliases"]]
        created = _time(r["created_at"])
        return await self._insert(
            "INSERT INTO entities (id, user_id, agent_id, name, canonical_name, type, description, memory_type,"
            " confidence, tags, aliases, provenance, name_terms, type_terms, description_terms, created_at, updated_at,"
            " stored_via) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)",
            r["id"], self._user, r["agent_id"], name, key, type_, description, clean_text(r["memory_type"]),
            r["confidence"], _json_list(r["tags"]), json.dumps(aliases), _json_list(r["provenance"]),
            *entity_terms(name, type_, description, aliases), created, _time(r["updated_at"]) or created,
            r.get("stored_via"))

    async def _entity_id(self, item_id: str | None, name: str | None) -> str | None:
        """The entity an edge end names: by id when the user has it, else by name."""
        if item_id is not None and await self._exists("entities", item_id):
            return item_id
        if name is None or not canonical_name(name):
            return None
        found = await self._conn.fetchval("SELECT id FROM entities WHERE user_id = $1 AND canonical_name = $2"
                                          " ORDER BY seq LIMIT 1", self._user, canonical_name(name))
        return None if found is None else str(found)

    async def relationship(self, r: dict[str, Any]) -> bool:
        if await self._exists("relationships", r["id"]):
            return False
        from_id, to_id = await self._entity_id(r["from_id"], r["from"]), await self._entity_id(r["to_id"], r["to"])
        if from_id is None or to_id is None:
            return False
        return await self._insert(
            "INSERT INTO relationships (id, user_id, agent_id, from_id, type, to_id, valid_from, invalid_at,"
            " provenance, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING",
            r["id"], self._user, r["agent_id"], from_id, clean_text(r["type"]), to_id, _time(r["valid_from"]),
            _time(r["invalid_at"]), _json_list(r["provenance"]), _time(r["created_at"] or r["valid_from"]))

    async def reasoning(self, r: dict[str, Any]) -> bool:
        if await self._exists("reasoning", r["id"]):
            return False
        await self._conversation_for(r)
        steps = tuple(ReasoningStep(clean_text(s["name"]), clean_text(s["arguments"]), clean_text(s["result"]))
                      for s in r["steps"])
        task, answer = clean_text(r["task"]), clean_text(r["answer"])
        return await self._insert(
            "INSERT INTO reasoning (id, user_id, agent_id, conversation_id, task, steps, answer, terms, created_at)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING",
            r["id"], self._user, r["agent_id"], r["conversation_id"], task, steps_json(steps), answer,
            reasoning_terms(task, steps, answer), _time(r["created_at"]))
