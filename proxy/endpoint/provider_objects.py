"""Which provider objects a request names or creates: the rules of keeping them per user.

Where memproxy's own provider key serves several users, the provider answers any of them
about any object made with that key. memproxy therefore records who created each object
it sees created, and lets a request through only when every object it names is the
requester's (endpoint/ownership.py applies these rules; docs/auth.md says them). An
endpoint whose objects memproxy cannot attribute is refused: the default for any path
not listed here, so a provider's new stateful endpoint is closed until it is.

Pure rules, no I/O.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote

Verdict = Literal["stateless", "creates", "names", "unattributed"]

# The objects memproxy attributes, by the collection they live under (after /v1).
OWNED_COLLECTIONS = {"responses": "response", "conversations": "conversation", "files": "file"}
# Calls that keep nothing another user could reach (or only what a later call names by an
# attributed id: a Responses request's response).
_STATELESS = frozenset({
    ("POST", "/chat/completions"), ("POST", "/completions"), ("POST", "/embeddings"), ("POST", "/moderations"),
    ("POST", "/messages"), ("POST", "/messages/count_tokens"), ("POST", "/responses/input_tokens"),
    ("POST", "/responses/compact"), ("POST", "/audio/speech"), ("POST", "/audio/transcriptions"),
    ("POST", "/audio/translations"), ("POST", "/images/generations"), ("POST", "/images/edits"),
    ("POST", "/images/variations"), ("GET", "/models"),
})
# Keys that name a stored object wherever they sit in a request body (a content part's
# file, a tool's vector stores or container), and the kind each names.
_NESTED_REFERENCES = {"file_id": "file", "file_ids": "file", "vector_store_ids": "vector_store", "container": "container",
                      "cachedContent": "cached_content", "cached_content": "cached_content"}
# Gemini names a stored file by its URI (`fileData.fileUri`, `.../v1beta/files/{id}`, or its
# name `files/{id}`); a URI
# of anything else (a video's address) names no stored object.
_FILE_URIS = ("fileUri", "file_uri")
_FILE_URI_ID = re.compile(r"^\s*(?:https?://[^/]*googleapis\.com/(?:[^/]+/)*)?files/([^/?#]+)", re.IGNORECASE)
# Top-level parameters that name a stored object.
_TOP_REFERENCES = {"previous_response_id": "response", "conversation": "conversation"}
# Top-level lists of Responses input items (a request's `input`, a conversation's `items`):
# an item there may be a reference to a stored item of any response (`{"type":
# "item_reference", "id": ...}`, the type optional). memproxy records no item ids, so every
# such reference is refused: an `item_reference` typed anywhere, and an item in these lists
# with an `id` but neither a `type` nor a `role`.
_ITEM_LISTS = ("input", "items")
ITEM_REFERENCE = "item_reference"
# A body holding none of these keys cannot name an object (`\u`: a key may be written escaped),
# nor one holding an item list but no `"id"` (most Responses requests: not parsed twice).
_NEEDLES = (*(f'"{key}"'.encode() for key in (*_NESTED_REFERENCES, *_TOP_REFERENCES, *_FILE_URIS)),
            f'"{ITEM_REFERENCE}"'.encode(), b"\\u")
_LIST_NEEDLES = tuple(f'"{key}"'.encode() for key in _ITEM_LISTS)
# What a model does with a request and forgets (Gemini's calls, `POST /models/{model}:action`).
_MODEL_ACTIONS = frozenset({"generateContent", "streamGenerateContent", "countTokens", "embedContent",
                            "batchEmbedContents"})


@dataclass(frozen=True)
class Access:
    """What a request does with provider objects; `kind` and `object_id` as the verdict needs."""

    verdict: Verdict
    kind: str = ""
    object_id: str = ""


def access(method: str, path: str) -> Access:
    """What a request to `path` (after /v1) does with provider objects."""
    if (method, path) in _STATELESS:
        return Access("stateless")
    segments = path.split("/")[1:]
    if len(segments) == 2 and segments[0] == "models" and segments[1]:
        action = segments[1].rpartition(":")[2] if ":" in segments[1] else None
        if method == "GET" and action is None or method == "POST" and action in _MODEL_ACTIONS:
            return Access("stateless")  # a model's card, or a call to it (deleting a fine-tuned model is not)
    kind = OWNED_COLLECTIONS.get(segments[0]) if segments else None
    if kind is None:
        return Access("unattributed")
    if len(segments) == 1:
        return Access("creates", kind) if method == "POST" else Access("unattributed")  # a list: everyone's
    return Access("names", kind, unquote(segments[1]))  # as the provider reads the path


class Unreadable(ValueError):
    """A body that may name objects but is no JSON memproxy can read."""


def references(body: bytes) -> list[tuple[str, str]]:
    """(kind, id) of every stored object a JSON request body names; Unreadable when it may name
    some but cannot be read. Duplicate keys count each time (a provider may read either)."""
    if not any(needle in body for needle in _NEEDLES) and not (
            b'"id"' in body and any(needle in body for needle in _LIST_NEEDLES)):
        return []
    nested: list[tuple[str, Any]] = []
    top: list[list[tuple[str, Any]]] = []

    def collect(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nested.extend((key, value) for key, value in pairs if key in _NESTED_REFERENCES)
        nested.extend(("file_id", unquote(found[1])) for key, value in pairs
                      if key in _FILE_URIS and isinstance(value, str) and (found := _FILE_URI_ID.match(value)))
        if any(key == "type" and value == ITEM_REFERENCE for key, value in pairs):
            nested.extend((ITEM_REFERENCE, value) for key, value in pairs if key == "id")
        top[:] = [pairs]  # the outermost object is the last one completed
        return dict(pairs)

    try:
        document = json.loads(body, object_pairs_hook=collect)
    except (ValueError, RecursionError):
        raise Unreadable("the body is not JSON") from None
    found = [(_NESTED_REFERENCES.get(key, "item"), each) for key, value in nested for each in _ids(value)]
    if isinstance(document, dict) and top:
        found += [(_TOP_REFERENCES[key], each) for key, value in top[0] if key in _TOP_REFERENCES
                  for each in _ids(value)]
        found += [("item", item["id"]) for key, value in top[0] if key in _ITEM_LISTS and isinstance(value, list)
                  for item in value if _untyped_reference(item)]
    return found


def _untyped_reference(item: Any) -> bool:
    """An input item naming a stored item by id alone (an `item_reference` whose type is left out)."""
    return (isinstance(item, dict) and isinstance(item.get("id"), str) and "type" not in item
            and "role" not in item)


def _ids(value: Any) -> list[str]:
    """The ids a reference's value holds: a string, a list of them, or an object's `id`."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [each for each in value if isinstance(each, str)]
    if isinstance(value, dict) and isinstance(value.get("id"), str):
        return [value["id"]]
    return []


def created_id(body: bytes) -> str | None:
    """The id of the object a creation's JSON answer describes."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return None
    found = document.get("id") if isinstance(document, dict) else None
    return found if isinstance(found, str) and found else None


def created_id_in_event(data: str) -> str | None:
    """The id of the response a Responses stream's event describes (`response.created` is the first)."""
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        return None
    response = document.get("response") if isinstance(document, dict) else None
    found = response.get("id") if isinstance(response, dict) else None
    return found if isinstance(found, str) and found else None
