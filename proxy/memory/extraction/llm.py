"""`extraction.mode: llm` — what the model is asked, and the strict reading of its answer.

The model is asked, through a JSON-schema response format, for entities
`{name, type, description, confidence}` and relationships `{from, type, to}`. Its answer
is used only when it is exactly that shape with sane values (`parse`); anything else is
InvalidOutput, and the rules' result stands (proxy/memory/learning/extractors.py makes the call).
"""

from __future__ import annotations

import json
import re
from typing import Any

from proxy.extracted import (
    USER_NODE,
    USER_TYPE,
    ExtractedEntity,
    ExtractedRelation,
    Extraction,
    canonical_name,
)

MAX_INPUT_CHARS = 8000  # of the message sent to the model; extraction needs no more
MAX_ITEMS = 50  # entities, and relationships, in one answer
MAX_NAME_CHARS = 200
MAX_DESCRIPTION_CHARS = 1000
_TYPE = re.compile(r"[A-Z][A-Z0-9_]{0,39}")
_ENTITY_TYPE = re.compile(r"[a-z][a-z0-9_ -]{0,39}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

_STRING = {"type": "string"}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["entities", "relationships"],
    "properties": {
        "entities": {"type": "array", "items": {
            "type": "object", "additionalProperties": False,
            "required": ["name", "type", "description", "confidence"],
            "properties": {"name": _STRING, "type": _STRING, "description": _STRING, "confidence": {"type": "number"}},
        }},
        "relationships": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["from", "type", "to"],
            "properties": {"from": _STRING, "type": _STRING, "to": _STRING},
        }},
    },
}
RESPONSE_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {"name": "memory_extraction", "strict": True, "schema": SCHEMA},
}

INSTRUCTIONS = f"""You extract long-term memory from one chat message. Answer with JSON only.
entities: the people, organizations, places, products, pets, events, identifiers and stated preferences the \
message states something about. name: as written; type: one lowercase word (person, organization, place, \
product, pet, event, identifier, preference, ...); description: one short sentence saying what the message \
states about it; confidence: 0 to 1.
relationships: {{from, type, to}} between entity names; type in UPPER_SNAKE_CASE (WORKS_AT, LIVES_IN, \
STUDIES_AT, FROM, HAS_SPOUSE, HAS_PARTNER, HAS_MANAGER, HAS_FRIEND, HAS_PET, PREFERS, DISLIKES, ...).
The user is "{USER_NODE}": use "{USER_NODE}" for the user in relationships and never list it as an entity.
Only what the message states, nothing guessed; a question states nothing. Empty lists when there is nothing."""


class InvalidOutput(ValueError):
    """The model's answer is not exactly the schema with sane values.

    Its message says what was wrong, never the values: they are the user's words, which
    stay out of the log.
    """


def prompt(text: str, speaker: str | None) -> list[dict[str, str]]:
    """The messages of one extraction call."""
    writer = "The message was written by the user." if speaker is None else (
        f'The message was written by "{speaker}" to the user; use "{speaker}" for its writer.')
    return [{"role": "system", "content": f"{INSTRUCTIONS}\n{writer}"},
            {"role": "user", "content": text[:MAX_INPUT_CHARS]}]


def parse(content: str) -> Extraction:
    """The model's answer as an Extraction; InvalidOutput unless it is exactly the schema."""
    try:
        data = json.loads(content)
    except (ValueError, RecursionError) as exc:
        raise InvalidOutput(f"not JSON: {exc}") from None
    _keys(data, {"entities", "relationships"}, "answer")
    entities = [_entity(item) for item in _list(data["entities"], "entities")]
    names = {canonical_name(e.name) for e in entities} | {canonical_name(USER_NODE)}
    relationships = [_relation(item, names) for item in _list(data["relationships"], "relationships")]
    return Extraction(entities, relationships)


def _keys(value: Any, keys: set[str], what: str) -> None:
    if not isinstance(value, dict) or set(value) != keys:
        raise InvalidOutput(f"{what}: expected an object with exactly {sorted(keys)}")


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise InvalidOutput(f"{what}: expected a list of at most {MAX_ITEMS}")
    return value


def _text(value: Any, what: str, limit: int) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise InvalidOutput(f"{what}: expected a string of at most {limit} characters")
    # Control characters out: PostgreSQL refuses a NUL, which lost the message's facts there.
    return " ".join(_CONTROL.sub(" ", value).split())


def _entity(item: Any) -> ExtractedEntity:
    _keys(item, {"name", "type", "description", "confidence"}, "entity")
    name = _text(item["name"], "entity name", MAX_NAME_CHARS)
    kind = _text(item["type"], "entity type", 40).lower()
    confidence = item["confidence"]
    if not name or not _ENTITY_TYPE.fullmatch(kind):
        raise InvalidOutput("entity: empty name, or a type that is not one lowercase word")
    if kind == USER_TYPE:
        # The type of the node that stands for the user, found by it: from the model's answer
        # ("Bob is our newest user", or injected text) it is a person, never the user's node.
        kind = "person"
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 <= confidence <= 1:
        raise InvalidOutput("entity: confidence must be a number from 0 to 1")
    return ExtractedEntity(name, kind, _text(item["description"], "description", MAX_DESCRIPTION_CHARS),
                           float(confidence))


def _relation(item: Any, names: set[str]) -> ExtractedRelation:
    _keys(item, {"from", "type", "to"}, "relationship")
    ends = [_text(item[end], f"relationship {end}", MAX_NAME_CHARS) for end in ("from", "to")]
    kind = _text(item["type"], "relationship type", 40).upper().replace(" ", "_")
    if not _TYPE.fullmatch(kind):
        raise InvalidOutput("relationship: type is not UPPER_SNAKE_CASE")
    for end in ends:
        if canonical_name(end) not in names:
            raise InvalidOutput("relationship: an end is not one of the entities")
    return ExtractedRelation(ends[0], kind, ends[1])
