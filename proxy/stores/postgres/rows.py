"""PostgreSQL records and models: stored text, timestamps, records to models and exports.

The same shapes as sqlite/rows.py; PostgreSQL hands back aware datetimes, so only the
text needs care: besides lone surrogates, PostgreSQL text cannot hold NUL.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

from asyncpg import Record

from proxy.models import Entity, ReasoningStep, ReasoningTrace, Relationship, StoredMessage, Turn
from proxy.stores.export_records import ExportRecords

# A lone surrogate (valid JSON, invalid UTF-8) or NUL (valid JSON, refused by PostgreSQL text).
_UNSTORABLE = re.compile("[\ud800-\udfff\x00]")


def clean_text(text: str) -> str:
    """Text PostgreSQL can store: lone surrogates and NUL become U+FFFD."""
    return _UNSTORABLE.sub("\ufffd", text)


def utc(at: datetime) -> datetime:
    """An aware UTC datetime; a naive one is taken as UTC (as the SQLite store does)."""
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def micros(at: datetime) -> int:
    """Microseconds since the epoch: a timestamptz exactly, as a number a list cursor can carry."""
    return (utc(at) - _EPOCH) // _MICROSECOND


def from_micros(count: float) -> datetime:
    """The aware UTC datetime `count` microseconds after the epoch."""
    return _EPOCH + timedelta(microseconds=count)


def iso(at: datetime | None) -> str | None:
    """ISO 8601 UTC text for an export, None for None."""
    return None if at is None else utc(at).isoformat()


def turn_from_record(row: Record) -> Turn:
    """A Turn from a turns record."""
    return Turn(key=row["turn_key"], conversation_id=row["conversation_id"], status=row["status"],
                created_at=utc(row["created_at"]), block=row["block"], injected=row["injected"], prompt=row["prompt"],
                context=row["hook_context"])


def message_from_record(row: Record) -> StoredMessage:
    """A StoredMessage from a messages record."""
    return StoredMessage(row["id"], row["conversation_id"], row["role"], row["content"], utc(row["created_at"]))


def entity_from_record(row: Record) -> Entity:
    """An Entity from an entities record."""
    return Entity(id=row["id"], name=row["name"], type=row["type"], description=row["description"],
                  memory_type=row["memory_type"], confidence=row["confidence"], tags=tuple(json.loads(row["tags"])),
                  aliases=tuple(json.loads(row["aliases"])), provenance=tuple(json.loads(row["provenance"])))


def relationship_from_record(row: Record) -> Relationship:
    """A Relationship from a relationships record joined with its entity names."""
    invalid_at = row["invalid_at"]
    return Relationship(id=row["id"], from_id=row["from_id"], from_name=row["from_name"], type=row["type"],
                        to_id=row["to_id"], to_name=row["to_name"], valid_from=utc(row["valid_from"]),
                        invalid_at=None if invalid_at is None else utc(invalid_at),
                        provenance=tuple(json.loads(row["provenance"])), to_type=row["to_type"] or "",
                        to_description=row["to_description"] or "")


def trace_from_record(row: Record) -> ReasoningTrace:
    """A ReasoningTrace from a reasoning record."""
    steps = tuple(ReasoningStep(s["name"], s["arguments"], s.get("result", "")) for s in json.loads(row["steps"]))
    return ReasoningTrace(row["id"], row["conversation_id"], row["task"], steps, row["answer"],
                          utc(row["created_at"]))


# The export's records of these rows.
EXPORT = ExportRecords(iso, utc, entity_from_record)
