"""The memory API's JSON: request bodies checked into inputs, stored items shaped for answers.

Every answer is built here from store records, so the OpenAPI document (schema.py) and
the code describe one set of shapes. Times are ISO 8601 UTC.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

from starlette.datastructures import QueryParams

from proxy.api import cursors
from proxy.api.cursors import Listing
from proxy.api.errors import InvalidRequest
from proxy.errors import BadScope
from proxy.memory.retrieval.block import SOURCES
from proxy.models import Relationship, StoredMessage
from proxy.identity.scope import valid_id
from proxy.stores.base import TAGS_MAX, PageKey

MEMORY_TYPES = ("fact", "interaction", "pattern", "user_preference")
CONTENT_MAX_CHARS = 2000  # a memory's content is 1-2000 characters: a fact, not a document
TAG_MAX_CHARS = 40
QUERY_MAX_CHARS = 8000
SEARCH_LIMIT_MAX = 12
PAGE_DEFAULT = 100
PAGE_MAX = 1000
T = TypeVar("T")


@dataclass(frozen=True)
class MemoryInput:
    """POST /memories: what to store (the store_memory tool's arguments)."""

    content: str
    type: str
    confidence: float
    tags: tuple[str, ...]


@dataclass(frozen=True)
class SearchInput:
    """POST /search: the query and which hits to show."""

    query: str
    limit: int | None
    sources: tuple[str, ...]
    conversation: str | None


def dumps(data: Any) -> bytes:
    """Compact UTF-8 JSON (escaped where the text cannot be encoded)."""
    try:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from the request: valid JSON only as an escape
        return json.dumps(data, separators=(",", ":")).encode("ascii")


def path_id(value: str, name: str) -> str:
    """An id from the path, or 400 naming the path parameter."""
    try:
        return valid_id(value, name)
    except BadScope:
        raise InvalidRequest(f"{name} must be 1-256 characters of ASCII letters, digits and ._:@+-",
                             param=name) from None


def _object(body: Any, allowed: Sequence[str], required: Sequence[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise InvalidRequest(f"unknown field `{unknown[0]}` (known: {', '.join(allowed)})", param=unknown[0])
    for key in required:
        if key not in body:
            raise InvalidRequest(f"`{key}` is required", param=key)
    return body


def _text(body: dict[str, Any], key: str, limit: int) -> str:
    value = body[key]
    if not isinstance(value, str) or not _visible(value) or len(value) > limit:
        raise InvalidRequest(f"`{key}` must be a string of 1-{limit} characters, not only spaces or control"
                             " characters", param=key)
    return value


def _visible(text: str) -> bool:
    # A text of control characters alone names nothing: its merge key would be empty.
    return any(c.isprintable() and not c.isspace() for c in text)


def _whole(value: Any, key: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(f"`{key}` must be a whole number from {low} to {high}", param=key)
    return value


def parse_memory(body: Any) -> MemoryInput:
    """The body of POST /memories: {content, type, confidence?, tags?}."""
    body = _object(body, ("content", "type", "confidence", "tags"), ("content", "type"))
    content = _text(body, "content", CONTENT_MAX_CHARS)
    if body["type"] not in MEMORY_TYPES:
        raise InvalidRequest(f"`type` must be one of {', '.join(MEMORY_TYPES)}", param="type")
    confidence = body.get("confidence", 0.7)
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not math.isfinite(confidence) \
            or not 0 <= confidence <= 1:
        raise InvalidRequest("`confidence` must be a number from 0 to 1", param="confidence")
    tags = body.get("tags", [])
    if not isinstance(tags, list) or len(tags) > TAGS_MAX or not all(
            isinstance(t, str) and 1 <= len(t) <= TAG_MAX_CHARS for t in tags):
        raise InvalidRequest(f"`tags` must be at most {TAGS_MAX} strings of 1-{TAG_MAX_CHARS} characters",
                             param="tags")
    return MemoryInput(content, body["type"], float(confidence), tuple(dict.fromkeys(tags)))


def parse_correction(body: Any) -> str:
    """The body of PATCH /memories/{id}: {content}."""
    return _text(_object(body, ("content",), ("content",)), "content", CONTENT_MAX_CHARS)


def parse_search(body: Any) -> SearchInput:
    """The body of POST /search: {query, limit?, sources?, conversation?}."""
    body = _object(body, ("query", "limit", "sources", "conversation"), ("query",))
    query = _text(body, "query", QUERY_MAX_CHARS)
    limit = None if body.get("limit") is None else _whole(body["limit"], "limit", 1, SEARCH_LIMIT_MAX)
    sources = body.get("sources") or []
    if not isinstance(sources, list) or not all(s in SOURCES for s in sources):
        raise InvalidRequest(f"`sources` must be a list of {', '.join(SOURCES)}", param="sources")
    conversation = body.get("conversation")
    if conversation is not None:
        if not isinstance(conversation, str):
            raise InvalidRequest("`conversation` must be a conversation id", param="conversation")
        conversation = path_id(conversation, "conversation")
    return SearchInput(query, limit, tuple(dict.fromkeys(sources)), conversation)


def parse_page(params: QueryParams, listing: Listing) -> tuple[int, PageKey | str | None]:
    """`?limit=` (1-1000, default 100) and `?cursor=`: the key of a cursor of this list, or the id an
    old-style cursor names (the last item of the previous page, before cursors carried keys)."""
    unknown = sorted(set(params) - {"limit", "cursor"})
    if unknown:
        raise InvalidRequest(f"unknown query parameter `{unknown[0]}` (known: limit, cursor)", param=unknown[0])
    text = params.get("limit")
    limit = PAGE_DEFAULT
    if text is not None:
        # Length first: Python refuses to read a number of over 4,300 digits (ValueError).
        digits = text.lstrip("0")
        if not (text.isascii() and text.isdigit()) or len(digits) > len(str(PAGE_MAX)) \
                or not 1 <= int(digits or "0") <= PAGE_MAX:
            raise InvalidRequest(f"`limit` must be a whole number from 1 to {PAGE_MAX}", param="limit")
        limit = int(digits)
    cursor = params.get("cursor")
    if cursor is None:
        return limit, None
    if cursors.MARK in cursor:
        return limit, cursors.read(listing, cursor)
    return limit, path_id(cursor, "cursor")


def page(rows: Sequence[tuple[PageKey, T]], limit: int, listing: Listing,
         shape: Callable[[T], dict[str, Any]]) -> dict[str, Any]:
    """A list answer from up to limit + 1 keyed rows: the extra one only says there is a next page."""
    data = [shape(item) for _, item in rows[:limit]]
    next_cursor = cursors.write(listing, rows[limit - 1][0]) if len(rows) > limit else None
    return {"object": "list", "data": data, "next_cursor": next_cursor}


def iso(moment: datetime | None) -> str | None:
    """ISO 8601 UTC text."""
    return None if moment is None else moment.astimezone(timezone.utc).isoformat()


def memory_content(entity: dict[str, Any]) -> str:
    """The text an entity holds as a memory: its description, or its name when it has none."""
    return str(entity["description"] or entity["name"])


def memory_of_entity(entity: dict[str, Any]) -> dict[str, Any]:
    """An entity (export record) as a memory."""
    return {"id": entity["id"], "type": entity["memory_type"], "content": memory_content(entity),
            "name": entity["name"], "entity_type": entity["type"], "description": entity["description"],
            "confidence": entity["confidence"], "tags": entity["tags"], "created_at": entity["created_at"],
            "updated_at": entity["updated_at"], "stored_via": entity.get("stored_via")}


def memory_of_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message (export record) as an `interaction` memory."""
    return {"id": message["id"], "type": "interaction", "content": message["content"],
            "conversation_id": message["conversation_id"], "role": message["role"],
            "created_at": message["created_at"]}


def without_kind(record: dict[str, Any]) -> dict[str, Any]:
    """An export record as the API shows it (the `kind` is the endpoint's)."""
    return {key: value for key, value in record.items() if key != "kind"}


def conversation(row: dict[str, Any]) -> dict[str, Any]:
    """A conversation from Store.conversations."""
    return {"id": row["id"], "agent_id": row["agent_id"], "created_at": iso(row["created_at"]),
            "last_active_at": iso(row["last_active_at"]), "message_count": row["message_count"]}


def message(m: StoredMessage) -> dict[str, Any]:
    """A saved message."""
    return {"id": m.id, "conversation_id": m.conversation_id, "role": m.role, "content": m.content,
            "created_at": iso(m.created_at)}


def relationship(r: Relationship) -> dict[str, Any]:
    """An edge with the names and ids of its ends and the time it held."""
    return {"id": r.id, "from": r.from_name, "from_id": r.from_id, "type": r.type, "to": r.to_name,
            "to_id": r.to_id, "valid_from": iso(r.valid_from), "invalid_at": iso(r.invalid_at),
            "provenance": list(r.provenance)}


def injection(row: dict[str, Any]) -> dict[str, Any]:
    """One turn's injection log entry."""
    return {"turn_id": row["turn_id"], "conversation_id": row["conversation_id"], "created_at": iso(row["created_at"]),
            "injected": row["injected"], "log": row["log"]}
