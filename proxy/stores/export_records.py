"""The export's records (and the memory API's, which are the same) from stored rows, the same
on every backend: each backend says how it reads a stored time and a stored entity. The
SELECTs here are SQL both backends run the same way; each adds its own WHERE.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from proxy.models import Entity

# Of the object's description an edge is read with its start only: what a graph line may show
# of it is the kind noted in front of it ("cat; My cat Biscuit ..."), a role noun.
OBJECT_DESCRIPTION_HEAD_CHARS = 40
RELATIONSHIP_SELECT = (
    "SELECT r.*, f.name AS from_name, t.name AS to_name, t.type AS to_type,"
    f" substr(t.description, 1, {OBJECT_DESCRIPTION_HEAD_CHARS}) AS to_description FROM relationships r"
    " JOIN entities f ON f.user_id = r.user_id AND f.id = r.from_id"
    " LEFT JOIN entities t ON t.user_id = r.user_id AND t.id = r.to_id"
)
INJECTIONS_SELECT = (
    "SELECT i.turn_key, i.log, i.created_at, t.conversation_id, t.injected FROM injections i"
    " JOIN turns t ON t.user_id = i.user_id AND t.turn_key = i.turn_key"
)
Shape = Callable[[Any], dict[str, Any]]
EXPORT_PAGE = 500  # rows the export reads a statement


async def pages(read: Callable[[list[Any]], Awaitable[Sequence[Any]]], key: Sequence[str]) -> AsyncIterator[Any]:
    """Every row of a table, EXPORT_PAGE at a time: `read(after)` reads the page just past the
    page key `after` (empty: the first page), ordered by the `key` columns."""
    after: list[Any] = []
    while True:
        rows = await read(after)
        for row in rows:
            yield row
        if len(rows) < EXPORT_PAGE:
            return
        after = [rows[-1][k] for k in key]


def _with_agent(record: dict[str, Any], agent: str | None) -> dict[str, Any]:
    if agent is not None:
        record["agent_id"] = agent
    return record


@dataclass(frozen=True)
class ExportRecords:
    """Records from one backend's rows: `iso` makes a stored time ISO 8601 UTC text (None for None),
    `time` an aware datetime, `entity` an Entity of an entities row."""

    iso: Callable[[Any], str | None]
    time: Callable[[Any], datetime]
    entity: Callable[[Any], Entity]

    def tables(self) -> tuple[tuple[str, str, tuple[str, ...], Shape], ...]:
        """What the export reads, in import order: (alias, select, page key, record shape). Each page
        key is a prefix of an index that starts with user_id, so every page is an index range,
        never a scan of the user."""
        return (
            ("c", "SELECT c.* FROM conversations c", ("id",), self.conversation),
            ("m", "SELECT m.* FROM messages m", ("conversation_id", "created_at", "seq"), self.message),
            ("e", "SELECT e.* FROM entities e", ("id",), self.entity_record),
            ("r", RELATIONSHIP_SELECT, ("id",), self.relationship),
            ("x", "SELECT x.* FROM reasoning x", ("id",), self.reasoning),
        )

    def conversation(self, row: Any) -> dict[str, Any]:
        """The export record `conversation` record."""
        record = {"kind": "conversation", "id": row["id"], "created_at": self.iso(row["created_at"]),
                  "last_active_at": self.iso(row["last_active_at"])}
        return _with_agent(record, row["agent_id"])

    def message(self, row: Any) -> dict[str, Any]:
        """The export record `message` record."""
        record = {"kind": "message", "id": row["id"], "conversation_id": row["conversation_id"], "role": row["role"],
                  "content": row["content"], "created_at": self.iso(row["created_at"])}
        return _with_agent(record, row["agent_id"])

    def entity_record(self, row: Any) -> dict[str, Any]:
        """The export record `entity` record."""
        e = self.entity(row)
        record = {"kind": "entity", "id": e.id, "name": e.name, "type": e.type, "description": e.description,
                  "memory_type": e.memory_type, "confidence": e.confidence, "tags": list(e.tags),
                  "aliases": list(e.aliases), "provenance": list(e.provenance),
                  "created_at": self.iso(row["created_at"]), "updated_at": self.iso(row["updated_at"])}
        if row["stored_via"] is not None:
            record["stored_via"] = row["stored_via"]
        return _with_agent(record, row["agent_id"])

    def relationship(self, row: Any) -> dict[str, Any]:
        """The export record `relationship` record (entity names and ids)."""
        record = {"kind": "relationship", "id": row["id"], "from": row["from_name"], "type": row["type"],
                  "to": row["to_name"], "from_id": row["from_id"], "to_id": row["to_id"],
                  "valid_from": self.iso(row["valid_from"]), "invalid_at": self.iso(row["invalid_at"]),
                  "provenance": json.loads(row["provenance"]), "created_at": self.iso(row["created_at"])}
        return _with_agent(record, row["agent_id"])

    def reasoning(self, row: Any) -> dict[str, Any]:
        """The export record `reasoning` record."""
        record = {"kind": "reasoning", "id": row["id"], "conversation_id": row["conversation_id"], "task": row["task"],
                  "steps": json.loads(row["steps"]), "answer": row["answer"], "created_at": self.iso(row["created_at"])}
        return _with_agent(record, row["agent_id"])

    def injection(self, row: Any) -> dict[str, Any]:
        """One turn's injection log entry as the memory API lists it (a row of injections joined with turns)."""
        return {"turn_id": row["turn_key"], "conversation_id": row["conversation_id"],
                "created_at": self.time(row["created_at"]), "injected": row["injected"], "log": json.loads(row["log"])}
