"""The export's JSON Lines records, read for import: every line checked before anything is saved.

An import is all or nothing: the first bad line is a 400 that names it and the field. Ids
follow the id rule of the scope headers (so every item stays addressable in an API path),
times are ISO 8601 (UTC when no offset is given, 1970 to 9999) and come out as unix
seconds. Every text passes the redaction pass on its way in (secrets never reach the store: before anything is
saved), as a chat turn's does.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timezone
from typing import Any

from proxy.api.errors import InvalidRequest
from proxy.errors import BadScope
from proxy.redaction.redact import redact
from proxy.identity.scope import valid_id

KINDS = ("conversation", "message", "entity", "relationship", "reasoning")
ROLES = ("user", "assistant", "system", "tool")
LABEL_MAX_CHARS = 200  # a type, memory type or relationship type
_SURROGATE = re.compile("[\ud800-\udfff]")
# The times a store can read back: 1970-01-01 up to the last day before 9999-12-31 (UTC).
EARLIEST_TS = 0.0
LATEST_TS = datetime(9999, 12, 30, tzinfo=timezone.utc).timestamp()


def parse_lines(data: bytes) -> list[dict[str, Any]]:
    """The validated records of a JSON Lines body, in file order; 400 at the first bad line."""
    records = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            raise InvalidRequest(f"line {number}: not a JSON value") from None
        records.append(parse_record(value, f"line {number}"))
    return records


def parse_record(value: Any, where: str, now: float | None = None) -> dict[str, Any]:
    """One export record, normalised for the store's import."""
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where}: a record must be a JSON object")
    kind = value.get("kind")
    if kind not in KINDS:
        raise InvalidRequest(f"{where}: `kind` must be one of {', '.join(KINDS)}")
    f = _Fields(value, where, datetime.now(timezone.utc).timestamp() if now is None else now)
    base = {"kind": kind, "id": f.id("id"), "agent_id": f.id("agent_id", required=False)}
    return {**base, **_READERS[kind](f)}


class _Fields:
    """Typed access to one record's fields; each failure a 400 naming the line and field."""

    def __init__(self, value: dict[str, Any], where: str, now: float) -> None:
        self.value = value
        self.where = where
        self.now = now

    def fail(self, key: str, expected: str) -> InvalidRequest:
        return InvalidRequest(f"{self.where}: `{key}` must be {expected}", param=key)

    def id(self, key: str, *, required: bool = True) -> Any:
        value = self.value.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, str):
            raise self.fail(key, "a string id")
        try:
            return valid_id(value, key)
        except BadScope:
            raise self.fail(key, "1-256 characters of ASCII letters, digits and ._:@+-") from None

    def text(self, key: str, default: str | None = None, *, non_empty: bool = False, limit: int | None = None) -> Any:
        value = self.value.get(key, default)
        if not isinstance(value, str) or (non_empty and not value.strip()) or (limit and len(value) > limit):
            shape = "a non-empty string" if non_empty else "a string"
            raise self.fail(key, f"{shape} of at most {limit} characters" if limit else shape)
        return self._clean(value)

    @staticmethod
    def _clean(value: str) -> str:
        """The text as it is saved: a lone surrogate as U+FFFD (as the stores keep it), its secrets redacted."""
        return redact(_SURROGATE.sub("\ufffd", value))

    def optional_text(self, key: str) -> str | None:
        return None if self.value.get(key) is None else self.text(key)

    def time(self, key: str, *, default_now: bool = True) -> float | None:
        value = self.value.get(key)
        if value is None:
            return self.now if default_now else None
        try:
            if not isinstance(value, str):
                raise ValueError
            moment = datetime.fromisoformat(value)
            seconds = (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()
        except (ValueError, OverflowError):
            raise self.fail(key, "an ISO 8601 time") from None
        if not EARLIEST_TS <= seconds <= LATEST_TS:
            raise self.fail(key, "a time from 1970 to 9999")
        return seconds

    def fraction(self, key: str, default: float) -> float:
        value = self.value.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0 <= value <= 1:
            raise self.fail(key, "a number from 0 to 1")
        return float(value)

    def strings(self, key: str) -> list[str]:
        value = self.value.get(key, [])
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise self.fail(key, "a list of strings")
        return [self._clean(item) for item in value]

    def steps(self, key: str) -> list[dict[str, str]]:
        value = self.value.get(key, [])
        if not isinstance(value, list) or not all(_is_step(step) for step in value):
            raise self.fail(key, "a list of {name, arguments, result} objects with string values")
        return [{part: self._clean(s.get(part, "")) for part in ("name", "arguments", "result")} for s in value]


def _is_step(step: Any) -> bool:
    return (isinstance(step, dict) and isinstance(step.get("name"), str) and isinstance(step.get("arguments"), str)
            and isinstance(step.get("result", ""), str))


def _conversation(f: _Fields) -> dict[str, Any]:
    return {"created_at": f.time("created_at"), "last_active_at": f.time("last_active_at", default_now=False)}


def _message(f: _Fields) -> dict[str, Any]:
    role = f.value.get("role")
    if role not in ROLES:
        raise f.fail("role", f"one of {', '.join(ROLES)}")
    return {"conversation_id": f.id("conversation_id"), "role": role, "content": f.text("content"),
            "created_at": f.time("created_at")}


def _entity(f: _Fields) -> dict[str, Any]:
    return {"name": f.text("name", non_empty=True), "type": f.text("type", "", limit=LABEL_MAX_CHARS),
            "description": f.text("description", ""),
            "memory_type": f.text("memory_type", "fact", non_empty=True, limit=LABEL_MAX_CHARS),
            "confidence": f.fraction("confidence", 0.7), "tags": f.strings("tags"), "aliases": f.strings("aliases"),
            "provenance": f.strings("provenance"), "created_at": f.time("created_at"),
            "updated_at": f.time("updated_at", default_now=False), "stored_via": f.optional_text("stored_via")}


def _relationship(f: _Fields) -> dict[str, Any]:
    ends = {"from_id": f.id("from_id", required=False), "to_id": f.id("to_id", required=False),
            "from": f.optional_text("from"), "to": f.optional_text("to")}
    for end in ("from", "to"):
        if ends[f"{end}_id"] is None and ends[end] is None:
            raise f.fail(f"{end}_id", f"given (or `{end}`, the entity's name)")
    return {**ends, "type": f.text("type", non_empty=True, limit=LABEL_MAX_CHARS),
            "valid_from": f.time("valid_from"), "invalid_at": f.time("invalid_at", default_now=False),
            "provenance": f.strings("provenance"), "created_at": f.time("created_at", default_now=False)}


def _reasoning(f: _Fields) -> dict[str, Any]:
    return {"conversation_id": f.id("conversation_id"), "task": f.text("task", ""), "steps": f.steps("steps"),
            "answer": f.text("answer", ""), "created_at": f.time("created_at")}


_READERS = {"conversation": _conversation, "message": _message, "entity": _entity, "relationship": _relationship,
            "reasoning": _reasoning}


def to_line(record: dict[str, Any]) -> bytes:
    """One record as a JSON Lines line (UTF-8; escaped where the text cannot be encoded)."""
    try:
        return json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n"
    except UnicodeEncodeError:  # a lone surrogate: valid JSON only as an escape
        return json.dumps(record).encode("ascii") + b"\n"
