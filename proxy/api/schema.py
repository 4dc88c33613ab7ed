"""The OpenAPI 3.0 document of the memory API, served at /memory/v1/openapi.json.

Written by hand next to records.py, whose shapes it describes; tests/test_api_fuzz.py
generates requests from it for every operation and checks the answers against it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from proxy.api import cursors
from proxy.api.records import (
    CONTENT_MAX_CHARS, MEMORY_TYPES, PAGE_MAX, QUERY_MAX_CHARS, SEARCH_LIMIT_MAX, TAG_MAX_CHARS, TAGS_MAX,
)
from proxy.memory.retrieval.block import SOURCES

ID = {"type": "string", "pattern": "^[A-Za-z0-9._:@+-]{1,256}$", "minLength": 1, "maxLength": 256}
TEXT = {"type": "string"}
TIME = {"type": "string", "format": "date-time"}
NULLABLE_TIME = {**TIME, "nullable": True}
NULLABLE_TEXT = {"type": "string", "nullable": True}
STRINGS = {"type": "array", "items": TEXT}
COUNTS = {"type": "object", "additionalProperties": {"type": "integer"}}
NEXT_CURSOR = {"type": "string", "pattern": cursors.PATTERN, "maxLength": cursors.MAX_CHARS}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(properties: dict[str, Any], required: list[str] | None = None, *, closed: bool = False) -> dict[str, Any]:
    """An object schema; `required` defaults to every property."""
    schema: dict[str, Any] = {"type": "object", "properties": properties,
                              "required": list(properties) if required is None else required}
    if closed:
        schema["additionalProperties"] = False
    return schema


def listing(item: str) -> dict[str, Any]:
    return obj({"object": {"type": "string", "enum": ["list"]}, "data": {"type": "array", "items": ref(item)},
                "next_cursor": {**NEXT_CURSOR, "nullable": True}})


MEMORY = obj({"id": ID, "type": {"type": "string"}, "content": TEXT, "name": TEXT, "entity_type": TEXT,
              "description": TEXT, "conversation_id": ID, "role": TEXT, "confidence": {"type": "number"},
              "tags": STRINGS, "created_at": TIME, "updated_at": TIME,
              "stored_via": NULLABLE_TEXT}, ["id", "type", "content", "created_at"])
ENTITY_FIELDS = {"id": ID, "name": TEXT, "type": TEXT, "description": TEXT, "memory_type": TEXT,
                 "confidence": {"type": "number"}, "tags": STRINGS, "aliases": STRINGS, "provenance": STRINGS,
                 "created_at": TIME, "updated_at": TIME, "agent_id": ID, "stored_via": TEXT}
OPTIONAL_ENTITY_FIELDS = ("agent_id", "stored_via")  # only where set
RELATIONSHIP = obj({"id": ID, "from": NULLABLE_TEXT, "from_id": ID, "type": TEXT, "to": NULLABLE_TEXT, "to_id": ID,
                    "valid_from": TIME, "invalid_at": NULLABLE_TIME, "provenance": STRINGS})
STEP = obj({"name": TEXT, "arguments": TEXT, "result": TEXT})
HIT = obj({"rank": {"type": "integer"}, "source": {"type": "string", "enum": list(SOURCES)}, "id": TEXT,
           "content": TEXT, "reason": TEXT, "score": {"type": "object"},
           "tokens": {"type": "integer", "nullable": True}})

SCHEMAS: dict[str, Any] = {
    "Error": obj({"error": obj({"message": TEXT, "type": TEXT, "param": NULLABLE_TEXT, "code": TEXT})}),
    "MemoryInput": obj({
        "content": {"type": "string", "minLength": 1, "maxLength": CONTENT_MAX_CHARS, "pattern": r"\S"},
        "type": {"type": "string", "enum": list(MEMORY_TYPES)},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.7},
        "tags": {"type": "array", "maxItems": TAGS_MAX,
                 "items": {"type": "string", "minLength": 1, "maxLength": TAG_MAX_CHARS}},
    }, ["content", "type"], closed=True),
    "MemoryCorrection": obj({"content": {"type": "string", "minLength": 1, "maxLength": CONTENT_MAX_CHARS,
                                         "pattern": r"\S"}}, closed=True),
    "SearchInput": obj({
        "query": {"type": "string", "minLength": 1, "maxLength": QUERY_MAX_CHARS, "pattern": r"\S"},
        "limit": {"type": "integer", "minimum": 1, "maximum": SEARCH_LIMIT_MAX},
        "sources": {"type": "array", "items": {"type": "string", "enum": list(SOURCES)}},
        "conversation": ID,
    }, ["query"], closed=True),
    "Memory": MEMORY,
    "Hit": HIT,
    "SearchResult": obj({"object": {"type": "string", "enum": ["search"]}, "query": TEXT,
                         "hits": {"type": "array", "items": ref("Hit")}, "block": TEXT,
                         "budget_cut": {"type": "boolean"},
                         "sources_ms": {"type": "object"}, "errors": {"type": "object"}}),
    "Conversation": obj({"id": ID, "agent_id": {**ID, "nullable": True}, "created_at": TIME, "last_active_at": TIME,
                         "message_count": {"type": "integer"}}),
    "Message": obj({"id": ID, "conversation_id": ID, "role": TEXT, "content": TEXT, "created_at": TIME}),
    "Entity": obj(ENTITY_FIELDS, [k for k in ENTITY_FIELDS if k not in OPTIONAL_ENTITY_FIELDS]),
    "EntityDetail": obj({**ENTITY_FIELDS, "relationships": {"type": "array", "items": ref("Relationship")}},
                        [k for k in ENTITY_FIELDS if k not in OPTIONAL_ENTITY_FIELDS] + ["relationships"]),
    "Relationship": RELATIONSHIP,
    "Reasoning": obj({"id": ID, "conversation_id": ID, "task": TEXT, "steps": {"type": "array", "items": ref("Step")},
                      "answer": TEXT, "created_at": TIME, "agent_id": ID},
                     ["id", "conversation_id", "task", "steps", "answer", "created_at"]),
    "Step": STEP,
    "Injection": obj({"turn_id": TEXT, "conversation_id": ID, "created_at": TIME, "injected": {"type": "integer"},
                      "log": obj({"hits": {"type": "array", "items": ref("InjectedHit")}}, [])}),
    "InjectedHit": obj({
        "source": {"type": "string", "enum": list(SOURCES)}, "id": TEXT, "reason": TEXT, "score": {"type": "object"},
        "tokens": {"type": "integer", "nullable": True},
        "text": {**NULLABLE_TEXT, "description": "The hit's block line as it reads now, looked up when the log is"
                                                 " read (the log keeps no memory text); null when deleted."},
        "now": {"type": "string", "enum": ["current", "changed", "deleted"],
                "description": "What became of the item since the turn: `changed` when an entity was updated or a"
                               " relationship superseded at or after the turn's time; a corrected message carries"
                               " no time of correction, so it reads `current` with today's text."},
    }, ["source", "id", "text", "now"]),
    "User": obj({"object": {"type": "string", "enum": ["user"]}, "user": ID, "conversations": {"type": "integer"},
                 "messages": {"type": "integer"}, "entities": {"type": "integer"},
                 "user_entity_id": {**ID, "nullable": True}}),
    "Deleted": obj({"id": ID, "deleted": COUNTS}),
    "UserDeleted": obj({"user": ID, "deleted": COUNTS}),
    "Imported": obj({"imported": COUNTS, "skipped": COUNTS}),
    **{f"{name}List": listing(name) for name in ("Memory", "Conversation", "Message", "Entity", "Reasoning",
                                                 "Injection")},
}

USER = {"name": "user", "in": "path", "required": True, "schema": ID, "description": "The user id."}
ITEM = {"name": "id", "in": "path", "required": True, "schema": ID, "description": "The item id."}
LIMIT = {"name": "limit", "in": "query", "required": False,
         "schema": {"type": "integer", "minimum": 1, "maximum": PAGE_MAX, "default": 100}}
CURSOR = {"name": "cursor", "in": "query", "required": False, "schema": {"anyOf": [NEXT_CURSOR, ID]},
          "description": "The `next_cursor` of the previous page of this list, as it was given (opaque). It keeps"
                         " its place when items are deleted. A bare item id (the cursor of earlier versions) is"
                         " still read, while that item exists."}
NDJSON = "application/x-ndjson"


def _json(schema: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ref(schema)}}}


_ERRORS = {
    "400": _json("Error", "A malformed id, body or query parameter."),
    "401": _json("Error", "memory_api.token is set and the request does not carry it."),
    "403": _json("Error", "No token is set and the client is not on loopback."),
    "503": _json("Error", "The store is unavailable; retry later."),
}


def operation(op_id: str, summary: str, ok: dict[str, Any], *, status: str = "200", params: tuple[Any, ...] = (),
              body: str | None = None, item: bool = False, large_body: bool = False) -> dict[str, Any]:
    """One operation with the errors every endpoint can answer."""
    responses = {status: ok, **_ERRORS}
    if item:
        responses["404"] = _json("Error", "The user has no such item.")
    op: dict[str, Any] = {"operationId": op_id, "summary": summary, "parameters": [USER, *params],
                          "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref(body)}}}
        responses["413"] = _json("Error", "The body is too large.")
    if large_body:
        op["requestBody"] = {"required": True, "content": {NDJSON: {"schema": {"type": "string"}}}}
        responses["413"] = _json("Error", "The body is larger than server.max_body_bytes.")
    return op


def _deletes() -> dict[str, Any]:
    paths = {}
    for kind, plural in (("memory", "memories"), ("message", "messages"), ("entity", "entities"),
                         ("relationship", "relationships"), ("conversation", "conversations")):
        paths[f"/users/{{user}}/{plural}/{{id}}"] = {"delete": operation(
            f"delete_{kind}", f"Delete one {kind} and what depends on it; rows deleted per table.",
            _json("Deleted", "Deleted."), params=(ITEM,), item=True)}
    return paths


def _paths() -> dict[str, Any]:
    page = (LIMIT, CURSOR)
    paths = _deletes()
    paths["/users/{user}/memories/{id}"]["get"] = operation(
        "get_memory", "One memory: an entity, or a message as an `interaction` memory.", _json("Memory", "The memory."),
        params=(ITEM,), item=True)
    paths["/users/{user}/memories/{id}"]["patch"] = operation(
        "correct_memory", "Correct a memory's text.", _json("Memory", "The corrected memory."), params=(ITEM,),
        body="MemoryCorrection", item=True)
    paths["/users/{user}/memories/{id}"]["patch"]["responses"]["409"] = _json(
        "Error", "Another memory already has this text as its name.")
    paths["/users/{user}/conversations/{id}/messages"] = {"get": operation(
        "list_messages", "Messages of one conversation, oldest first.", _json("MessageList", "A page."),
        params=(ITEM, *page), item=True)}
    paths["/users/{user}/entities/{id}"]["get"] = operation(
        "get_entity", "One entity with its relationships, past ones included.", _json("EntityDetail", "The entity."),
        params=(ITEM,), item=True)
    paths.update({
        "/users/{user}": {
            "get": operation("get_user", "Counts of what memproxy holds for the user, and the user's own entity.",
                             _json("User", "The counts."), item=True),
            "delete": operation("delete_user", "Delete everything of the user; rows deleted per table.",
                                _json("UserDeleted", "Deleted."))},
        "/users/{user}/search": {"post": operation(
            "search", "The hits the proxy would inject for this query, with the reason each ranked.",
            _json("SearchResult", "The hits, in merge order."), body="SearchInput")},
        "/users/{user}/memories": {
            "get": operation("list_memories", "The user's long-term memories (entities), oldest first.",
                             _json("MemoryList", "A page."), params=page),
            "post": operation("store_memory", "Store a memory (as the store_memory tool does).",
                              _json("Memory", "The stored memory."), status="201", body="MemoryInput")},
        "/users/{user}/conversations": {"get": operation(
            "list_conversations", "Conversations, most recently active first.", _json("ConversationList", "A page."),
            params=page)},
        "/users/{user}/entities": {"get": operation(
            "list_entities", "Entities, oldest first.", _json("EntityList", "A page."), params=page)},
        "/users/{user}/reasoning": {"get": operation(
            "list_reasoning", "Reasoning traces, newest first.", _json("ReasoningList", "A page."), params=page)},
        "/users/{user}/injections": {"get": operation(
            "list_injections", "The injection log of the user's last 20 turns, newest first; each hit's text is"
            " looked up now, and says whether the item has changed or gone since.",
            _json("InjectionList", "The log."))},
        "/users/{user}/export": {"get": operation(
            "export", "Every record of the user as JSON Lines.",
            {"description": "JSON Lines.", "content": {NDJSON: {"schema": {"type": "string"}}}})},
        "/users/{user}/import": {"post": operation(
            "import", "Read JSON Lines records into the user; ids it already has are skipped.",
            _json("Imported", "Counts per kind."), large_body=True)},
    })
    return paths


@lru_cache(maxsize=1)
def _document() -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {"title": "memproxy memory API", "version": "1",
                 "description": "Read, correct, export and delete what memproxy remembers, one user at a time."},
        "servers": [{"url": "/memory/v1"}],
        "security": [{"memoryApiToken": []}],
        "paths": _paths(),
        "components": {"schemas": SCHEMAS,
                       "securitySchemes": {"memoryApiToken": {"type": "http", "scheme": "bearer"}}},
    }


def openapi() -> dict[str, Any]:
    """The document (built once; callers must not change it)."""
    return _document()
