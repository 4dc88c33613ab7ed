"""SQLite rows and models: timestamps, stored text, index terms, rows to models and exports,
and the agent condition every read of a scope's rows adds.

Timestamps are stored as REAL unix seconds (UTC) and returned as aware datetimes; exports
write ISO 8601 UTC.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from proxy.models import Entity, ReasoningStep, ReasoningTrace, Relationship, Scope, StoredMessage, Turn
from proxy.terms import index_text


_SURROGATE = re.compile("[\ud800-\udfff]")
# Only this much of an item's text is indexed. Indexing costs ~2 µs a word of CPU on the
# write thread, holding the GIL: a 5 MB pasted message took 1.8 s and starved the event
# loop; a memory is only ever injected as a snippet anyway.
INDEX_MAX_CHARS = 65536
# A message is indexed with the words of the messages just before it in its conversation
# (the question an answer replies to), searched at a lower weight. Measured on the LoCoMo
# dev split (README, "Evaluation"): two earlier messages beat one or three. A long earlier
# message lends only its start: context says what was being talked about.
CONTEXT_MESSAGES = 2
CONTEXT_CHARS_PER_MESSAGE = 2000


def to_ts(at: datetime) -> float:
    """Unix seconds; a naive datetime is taken as UTC."""
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def from_ts(ts: float) -> datetime:
    """An aware UTC datetime from unix seconds."""
    return datetime.fromtimestamp(ts, tz=UTC)


def iso(ts: float | None) -> str | None:
    """ISO 8601 UTC text for an export, None for None."""
    return None if ts is None else from_ts(ts).isoformat()


def now_ts() -> float:
    """The current time in unix seconds."""
    return datetime.now(UTC).timestamp()


def clean_text(text: str) -> str:
    """Text SQLite can store: a lone surrogate (valid JSON, invalid UTF-8) becomes U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def index_terms(text: str) -> str:
    """The FTS text of a stored item: `proxy.terms.index_text` of its first INDEX_MAX_CHARS."""
    return index_text(text[:INDEX_MAX_CHARS])


def context_terms(before: Sequence[str]) -> str:
    """A message's context column: the start of each earlier message's index terms, in order
    (one with no terms, emoji only, adds no empty token)."""
    return " ".join(_head(terms, CONTEXT_CHARS_PER_MESSAGE) for terms in before if terms)


