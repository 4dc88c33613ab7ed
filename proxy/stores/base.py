"""The Store protocol: what memory needs from a database, backend-neutral.

Every method takes the scope first and every query filters by it, so no code path can
read or change another user's memory. Writes are plain data (`WriteOp`s) applied in
batches by `Store.apply`, one transaction per batch: the writer task (memory/writer.py)
drains a queue into it, so a burst of turns commits together. Every write is idempotent
(unique keys, insert-or-ignore), so a retried batch or a second replica never saves twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, Union

from proxy.models import (
    Entity,
    ReasoningStep,
    ReasoningTrace,
    Relationship,
    Scope,
    StoredMessage,
    Turn,
    TurnStatus,
)
from proxy.stores.generations import Generation


class StoreError(Exception):
    """The store failed (locked, full, gone); callers degrade, never fail a request.

    `transient` is False only when retrying cannot help (the write itself is invalid):
    a locked, full or unreachable database is transient and its writes are retried.
    """

    def __init__(self, message: str, *, transient: bool = True) -> None:
        super().__init__(message)
        self.transient = transient


def text_hash(text: str) -> str:
    """The hash messages are matched by: sha256 hex of the UTF-8 text (lone surrogates kept)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# --- writes -------------------------------------------------------------------------


@dataclass(frozen=True)
class ItemVector:
    """A message's vector, computed before its write (memory/vectors/filler.py) and saved by `apply`
    in the write's transaction: only when the message is new and its embedding text (vector_sql.py)
    is `text`, so the vector is of exactly what was saved."""

    model: str
    text: str
    vector: bytes  # float32, little-endian


@dataclass(frozen=True)
class StartTurn:
    """First sight of a turn: its conversation, the turn row and the user's message.

    `user_text` is None when nothing is to be saved for the message (persist off).
    The conversation is created if new and its last-activity time moved forward.
    """

    scope: Scope
    turn_key: str
    conversation_id: str
    history_hash: str
    at: datetime
    user_text: str | None
    persist: bool = True
    generation: Generation | None = None  # None: not checked (the store could not be asked)
    # The message's id, when the caller records its facts itself (a RecordFacts naming it, with
    # no queue id); None: the store picks one.
    message_id: str | None = None
    # When the extraction worker may take the message: later than `at` when its facts come in a
    # RecordFacts of their own, so the queue only backs that write up (a crash before it). None: at once.
    extract_from: datetime | None = None
    # False when extraction mines no message of the user's role (extraction.from_roles): it is not queued.
    queued: bool = True
    vector: ItemVector | None = None


@dataclass(frozen=True)
class RecordToolCalls:
    """A step answered with tool calls: remember the ids (to recognise the next step)."""

    scope: Scope
    turn_key: str
    calls: tuple[tuple[str, str, str], ...]  # (id, name, arguments)
    at: datetime
    generation: Generation | None = None
    # Tools mode: the step's memory rounds and its last round's output, as the provider saw them
    # (JSON); the next step puts them back in place of the answer the client echoes. Not redacted:
    # the provider must get the same bytes again (docs/security.md says why). With them, the
    # step's memory calls as the turn's trace will show them (redacted): one text to the store.
    exchange: str | None = None


@dataclass(frozen=True)
class RecordResponse:
    """A response id relayed on the Responses wire, with its turn, conversation and parent:
    a later request naming it in `previous_response_id` continues that chain."""

    scope: Scope
    response_id: str
    turn_key: str
    conversation_id: str
    parent_id: str | None
    at: datetime
    # Tools mode: the provider's id of the last round, when the client saw the first round's id:
    # what the provider continues from when a request names `response_id`.
    provider_id: str | None = None


@dataclass(frozen=True)
class FinishTurn:
    """The step with the final answer: save it (once per answer text) and the trace."""

    scope: Scope
    turn_key: str
    conversation_id: str
    answer: str
    at: datetime
    task: str = ""
    steps: tuple[ReasoningStep, ...] = ()
    # text_hash of the answer as the client received it, before redaction: the client
    # sends that text back, and the conversation is found by it (docs/scopes.md).
    answer_hash: str | None = None
    generation: Generation | None = None
    queued: bool = True  # False when extraction mines no assistant message (extraction.from_roles)
    vector: ItemVector | None = None  # the answer's


