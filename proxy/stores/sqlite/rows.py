"""SQLite rows and models: timestamps, stored text, rows to models and exports,
and the agent condition every read of a scope's rows adds.

Timestamps are stored as REAL unix seconds (UTC) and returned as aware datetimes; exports
write ISO 8601 UTC.
"""

from __future__ import annotations

import json
import re
import sqlite3
from datetime import UTC, datetime
from typing import Any

from proxy.models import Entity, ReasoningTrace, Relationship, Scope, StoredMessage, Turn
from proxy.stores.export_records import ExportRecords
from proxy.stores.indexed_text import steps_from_json

_SURROGATE = re.compile("[\ud800-\udfff]")


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


def json_tuple(stored: str) -> tuple[Any, ...]:
    """A stored JSON list as a tuple (most are empty: read without the parser)."""
    return () if stored == "[]" else tuple(json.loads(stored))


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
                        json_tuple(row["provenance"]), row["to_type"] or "", row["to_description"] or "")


def trace_from_row(row: sqlite3.Row) -> ReasoningTrace:
    """A ReasoningTrace from a reasoning row."""
    return ReasoningTrace(row["id"], row["conversation_id"], row["task"], steps_from_json(row["steps"]), row["answer"],
                          from_ts(row["created_at"]))


# The export's records of these rows.
EXPORT = ExportRecords(iso, from_ts, entity_from_row)


def agent_clause(scope: Scope, alias: str, *, per_agent: bool = False) -> tuple[str, list[Any]]:
    """Limit rows to the scope's agent under isolation (or always, for per-agent data such as
    reasoning, whenever the scope names one); the postings' `Filter` says the same."""
    if scope.agent_isolated or (per_agent and scope.agent is not None):
        return f" AND {alias}.agent_id IS ?", [scope.agent]
    return "", []