def _head(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return text[: cut if cut > 0 else limit]


def entity_terms(name: str, type_: str, description: str, aliases: Sequence[str] = ()) -> tuple[str, str, str]:
    """The entities_fts columns of an entity: (name and aliases, type, description)."""
    return index_terms(" ".join([name, *aliases])), index_terms(type_), index_terms(description)


def reasoning_terms(task: str, steps: Sequence[ReasoningStep], answer: str) -> str:
    """The reasoning_fts text of a trace: task, each call and result, answer."""
    parts = [task, *(f"{s.name} {s.arguments} {s.result}" for s in steps), answer]
    return index_terms(" ".join(parts))


def json_tuple(stored: str) -> tuple[Any, ...]:
    """A stored JSON list as a tuple (most are empty: read without the parser)."""
    return () if stored == "[]" else tuple(json.loads(stored))


def steps_json(steps: Sequence[ReasoningStep]) -> str:
    """The stored form of a trace's steps."""
    return json.dumps([{"name": s.name, "arguments": s.arguments, "result": s.result} for s in steps])


def steps_from_json(stored: str) -> tuple[ReasoningStep, ...]:
    """A trace's steps from their stored form (`result` may be missing)."""
    return tuple(ReasoningStep(s["name"], s["arguments"], s.get("result", "")) for s in json.loads(stored))


# --- rows to models ------------------------------------------------------------------


def turn_from_row(row: sqlite3.Row) -> Turn:
    """A Turn from a turns row."""
    return Turn(
        key=row["turn_key"],
        conversation_id=row["conversation_id"],
        status=row["status"],
        created_at=from_ts(row["created_at"]),
        block=row["block"],
        injected=row["injected"],
        prompt=row["prompt"],
        context=row["hook_context"],
    )


def message_from_row(row: sqlite3.Row) -> StoredMessage:
    """A StoredMessage from a messages row."""
    return StoredMessage(row["id"], row["conversation_id"], row["role"], row["content"], from_ts(row["created_at"]))


def entity_from_row(row: sqlite3.Row) -> Entity:
    """An Entity from an entities row."""
    # Positional, as message_from_row and trace_from_row are: a search builds dozens of these a
    # request, and keyword arguments cost a third more.
    return Entity(row["id"], row["name"], row["type"], row["description"], row["memory_type"], row["confidence"],
                  json_tuple(row["tags"]), json_tuple(row["aliases"]), json_tuple(row["provenance"]))


def relationship_from_row(row: sqlite3.Row) -> Relationship:
    """A Relationship from a relationships row joined with its entity names."""
    invalid_at = row["invalid_at"]
    return Relationship(row["id"], row["from_id"], row["from_name"], row["type"], row["to_id"], row["to_name"],
                        from_ts(row["valid_from"]), None if invalid_at is None else from_ts(invalid_at),
                        json_tuple(row["provenance"]))


def trace_from_row(row: sqlite3.Row) -> ReasoningTrace:
    """A ReasoningTrace from a reasoning row."""
    return ReasoningTrace(row["id"], row["conversation_id"], row["task"], steps_from_json(row["steps"]), row["answer"],
                          from_ts(row["created_at"]))


def _with_agent(record: dict[str, Any], agent: str | None) -> dict[str, Any]:
    if agent is not None:
        record["agent_id"] = agent
    return record


def export_conversation(row: sqlite3.Row) -> dict[str, Any]:
    """The export record `conversation` record."""
    record = {"kind": "conversation", "id": row["id"], "created_at": iso(row["created_at"]),
              "last_active_at": iso(row["last_active_at"])}
    return _with_agent(record, row["agent_id"])


def export_message(row: sqlite3.Row) -> dict[str, Any]:
    """The export record `message` record."""
    record = {"kind": "message", "id": row["id"], "conversation_id": row["conversation_id"], "role": row["role"],
              "content": row["content"], "created_at": iso(row["created_at"])}
    return _with_agent(record, row["agent_id"])


def export_entity(row: sqlite3.Row) -> dict[str, Any]:
    """The export record `entity` record."""
    e = entity_from_row(row)
    record = {"kind": "entity", "id": e.id, "name": e.name, "type": e.type, "description": e.description,
              "memory_type": e.memory_type, "confidence": e.confidence, "tags": list(e.tags),
              "aliases": list(e.aliases), "provenance": list(e.provenance),
              "created_at": iso(row["created_at"]), "updated_at": iso(row["updated_at"])}
    return _with_agent(record, row["agent_id"])


def export_relationship(row: sqlite3.Row) -> dict[str, Any]:
    """The export record `relationship` record (entity names and ids)."""
    record = {"kind": "relationship", "id": row["id"], "from": row["from_name"], "type": row["type"],
              "to": row["to_name"], "from_id": row["from_id"], "to_id": row["to_id"],
              "valid_from": iso(row["valid_from"]), "invalid_at": iso(row["invalid_at"]),
              "provenance": json.loads(row["provenance"]), "created_at": iso(row["created_at"])}
    return _with_agent(record, row["agent_id"])


def export_reasoning(row: sqlite3.Row) -> dict[str, Any]:
    """The export record `reasoning` record."""
    record = {"kind": "reasoning", "id": row["id"], "conversation_id": row["conversation_id"], "task": row["task"],
              "steps": json.loads(row["steps"]), "answer": row["answer"], "created_at": iso(row["created_at"])}
    return _with_agent(record, row["agent_id"])


def agent_clause(scope: Scope, alias: str, *, per_agent: bool = False) -> tuple[str, list[Any]]:
    """Limit rows to the scope's agent under isolation (or always, for per-agent data such as
    reasoning, whenever the scope names one); the postings' `Filter` says the same."""
    if scope.agent_isolated or (per_agent and scope.agent is not None):
        return f" AND {alias}.agent_id IS ?", [scope.agent]
    return "", []