@dataclass(frozen=True)
class SetTurnStatus:
    """A turn ended some other way (upstream error, cut stream, client gone)."""

    scope: Scope
    turn_key: str
    status: TurnStatus
    at: datetime
    generation: Generation | None = None


@dataclass(frozen=True)
class SaveBlock:
    """Cache the turn's memory block (reused byte for byte by its later steps) and log it.

    A block computed at a later generation replaces one cached before a deletion.
    """

    scope: Scope
    turn_key: str
    block: str
    injected: int
    log: dict[str, Any] = field(default_factory=dict)
    at: datetime | None = None
    generation: Generation | None = None
    prompt: str | None = None  # a hook's updated_prompt, cached with the block
    context: str | None = None  # the hooks' additional_context (already in `block`), kept for a block computed again


@dataclass(frozen=True)
class SaveHookStart:
    """Keep what a turn's start hooks gave (its updated prompt, their context) when its first step
    computed no block (retrieval degraded): the hooks never run again for the turn, so its later
    steps and retries take these from the store, and still compute the block themselves.

    A turn whose block is cached already holds them (SaveBlock); a deletion after the turn began
    skips it, as it does SaveBlock.
    """

    scope: Scope
    turn_key: str
    prompt: str | None
    context: str | None
    at: datetime
    generation: Generation | None = None


@dataclass(frozen=True)
class EntityFact:
    """An entity found in a message (merged by canonical name per user)."""

    name: str
    type: str
    description: str = ""
    confidence: float = 0.7


@dataclass(frozen=True)
class RelationFact:
    """A relationship found in a message, between entity names of the same extraction.

    `single_valued` types (WORKS_AT, LIVES_IN, ...) invalidate the current edge of the same
    from-entity and type when the target differs, instead of deleting it: the past stays known.
    """

    from_name: str
    type: str
    to_name: str
    single_valued: bool = False


@dataclass(frozen=True)
class RecordFacts:
    """Apply one message's extraction and take it off the queue, in one transaction.

    `user_node` names the user's own node ("User" until the user states a name; then the
    node is renamed and keeps its edges). First-person facts use that name as from_name.
    `user_alias` is a name the user asks to be called: an alias of the node once it has a
    stated name, the node's name until then.
    """

    scope: Scope
    queue_id: int | None  # None: the facts were extracted as the message was saved; dequeued by message id
    message_id: str
    entities: tuple[EntityFact, ...]
    relationships: tuple[RelationFact, ...]
    at: datetime
    user_node: str | None = None
    user_alias: str | None = None


@dataclass(frozen=True)
class ExtractionFailed:
    """An extraction attempt failed: retry at `retry_at`, or park the item with its error."""

    scope: Scope
    queue_id: int
    error: str
    retry_at: datetime
    park: bool = False


ERROR_MAX_CHARS = 1000  # a failed extraction's error is kept cut to this


TAGS_MAX = 10  # a memory holds at most this many tags (the API's limit), however many writes merged into it
MEMORY_TYPES = frozenset({"fact", "pattern", "user_preference", "interaction"})  # what a StoreMemory may be


@dataclass(frozen=True)
class StoreMemory:
    """A memory stored explicitly (memory API or the store_memory tool).

    fact / pattern / user_preference become an entity of the user (found by long-term);
    interaction becomes an assistant message in `conversation_id` (tools mode: the turn's),
    else in the user's latest conversation.
    """

    scope: Scope
    memory_id: str
    content: str
    memory_type: str
    at: datetime
    confidence: float = 0.7
    tags: tuple[str, ...] = ()
    conversation_id: str | None = None
    # Written by a turn (the store_memory tool): the turn's generation, so a deletion after the
    # turn began takes it too. None from the memory API: a write after a deletion is a new one.
    generation: Generation | None = None
    # Where it was stored from, shown with the memory (the inspector): `memory_api`, `tools`
    # (tools mode's store_memory) or `mcp`. An entity keeps the first it got.
    stored_via: str = "memory_api"


@dataclass(frozen=True)
class QueueHookContext:
    """Context a `stop` hook left for the conversation's next turn (the oldest go past HOOK_CONTEXT_KEEP).

    Written by the turn, so it carries the turn's generation: a deletion after the turn began
    takes it too.
    """

    scope: Scope
    conversation_id: str
    text: str
    at: datetime
    generation: Generation | None = None


