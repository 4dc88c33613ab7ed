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
OWNED_COLLECTIONS = {"responses": "response", "conversations": "conversation", "files": "file",
                     "containers": "container"}
# Calls that keep nothing another user could reach (or only what a later call names by an
# attributed id: a Responses request's response).
_STATELESS = frozenset({
    ("POST", "/chat/completions"), ("POST", "/completions"), ("POST", "/embeddings"), ("POST", "/moderations"),
    ("POST", "/messages"), ("POST", "/messages/count_tokens"), ("POST", "/responses/input_tokens"),
    ("POST", "/audio/speech"), ("POST", "/audio/transcriptions"),
    ("POST", "/audio/translations"), ("POST", "/images/generations"), ("POST", "/images/edits"),
    ("POST", "/images/variations"), ("GET", "/models"),
})
# A compaction answers with output items the client sends back by id, as a response's.
_CREATES_ITEMS = {("POST", "/responses/compact"): "response"}
# Keys that name a stored object wherever they sit in a request body (a content part's
# file, a tool's vector stores or container, a replayed answer's code interpreter call or
# citation of a container file), and the kind each names.
_NESTED_REFERENCES = {"file_id": "file", "file_ids": "file", "vector_store_ids": "vector_store", "container": "container",
                      "container_id": "container", "cachedContent": "cached_content",
                      "cached_content": "cached_content"}
# Gemini names a stored file by its URI (`fileData.fileUri`, `.../v1beta/files/{id}`, or its
# name `files/{id}`); a URI
# of anything else (a video's address) names no stored object.
_FILE_URIS = ("fileUri", "file_uri")
_FILE_URI_ID = re.compile(r"^\s*(?:https?://[^/]*googleapis\.com/(?:[^/]+/)*)?files/([^/?#]+)", re.IGNORECASE)
# A chat completion asked to speak (`"modalities": [..., "audio"]`) answers with an audio the
# provider keeps for a while: a later chat completion's assistant message names it by its id,
# `"audio": {"id": ...}`, the only form the provider reads. Elsewhere a key named `audio` is
# the user's own (a tool call's argument, metadata), and the output settings, `"audio":
# {"voice": ...}`, hold no id.
AUDIO = "audio"
_CHAT_COMPLETIONS = "/chat/completions"
# Top-level parameters that name a stored object.
_TOP_REFERENCES = {"previous_response_id": "response", "conversation": "conversation"}
# Top-level lists of Responses input items (a request's `input`, a conversation's `items`):
# an item there with an `id` names a stored item of a response, whatever else it holds: a
# reference (`{"type": "item_reference", "id": ...}`, the type optional), or an item given
# whole, which the provider reads by its id (a reasoning item without its encrypted content
# is the stored one). Each such id, and an `item_reference` typed anywhere, must be one of
# the requester's: memproxy records the ids of the output items of every response it sees
# created (output_objects).
_ITEM_LISTS = ("input", "items")
ITEM_REFERENCE = "item_reference"
# An answer's citation of a file a code interpreter wrote in its container.
_CONTAINER_FILE_CITATION = "container_file_citation"
# A body holding none of these keys cannot name an object (`\u`: a key may be written escaped),
# nor one holding an item list but no `"id"` (most Responses requests: not parsed twice).
_NEEDLES = (*(f'"{key}"'.encode() for key in (*_NESTED_REFERENCES, *_TOP_REFERENCES, *_FILE_URIS)),
            f'"{ITEM_REFERENCE}"'.encode(), b"\\u")
_LIST_NEEDLES = tuple(f'"{key}"'.encode() for key in _ITEM_LISTS)
# Gemini's uploads (`/upload/v1beta/files`, a file search store's documents): the client sends
# the bytes, and the provider answers with what it made, at an address the provider gives,
# outside memproxy, which never sees the object's name.
_UPLOADS = "/upload/"
# What a model does with a request and forgets (Gemini's calls, `POST /models/{model}:action`).
_MODEL_ACTIONS = frozenset({"generateContent", "streamGenerateContent", "countTokens", "embedContent",
                            "batchEmbedContents"})


