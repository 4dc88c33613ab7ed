"""Turn identity (docs/scopes.md): which conversation and turn a chat request belongs to.

A later step of a tool loop is recognised by the tool-call ids of the assistant's calls
after the turn's prompt (memproxy stored them from the previous step's response); a
retry by the hash of its history within `memory.retry_window_s`; anything else is a new
turn. The conversation is the X-Memory-Conversation header, else (scope.conversation:
history) the stored conversation holding the newest assistant message the request
carries, else (latest) the user's most recent conversation, else a new one. On the Responses
wire a known `previous_response_id` (or the `conversation` parameter) comes before the history.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from proxy.ids import derived_id, is_scope_id, new_id
from proxy.models import Scope, Transcript, Turn
from proxy.stores.base import RESPONSE_CHAIN_MAX, ResponseChain, TurnReads, text_hash
from proxy.stores.hash_key import HashKey
from proxy.long_json import list_pieces

# Past this many chars of history text a request's history is hashed in a thread, so the
# event loop serves other streams meanwhile.
HASH_INLINE_CHARS = 65_536


@dataclass(frozen=True)
class TurnIdentity:
    """The turn a request belongs to, and whether memproxy has seen it before."""

    key: str
    conversation_id: str
    history_hash: str
    existing: Turn | None  # the stored turn for a later step or a retry
    new_conversation: bool = False  # a conversation the store has nothing of yet
    # The user's deletion generation when the turn began (stores/generations.py): its writes
    # are skipped once its user or conversation is deleted. None when the store was not asked.
    generation: int | None = None
    shown: tuple[str, ...] = ()  # saved messages of the previous_response_id chain: the model has them

    @property
    def is_new(self) -> bool:
        return self.existing is None


def history_hash(scope: Scope, transcript: Transcript, key: HashKey) -> str:
    """Hash of the scope and every non-system message up to the turn's prompt, sealed with `key`
    (the history is saved redacted: its plain sha256 would give a secret in it away).

    System prompts are left out so one that carries the time does not split a turn. The
    hash is of `json.dumps([user, agent, conversation, [[role, text], ...]], ensure_ascii=False)`,
    a long history written in pieces so that a long message is never encoded in one call.
    """
    material: list[object] = [scope.user, scope.agent or "", scope.conversation or "", transcript.history]
    # The same new items after another response, or in another provider-side conversation, are another turn.
    if transcript.previous_response is not None or transcript.conversation_ref is not None:
        material += [transcript.previous_response or "", transcript.conversation_ref or ""]
    pieces: Iterable[str] = (list_pieces(material) if _history_chars(transcript) > HASH_INLINE_CHARS
                             else (json.dumps(material, ensure_ascii=False),))
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece.encode("utf-8", "surrogatepass"))
    return key.seal(digest.hexdigest())


async def history_digest(scope: Scope, transcript: Transcript, key: HashKey) -> str:
    """`history_hash`, in a thread for a request whose history holds much text."""
    if _history_chars(transcript) <= HASH_INLINE_CHARS:
        return history_hash(scope, transcript, key)
    return await asyncio.to_thread(history_hash, scope, transcript, key)


def _history_chars(transcript: Transcript) -> int:
    return sum(len(text) for _, text in transcript.history)


async def identify(
    store: TurnReads, scope: Scope, transcript: Transcript, *, now: datetime, retry_window_s: float, follow: str,
    key: HashKey, digest: str | None = None,
) -> TurnIdentity:
    """Find the request's turn and conversation in the store, or start new ones (`digest`: its history_hash)."""
    digest = digest or await history_digest(scope, transcript, key)
    call_ids = sealed_call_ids(key, transcript.tool_call_ids)
    chain = await store.response_chain(scope, transcript.previous_response) if transcript.previous_response else None
    shown = chain.shown if chain is not None else await _conversation_shown(store, scope, transcript)
    found = await store.find_turn(scope, call_ids, digest, now - timedelta(seconds=retry_window_s),
                                  transcript.previous_response)
    existing = found.turn
    if existing is not None:
        return TurnIdentity(existing.key, existing.conversation_id, digest, existing, generation=found.generation,
                            shown=shown)
    conversation = await conversation_for(store, scope, transcript, follow, key, chain)
    turn_key, fresh = _new_ids(digest, now, retry_window_s)
    return TurnIdentity(turn_key, conversation or fresh, digest, None, new_conversation=conversation is None,
                        generation=found.generation, shown=shown)


async def conversation_for(store: TurnReads, scope: Scope, transcript: Transcript, follow: str, key: HashKey,
                           chain: ResponseChain | None = None) -> str | None:
    """The conversation a new turn belongs to; None for a new one."""
    if scope.conversation is not None:
        return scope.conversation
    if chain is not None:
        return chain.conversation_id
    named = _named_conversation(transcript)
    if named is not None:
        return named
    if follow == "latest":
        return await store.latest_conversation(scope)
    plain = [text_hash(text) for text in reversed(transcript.assistant_texts)]
    # An answer redaction changed is kept by its sealed digest; one saved as received (or saved
    # before digests were sealed, or edited through the memory API) by the plain one.
    hashes = [found for digest in plain for found in (key.seal(digest), digest)]
    return await store.conversation_by_assistant_hashes(scope, hashes) if hashes else None


def sealed_call_ids(key: HashKey, call_ids: Iterable[str]) -> list[str]:
    """The ids a step's tool calls are kept by: a wire may make one from the call's arguments
    (Gemini's), and those are saved redacted."""
    return [key.seal(call_id) for call_id in call_ids]


async def _conversation_shown(store: TurnReads, scope: Scope, transcript: Transcript) -> tuple[str, ...]:
    """The saved messages of the conversation the `conversation` parameter names: the provider
    holds its items and shows them to the model."""
    named = _named_conversation(transcript)
    if named is None:
        return ()
    messages = await store.messages(scope, named, limit=RESPONSE_CHAIN_MAX)
    return tuple(message.content for message in messages)


def _named_conversation(transcript: Transcript) -> str | None:
    """The `conversation` parameter's id where it is one memproxy can use as a conversation id."""
    return transcript.conversation_ref if is_scope_id(transcript.conversation_ref) else None


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
    turn even when the store cannot be asked (a turn's user message is saved once), as the
    store's own retry check would make them. Without a retry window each request is new.
    """
    if retry_window_s <= 0:
        return new_id(), new_id()
    window_ns = int(retry_window_s * 1e9)
    start_ns = int(now.timestamp() * 1e9) // window_ns * window_ns
    return derived_id(f"turn {digest} {start_ns}", start_ns), derived_id(f"conversation {digest} {start_ns}", start_ns)