@dataclass(frozen=True)
class DropHookContext:
    """The conversation's queued hook context up to `upto_seq` was given to a turn: it goes."""

    scope: Scope
    conversation_id: str
    upto_seq: int


HOOK_CONTEXT_KEEP = 20  # queued hook context per conversation; the oldest go first

WriteOp = Union[StartTurn, RecordToolCalls, FinishTurn, SetTurnStatus, SaveBlock, SaveHookStart, RecordFacts,
                ExtractionFailed, StoreMemory, RecordResponse, QueueHookContext, DropHookContext]
# The writes of a turn: each carries the generation the turn began at (stores/generations.py).
TurnOp = Union[StartTurn, RecordToolCalls, FinishTurn, SetTurnStatus, SaveBlock, SaveHookStart, QueueHookContext,
               StoreMemory]
TURN_OPS = (StartTurn, RecordToolCalls, FinishTurn, SetTurnStatus, SaveBlock, SaveHookStart, QueueHookContext,
            StoreMemory)


@dataclass(frozen=True)
class FoundTurn:
    """What a request's turn lookup found: the stored turn, if any, and the user's generation now.

    The turn's cached block is left out (None) when a deletion came after it was computed.
    """

    turn: Turn | None
    generation: int

RESPONSE_CHAIN_MAX = 500  # responses followed back from a named one (a chain is one per step)


@dataclass(frozen=True)
class ResponseChain:
    """A recorded response id: its conversation and the saved messages of the chain up to it."""

    conversation_id: str
    shown: tuple[str, ...]


# --- embeddings: filled in the background, searched through an in-process cache

EmbeddingKind = Literal["message", "entity", "reasoning"]
EMBEDDING_KINDS: tuple[EmbeddingKind, ...] = ("message", "entity", "reasoning")


@dataclass(frozen=True)
class Unembedded:
    """An item lacking a vector for the model: what to embed (`text`), and where it lives.

    `text` is the store's embedding text of the item (a message's content, an entity's name
    and description, a trace's task and answer), cut at the store's limit; `group` is the
    conversation of a message or trace. `seq` orders items of a kind (a cursor for paging).
    """

    scope: Scope
    kind: EmbeddingKind
    item_id: str
    seq: int
    text: str
    group: str | None = None


@dataclass(frozen=True)
class NewEmbedding:
    """A computed vector, saved only while its item still reads `text` (else it is stale)."""

    user: str
    kind: EmbeddingKind
    item_id: str
    text: str
    vector: bytes  # float32, little-endian


@dataclass(frozen=True)
class StoredVector:
    """One saved vector with what the sources filter by: a message's conversation, the agent."""

    item_id: str
    group: str | None
    agent: str | None
    vector: bytes  # float32, little-endian
    seq: int = 0  # the vector row's place in the store's order of saves (see VectorMark)


@dataclass(frozen=True)
class VectorMark:
    """The newest saved vector of a user's kind: its row's seq and when it was saved.

    Cheap to read (one index probe): a cache holding the vectors up to this mark is
    current; a higher seq means vectors were saved since (read those after the cached
    seq); the same seq saved at another time means a row was replaced (read all again).
    That holds because seqs only rise: a store never numbers a row at or below one it
    numbered before, even once that row is deleted (SQLite's AUTOINCREMENT, PostgreSQL's
    identity column), and one user's rows commit in the order of their seqs (SQLite's one
    writer, PostgreSQL's per-user lock).
    """

    seq: int
    saved_at: float


@dataclass(frozen=True)
class QueuedMessage:
    """A saved message waiting for extraction, with the scope it belongs to."""

    queue_id: int
    scope: Scope
    message: StoredMessage
    attempts: int


# --- the memory API's lists, paged by key ------------------------------------------------

PageList = Literal["entities", "messages", "conversations", "reasoning"]
# An item's place in its list: the parts it is sorted by, only numbers and ids, so a list
# cursor can carry it. A page after a key starts just past that place, item there or not.
PageKey = tuple[int | float | str, ...]
# What each list's key is made of, in sort order. `seq` is the row's insertion number, `id`
# its id, `time` the list's time exactly as the store keeps it (SQLite: unix seconds, a
# float; PostgreSQL: microseconds since the epoch, an integer).
PAGE_KEY_PARTS: dict[PageList, tuple[str, ...]] = {
    "entities": ("seq",),  # oldest first
    "messages": ("time", "seq"),  # created_at, oldest first
    "conversations": ("time", "id"),  # last_active_at, most recent first
    "reasoning": ("time", "seq"),  # created_at, newest first
}