# Items an answer lists, each the creator's of the object they are listed under: a
# conversation's, as adding them (`POST /conversations/{id}/items`) or listing them (`GET`, the
# items it was created with among them) answers, and a response's input items
# (`GET /responses/{id}/input_items`: an input item sent without an id gets one there, its
# only sight). A later input names each by its id, as a response's output items. An id listed
# is either one the request that made the object named (checked then to be the requester's)
# or one the provider gave it: no other user's.
LISTED_ITEMS = "listed_items"
# The paths under an object (after its id) that answer with such a list, by method and kind.
_LISTS_ITEMS = frozenset({("POST", "conversation", "items"), ("GET", "conversation", "items"),
                          ("GET", "response", "input_items")})


@dataclass(frozen=True)
class Access:
    """What a request does with provider objects; `kind` and `object_id` as the verdict needs;
    `adds`: what a request naming an object records beside it (the items its answer lists)."""

    verdict: Verdict
    kind: str = ""
    object_id: str = ""
    adds: str = ""


def access(method: str, path: str, version: str = "/v1") -> Access:
    """What a request to `path` (after its `version` prefix, /v1 most often) does with provider objects."""
    if version.startswith(_UPLOADS):
        return Access("unattributed")
    if (method, path) in _STATELESS:
        return Access("stateless")
    if (method, path) in _CREATES_ITEMS:
        return Access("creates", _CREATES_ITEMS[method, path])
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
    adds = LISTED_ITEMS if len(segments) == 3 and (method, kind, segments[2]) in _LISTS_ITEMS else ""
    return Access("names", kind, unquote(segments[1]), adds)  # as the provider reads the path


def created_by_body(path: str, document: Any) -> str | None:
    """The kind of object a stateless call's body makes it create: a chat completion asked for
    audio output creates an audio (its id comes in the answer).

    `document` is the body as `references` read it: a chat completion's body it left unread
    holds neither `"audio"` nor an escape, so it cannot ask for audio."""
    if path != _CHAT_COMPLETIONS or not isinstance(document, dict):
        return None
    modalities = document.get("modalities")
    return AUDIO if isinstance(modalities, list) and AUDIO in modalities else None


class Unreadable(ValueError):
    """A body that may name objects but is no JSON memproxy can read."""


@dataclass(frozen=True)
class References:
    """The stored objects a request body names ((kind, id) each), and the body's JSON as read to
    find them (None: the body could name none, and was not read)."""

    named: list[tuple[str, str]]
    document: Any = None


