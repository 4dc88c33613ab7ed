"""Turn identity (SPEC 2-3): which conversation and turn a chat request belongs to.

A later step of a tool loop is recognised by the tool-call ids of the assistant messages
after the last user message (memproxy stored them from the previous step's response); a
retry by the hash of its history within `memory.retry_window_s`; anything else is a new
turn. The conversation is the X-Memory-Conversation header, else (scope.conversation:
history) the stored conversation holding the newest assistant message the request
carries, else (latest) the user's most recent conversation, else a new one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from proxy.ids import derived_id, new_id
from proxy.models import Scope, Turn
from proxy.stores.base import Store, text_hash
from proxy.wire.openai_chat import ChatRequest, assistant_texts, history_material, tool_call_ids_after_last_user

# Past this many chars of message text a request's history is hashed in a thread, so the
# event loop serves other streams meanwhile.
HASH_INLINE_CHARS = 65_536
# A long text is JSON-encoded and hashed in pieces this long, each a short hold of the GIL.
HASH_PIECE_CHARS = 1 << 16


@dataclass(frozen=True)
class TurnIdentity:
    """The turn a request belongs to, and whether memproxy has seen it before."""

    key: str
    conversation_id: str
    history_hash: str
    existing: Turn | None  # the stored turn for a later step or a retry
    new_conversation: bool = False  # a conversation the store has nothing of yet

    @property
    def is_new(self) -> bool:
        return self.existing is None


def history_hash(scope: Scope, request: ChatRequest) -> str:
    """Hash of the scope and every non-system message up to the last user message.

    System prompts are left out so one that carries the time does not split a turn. The
    hash is of `json.dumps([user, agent, conversation, [[role, text], ...]], ensure_ascii=False)`,
    written in pieces so that a long message is never encoded in one call.
    """
    material: list[Any] = [scope.user, scope.agent or "", scope.conversation or "", history_material(request.messages)]
    digest = hashlib.sha256()
    for piece in _json_pieces(material):
        digest.update(piece.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def _json_pieces(value: Any) -> Iterator[str]:
    """`json.dumps(value, ensure_ascii=False)` in pieces, for strings, lists and tuples of them."""
    if isinstance(value, str):
        if len(value) <= HASH_PIECE_CHARS:
            yield json.dumps(value, ensure_ascii=False)
            return
        # JSON escapes char by char, so a string's escaped pieces join into its escaped whole.
        yield '"'
        for start in range(0, len(value), HASH_PIECE_CHARS):
            yield json.dumps(value[start:start + HASH_PIECE_CHARS], ensure_ascii=False)[1:-1]
        yield '"'
        return
    yield "["
    for n, item in enumerate(value):
        if n:
            yield ", "
        yield from _json_pieces(item)
    yield "]"


async def history_digest(scope: Scope, request: ChatRequest) -> str:
    """`history_hash`, in a thread for a request whose messages hold much text."""
    if _text_chars(request) <= HASH_INLINE_CHARS:
        return history_hash(scope, request)
    return await asyncio.to_thread(history_hash, scope, request)


def _text_chars(request: ChatRequest) -> int:
    """About how much text the request's messages hold (their string contents and text parts)."""
    total = 0
    for message in request.messages:
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(part["text"]) for part in content
                         if isinstance(part, dict) and isinstance(part.get("text"), str))
    return total


async def identify(
    store: Store, scope: Scope, request: ChatRequest, *, now: datetime, retry_window_s: float, follow: str,
    digest: str | None = None,
) -> TurnIdentity:
    """Find the request's turn and conversation in the store, or start new ones (`digest`: its history_hash)."""
    digest = digest or await history_digest(scope, request)
    call_ids = tool_call_ids_after_last_user(request.messages)
    existing = await store.turn_by_tool_calls(scope, call_ids) if call_ids else None
    if existing is None:
        existing = await store.turn_by_history(scope, digest, now - timedelta(seconds=retry_window_s))
    if existing is not None:
        return TurnIdentity(existing.key, existing.conversation_id, digest, existing)
    conversation = await conversation_for(store, scope, request, follow)
    key, fresh = _new_ids(digest, now, retry_window_s)
    return TurnIdentity(key, conversation or fresh, digest, None, new_conversation=conversation is None)


async def conversation_for(store: Store, scope: Scope, request: ChatRequest, follow: str) -> str | None:
    """The conversation a new turn belongs to (SPEC 2); None for a new one."""
    if scope.conversation is not None:
        return scope.conversation
    if follow == "latest":
        return await store.latest_conversation(scope)
    hashes = [text_hash(text) for text in reversed(assistant_texts(request.messages))]
    return await store.conversation_by_assistant_hashes(scope, hashes) if hashes else None


def fallback_identity(scope: Scope, *, digest: str, now: datetime, retry_window_s: float) -> TurnIdentity:
    """A turn when the store could not be asked in time (memory degraded): saved later, never lost.

    Its ids are those `identify` gives a new turn, so a later step of a tool loop or an SDK
    retry is the same turn whether or not the store could be asked for it (the store keeps
    a turn in the conversation it began in).
    """
    key, fresh = _new_ids(digest, now, retry_window_s)
    return TurnIdentity(key, scope.conversation or fresh, digest, None)


def _new_ids(digest: str, now: datetime, retry_window_s: float) -> tuple[str, str]:
    """A new turn's key and a new conversation's id.

    They come from the history (which a tool loop's later steps and an SDK's retries
    repeat) and the stretch of `retry_window_s` the request falls in, so those are one
    turn even when the store cannot be asked (SPEC 3: the user message saved once), as the
    store's own retry check would make them. Without a retry window each request is new.
    """
    if retry_window_s <= 0:
        return new_id(), new_id()
    window_ns = int(retry_window_s * 1e9)
    start_ns = int(now.timestamp() * 1e9) // window_ns * window_ns
    return derived_id(f"turn {digest} {start_ns}", start_ns), derived_id(f"conversation {digest} {start_ns}", start_ns)