# --- index terms: made again by `memproxy reindex --terms` when the tokeniser changes

TermsTable = Literal["messages", "entities", "reasoning"]
TERMS_TABLES: tuple[TermsTable, ...] = ("messages", "entities", "reasoning")


@dataclass(frozen=True)
class ReindexedPage:
    """One batch of `Store.reindex_terms`: rows read, rows whose terms were rewritten, and the key
    the next batch starts after (None once the table is done)."""

    read: int
    rewritten: int
    after: tuple[Any, ...] | None


# --- the protocols, one a role: a caller names the one it needs -----------------------

ItemKind = Literal["memory", "message", "entity", "relationship", "conversation"]  # what the memory API deletes


class Lifecycle(Protocol):
    """Opening and closing the database, and the health check."""

    async def open(self) -> None:
        """Connect, migrate the schema, mark turns left pending by a crash as interrupted."""

    async def close(self) -> None:
        """Flush and release connections."""

    async def ping(self) -> bool:
        """True when the database answers a trivial query."""

    def searched_in_memory(self) -> dict[str, int]:
        """Per index, the users whose searches it answers from memory (SQLite's postings); {} when
        the store keeps none in memory."""


class Writes(Protocol):
    """Every write: plain data applied in batches (the writer task, memory/writer.py)."""

    async def apply(self, ops: Sequence[WriteOp]) -> None:
        """Apply a batch of writes in one transaction; raise StoreError on failure."""


class TurnReads(Protocol):
    """Turn and conversation identity: which turn and conversation a request belongs to (memory/turns.py)."""

    async def find_turn(self, scope: Scope, call_ids: Sequence[str], history_hash: str, since: datetime,
                        previous_response: str | None = None) -> FoundTurn:
        """The user's generation, and the turn a request belongs to, in one read.

        The turn is one whose earlier step's response carried one of `call_ids`, else the
        latest started at or after `since` whose history hashed the same, else None. Of the
        turns that carried those ids (a provider numbering its calls per response, `call_0`,
        reuses them across the user's turns and conversations), the one the request continues
        wins: the turn of `previous_response` (a recorded response id), else the one whose
        history hashed the same, else the newest.
        """

    async def response_chain(self, scope: Scope, response_id: str) -> ResponseChain | None:
        """The conversation of a recorded response id and its chain's messages; None if unknown."""

    async def provider_response(self, scope: Scope, conversation_id: str, response_id: str) -> str | None:
        """The provider's own id recorded for a response id the client saw in the conversation (tools mode),
        if any."""

    async def memory_exchanges(self, scope: Scope, turn_key: str, call_ids: Sequence[str]) -> dict[str, str]:
        """call id -> the memory exchange the turn recorded with it (tools mode), for those of `call_ids`
        that have one. Only the turn's own: a provider numbering its calls per response (`call_0`)
        reuses ids across the user's conversations."""

    async def conversation_by_assistant_hashes(self, scope: Scope, hashes: Sequence[str]) -> str | None:
        """The conversation holding the first of `hashes` (newest first) that was saved.

        When several conversations hold that text, the most recently active one wins.
        """

    async def hook_context(self, scope: Scope, conversation_id: str) -> list[tuple[int, str]]:
        """The conversation's queued hook context, oldest first, as (seq, text)."""

    async def latest_conversation(self, scope: Scope) -> str | None:
        """The user's most recently active conversation."""

    async def messages(self, scope: Scope, conversation_id: str, *, limit: int = 100) -> list[StoredMessage]:
        """The first `limit` messages of one conversation, oldest first."""

    async def turn(self, scope: Scope, turn_key: str) -> Turn | None:
        """One turn by key."""