def references(body: bytes, path: str = "") -> References:
    """Every stored object a JSON request body names; Unreadable when it may name some but cannot
    be read. Duplicate keys count each time (a provider may read either).

    A body that is not UTF-8 text is Unreadable whatever it holds: a compressed body
    (`Content-Encoding: gzip`) or UTF-16 JSON shows no needle here, yet the provider may
    decode it and read the ids in it."""
    if body and (b"\x00" in body or not _utf8(body)):
        raise Unreadable("the body is not UTF-8 text")
    nested_keys = {**_NESTED_REFERENCES, AUDIO: AUDIO} if path == _CHAT_COMPLETIONS else _NESTED_REFERENCES
    if not any(needle in body for needle in _NEEDLES) and not (
            b'"id"' in body and any(needle in body for needle in _LIST_NEEDLES)) and not (
            path == _CHAT_COMPLETIONS and b'"audio"' in body):
        return References([])
    nested: list[tuple[str, Any]] = []
    top: list[list[tuple[str, Any]]] = []

    def collect(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nested.extend((key, value) for key, value in pairs
                      if key in nested_keys and (key != AUDIO or isinstance(value, dict)))
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
    found = [(nested_keys.get(key, "item"), each) for key, value in nested for each in _ids(value)]
    if isinstance(document, dict) and top:
        found += [(_TOP_REFERENCES[key], each) for key, value in top[0] if key in _TOP_REFERENCES
                  for each in _ids(value)]
        found += [("item", item["id"]) for key, value in top[0] if key in _ITEM_LISTS and isinstance(value, list)
                  for item in value if isinstance(item, dict) and isinstance(item.get("id"), str)
                  and item.get("type") != ITEM_REFERENCE]  # a typed reference's id is in `nested` already
    return References(found, document)


def _ids(value: Any) -> list[str]:
    """The ids a reference's value holds: a string, a list of them, or an object's `id`."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [each for each in value if isinstance(each, str)]
    if isinstance(value, dict) and isinstance(value.get("id"), str):
        return [value["id"]]
    return []


def created_objects(body: bytes, kind: str) -> list[tuple[str, str]]:
    """(kind, id) of what a creation's JSON answer describes: the object (of `kind`), and what its
    output holds (output_objects); of a chat completion asked to speak, its audio; of a list of
    items (LISTED_ITEMS), each item."""
    document = _json(body)
    if not isinstance(document, dict):
        return []
    if kind == AUDIO:
        return _spoken(document, "message")
    if kind == LISTED_ITEMS:
        return output_objects(document.get("data"))
    found = document.get("id")
    itself = [(kind, found)] if isinstance(found, str) and found else []
    return itself + output_objects(document.get("output"))


# Events naming something created carry one of these keys (`"item_id"`, a delta's, is not `"item"`).
_EVENT_NEEDLES = ('"response"', '"item"', '"annotation"')


def created_in_event(data: str, kind: str) -> list[tuple[str, str]]:
    """(kind, id) of what a Responses stream's event shows created: the response (of `kind`;
    `response.created` is the first event), an output item and what it holds, a citation; of a
    chat completion's stream asked to speak, the audio a chunk carries."""
    if kind == AUDIO:
        document = _json(data) if f'"{AUDIO}"' in data else None
        return _spoken(document, "delta") if isinstance(document, dict) else []
    if not any(needle in data for needle in _EVENT_NEEDLES):
        return []  # a delta, most events of a stream: not parsed
    document = _json(data)
    if not isinstance(document, dict):
        return []
    response, item, annotation = document.get("response"), document.get("item"), document.get("annotation")
    found: list[tuple[str, str]] = []
    if isinstance(response, dict):
        response_id = response.get("id")
        found += [(kind, response_id)] if isinstance(response_id, str) and response_id else []
        found += output_objects(response.get("output"))
    found += output_objects([item]) + _cited(annotation)
    return found


def output_objects(output: Any) -> list[tuple[str, str]]:
    """(kind, id) of what a response's output items create: each item (its id is what a later
    input names it by), the container a code interpreter ran in, the container files the
    answer cites. Only from those places: elsewhere an item holds what the requester wrote
    (an MCP server's tool schemas, a shell call's environment), which must not claim an id."""
    if not isinstance(output, list):
        return []
    found: list[tuple[str, str]] = []
    for item in output:
        if not isinstance(item, dict):
            continue
        if isinstance(item.get("id"), str) and item["id"]:
            found.append(("item", item["id"]))
        container = item.get("container_id")
        if item.get("type") == "code_interpreter_call" and isinstance(container, str) and container:
            found.append(("container", container))
        if item.get("type") == "message" and isinstance(item.get("content"), list):
            for part in item["content"]:
                annotations = part.get("annotations") if isinstance(part, dict) else None
                for annotation in annotations if isinstance(annotations, list) else ():
                    found += _cited(annotation)
    return found


def _spoken(completion: dict[str, Any], part: str) -> list[tuple[str, str]]:
    """(audio, id) of each audio a chat completion (`part` "message") or one of its stream's chunks
    ("delta") carries in its choices."""
    choices = completion.get("choices")
    found: list[tuple[str, str]] = []
    for choice in choices if isinstance(choices, list) else ():
        said = choice.get(part) if isinstance(choice, dict) else None
        audio = said.get(AUDIO) if isinstance(said, dict) else None
        audio_id = audio.get("id") if isinstance(audio, dict) else None
        if isinstance(audio_id, str) and audio_id:
            found.append((AUDIO, audio_id))
    return found


def _cited(annotation: Any) -> list[tuple[str, str]]:
    """The container and file of a `container_file_citation` annotation; nothing for any other."""
    if not isinstance(annotation, dict) or annotation.get("type") != _CONTAINER_FILE_CITATION:
        return []
    container, file = annotation.get("container_id"), annotation.get("file_id")
    return ([("container", container)] if isinstance(container, str) and container else []) + (
        [("container_file", file)] if isinstance(file, str) and file else [])


def _utf8(body: bytes) -> bool:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _json(text: bytes | str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None