class RecallReads(Protocol):
    """What retrieval reads (memory/retrieval/retriever.py and memory/retrieval/sources/), and what the store says it can do."""

    # True when a text search matches a row holding any one of its terms (they are OR'ed):
    # then a keyword retry with some of the query's words cannot find what the full query
    # did not, and retrieval skips it.
    matches_any_term: bool

    @property
    def answered_at(self) -> float:
        """time.monotonic() when the store last answered a read on its own (-inf: it does not say):
        a store that is answering, only slowly, is not down."""

    # `terms` come from proxy.terms.query_terms; scores are higher-is-better
    async def search_messages(self, scope: Scope, terms: Sequence[str], *,
                              conversation_ids: Sequence[str] | None = None,
                              exclude_conversation_id: str | None = None,
                              limit: int = 20) -> list[tuple[StoredMessage, float]]:
        """BM25 over the user's messages (the user's own statistics), best first."""

    async def search_entities(self, scope: Scope, terms: Sequence[str], *, limit: int = 20
                              ) -> list[tuple[Entity, float]]:
        """BM25 over the user's entities (name, type, description), best first."""

    async def search_reasoning(self, scope: Scope, terms: Sequence[str], *, limit: int = 20
                               ) -> list[tuple[ReasoningTrace, float]]:
        """BM25 over the user's reasoning traces (task, steps, answer), best first."""

    async def recent_conversations(self, scope: Scope, limit: int | None) -> list[str]:
        """Ids of the user's conversations, most recently active first (all when None)."""

    async def relationships(self, scope: Scope, entity_id: str, *, current_only: bool = True,
                            limit: int | None = None) -> list[Relationship]:
        """Edges from or to one entity, the newest fact first (the `limit` newest when given)."""

    async def user_node(self, scope: Scope) -> Entity | None:
        """The entity standing for the user (type `user`, the first made), if extraction has made one."""

    async def neighbours(self, scope: Scope, message_ids: Sequence[str]
                         ) -> dict[str, tuple[StoredMessage | None, StoredMessage | None]]:
        """For each of these messages that has one, the message just before it and the one just after it
        in its conversation (None for a side it has not)."""

    async def vectors(self, scope: Scope, kind: EmbeddingKind, model: str, *, after: int = 0,
                      newest: int | None = None) -> list[StoredVector]:
        """Every vector of the user for this kind and model saved after row seq `after`, each agent's
        (the caller filters), by seq. `newest`: the newest seq the caller knows of, a hint of how
        many rows there are (a narrow range is read without a hand-off to a thread)."""

    async def vector_marks(self, scope: Scope, model: str) -> dict[EmbeddingKind, VectorMark]:
        """The user's newest vector of each kind for `model` (a kind with none is absent)."""

    async def embedded_items(self, scope: Scope, kind: EmbeddingKind, item_ids: Sequence[str], model: str
                             ) -> list[Any]:
        """The items among `item_ids` that still hold a vector for `model`, as the searches return them
        (StoredMessage, Entity or ReasoningTrace), filtered by the scope's agent as the searches are."""


class ExtractionQueue(Protocol):
    """The extraction queue: every user's items, read by the background worker (not a request)."""

    async def claim_extraction(self, limit: int, now: datetime, *, max_chars: int | None = None
                               ) -> list[QueuedMessage]:
        """Unparked items due at `now`, oldest first, text cut at `max_chars`; the scope's agent is the message's."""

    async def release_extraction(self, queue_ids: Sequence[int]) -> None:
        """Hand back claimed items whose results could not be queued for writing (the write queue
        was full), so they come due again at once, ahead of their users' later items."""

    async def queue_depth(self) -> dict[str, int]:
        """Extraction items `pending` (retries waiting included) and `parked` (given up on)."""


class EmbeddingQueue(Protocol):
    """Items lacking a vector, filled by the background worker and `memproxy reindex`."""

    async def unembedded(self, model: str, kind: EmbeddingKind, *, after: int = 0, limit: int = 64,
                         user: str | None = None, upto: int | None = None) -> list[Unembedded]:
        """Items of `kind` (every user's, or `user`'s) with `seq` above `after` (and at most `upto`) and
        no vector for `model`, by seq."""

    async def save_embeddings(self, model: str, vectors: Sequence[NewEmbedding]) -> int:
        """Save vectors (replacing the model's old ones) whose items still read their `text`; how many were saved."""

    async def newest_seqs(self) -> dict[EmbeddingKind, int]:
        """The highest item seq of each kind, every user's (0 for none): one index probe each."""


class Admin(Protocol):
    """The memory API, export and import, and the command line's maintenance."""

    def export(self, scope: Scope) -> AsyncIterator[dict[str, Any]]:
        """Every exportable record of the user as the export's JSON Lines objects."""

    async def entities(self, scope: Scope) -> list[Entity]:
        """The user's entities."""

    async def reasoning(self, scope: Scope, *, limit: int = 100) -> list[ReasoningTrace]:
        """Reasoning traces of the user (of the agent when agent-isolated), newest first."""

    async def reindex_terms(self, table: TermsTable, *, after: tuple[Any, ...] | None = None, limit: int = 500,
                            user: str | None = None) -> ReindexedPage:
        """Make the index terms of the next `limit` rows of `table` (every user's, or `user`'s) after the key
        `after` again with the current tokeniser, in one transaction; rows already current are not written
        (`memproxy reindex --terms`, stores/reindex_terms.py)."""

    # pages of up to `limit` items, each with its PageKey, from just past `after`
    async def entity_page(self, scope: Scope, *, limit: int = 100,
                          after: PageKey | None = None) -> list[tuple[PageKey, dict[str, Any]]]:
        """The user's entities as `entity` export records, oldest first."""

    async def conversation_page(self, scope: Scope, *, limit: int = 100,
                                after: PageKey | None = None) -> list[tuple[PageKey, dict[str, Any]]]:
        """The user's conversations, most recently active first: id, agent_id, created_at,
        last_active_at, message_count."""

    async def message_page(self, scope: Scope, conversation_id: str, *, limit: int = 100,
                           after: PageKey | None = None) -> list[tuple[PageKey, StoredMessage]]:
        """Messages of one conversation, oldest first."""

    async def reasoning_page(self, scope: Scope, *, limit: int = 100,
                             after: PageKey | None = None) -> list[tuple[PageKey, dict[str, Any]]]:
        """Reasoning traces as `reasoning` export records, newest first."""

    async def page_key(self, scope: Scope, listing: PageList, item_id: str) -> PageKey | None:
        """The key of the user's item `item_id` in a list, None when the user has no such item."""

    async def entity_record(self, scope: Scope, entity_id: str) -> dict[str, Any] | None:
        """One entity as an `entity` export record."""

    async def message_record(self, scope: Scope, message_id: str) -> dict[str, Any] | None:
        """One message as a `message` export record."""

    async def conversation_record(self, scope: Scope, conversation_id: str) -> dict[str, Any] | None:
        """One conversation as a `conversation` export record."""

    async def injections(self, scope: Scope, *, limit: int = 20) -> list[dict[str, Any]]:
        """The injection log of the user's latest turns, newest first: turn_id, conversation_id, created_at,
        injected, log."""

    async def store_memory(self, op: StoreMemory) -> str:
        """Apply one StoreMemory now; the id of the entity or message that holds it (a merge keeps the old id)."""

    async def update_memory(self, scope: Scope, memory_id: str, content: str) -> str | None:
        """Correct an entity (its description, or its name when it has none) or a message.

        Returns "entity" or "message", "conflict" when the new name is another entity's, None when not found.
        """

    async def delete_item(self, scope: Scope, kind: ItemKind, item_id: str) -> dict[str, int] | None:
        """Delete a memory, message, entity, relationship or conversation and what depends on it.

        Returns the rows deleted per table, or None when the user has no such item.
        """

    async def delete_user(self, scope: Scope) -> dict[str, int]:
        """Delete every row of the user, then purge the deleted text from indexes and logs; rows per table."""

    async def import_records(self, scope: Scope, records: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
        """Add records (validated by proxy.api.jsonl) to the user, skipping ids it has: imported/skipped per kind."""


class ProviderObjects(Protocol):
    """Which user created each provider object (a response, a conversation, a file) memproxy saw
    created with its own provider key: several users share that key, so the provider would
    answer any of them (endpoint/ownership.py)."""

    async def record_owners(self, provider: str, user: str, objects: Sequence[tuple[str, str]], at: datetime
                            ) -> dict[str, str]:
        """Record `user` as the creator of each object ((kind, id) each, ids distinct) unless a creator is
        recorded already, in one transaction; the creator of each, by id."""

    async def owner_of(self, provider: str, object_id: str) -> str | None:
        """The user recorded as the object's creator, None when memproxy never saw it created."""

    async def owners_of(self, provider: str, object_ids: Sequence[str]) -> dict[str, str]:
        """The user recorded as each object's creator, by id, for those memproxy saw created: a
        read, which neither takes nor waits for a write lock."""


class Store(Lifecycle, Writes, TurnReads, RecallReads, ExtractionQueue, EmbeddingQueue, Admin, ProviderObjects,
            Protocol):
    """A user-scoped memory database (SQLite or PostgreSQL): every role, as the app holds it."""
