"""The embedded store: SQLite in WAL mode, one write connection and a few read connections.

Writes go through `apply` only: each batch is one `BEGIN IMMEDIATE` transaction, run in a
single call on a dedicated write thread that owns the write connection (as datasette
funnels its writes through one thread), so a batch of a thousand ops costs one hop to the
thread, not one per statement. Reads use READERS connections of their own, each on its
own thread (sqlite/readers.py), so a long write never queues a read and retrieval's
sources search side by side. Schema: sqlite/schema.py; rows to models: sqlite/rows.py;
the write ops: sqlite/batch.py; message search: sqlite/search.py.

A file deleted or replaced under the store (sqlite/file.py) is found after each commit
(which then counts as failed, to be applied again to the new file) and by `ping`. From then
on the store is unavailable (reads and writes raise StoreError, so the writer keeps its
queued writes and retries them) while it closes every connection and opens the path again,
on a new file with a new schema when none is there.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

from proxy.extracted import USER_TYPE
from proxy.models import (
    Entity,
    ReasoningTrace,
    Relationship,
    Scope,
    StoredMessage,
    Turn,
)
from proxy.stores.base import (
    RESPONSE_CHAIN_MAX, FoundTurn, QueuedMessage, ResponseChain, StoreError, WriteOp,
)
from proxy.stores.export_records import EXPORT_PAGE, RELATIONSHIP_SELECT, pages
from proxy.stores.generations import generation_key
from proxy.stores.sqlite.admin import SQLiteAdmin
from proxy.stores.sqlite.batch import apply_batch, recover, transaction
from proxy.stores.sqlite.checkpoint import (
    CHECKPOINT_EVERY_S,
    WAL_TRUNCATE_BYTES,
    Checkpointer,
)
from proxy.stores.sqlite.entity_index import EntityIndexes
from proxy.stores.sqlite.file import FileChanged, OpenedFiles
from proxy.stores.sqlite.message_index import MessageIndexes
from proxy.stores.sqlite.owners import SQLiteProviderObjects
from proxy.stores.sqlite.postings_cache import PostingsCache
from proxy.stores.sqlite.processes import deregister, new_process_id, register
from proxy.stores.sqlite.queue import anything_due, claim, release, release_all
from proxy.stores.sqlite.readers import ReadPool, answer
from proxy.stores.sqlite.rows import (
    EXPORT,
    agent_clause,
    clean_text,
    entity_from_row,
    message_from_row,
    relationship_from_row,
    to_ts,
    trace_from_row,
    turn_from_row,
)
from proxy.stores.sqlite.schema import migrate
from proxy.stores.sqlite.search import (
    ENTITIES,
    ENTITY_WEIGHTS,
    MESSAGE_WEIGHTS,
    MESSAGES,
    REASONING,
    PostingsNotReady,
)
from proxy.stores.search_budget import SMALL_INDEX_ROWS
from proxy.stores.sqlite.search import search_entities as search_entity_index
from proxy.stores.sqlite.search import search_messages as search_message_index
from proxy.stores.sqlite.search import search_reasoning as search_reasoning_index
from proxy.stores.sqlite.user_stats import UserCounts
from proxy.stores.sqlite.vectors import SQLiteVectors

T = TypeVar("T")

log = logging.getLogger("memproxy.store")

BUSY_TIMEOUT_MS = 5000
# Per connection. SQLite's default 2 MiB makes index inserts miss the cache once a user
# holds ~100k messages, which tripled the cost of a write batch.
CACHE_KIB = 32768
# Read connections (and threads) for retrieval's sources. Measured on two cores at c=1
# (10k memories, paired runs): two readers beat three by 0.35-0.45 ms p50 and one by 0.7 ms.
# A thread more than the cores can run only adds contention for the GIL.
READERS = 2
# A lookup by at most this many keys (a request's assistant texts) runs on the event loop's
# connection (sqlite/readers.py); a longer one goes to a reader thread.
LOOKUP_MAX_KEYS = 64
_SYNCHRONOUS = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
# Once the file was found deleted or replaced, the path is opened again at once, then after
# this long, doubling up to REOPEN_MAX_S: its directory may be gone until someone makes it again.
REOPEN_FIRST_S = 0.05
REOPEN_MAX_S = 5.0


# Errors no retry can fix: the write itself is wrong. Locked, full or I/O errors are
# OperationalError and are retried.
_INVALID_WRITE = (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError, sqlite3.DataError,
                  TypeError, ValueError)


def _reason(exc: BaseException) -> str:
    code = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    return f"{code}: {exc}"


_TURN_COLUMNS = ("t.turn_key, t.conversation_id, t.status, t.created_at, t.block, t.injected, t.prompt,"
                 " t.hook_context")


def _current_turn(row: sqlite3.Row) -> Turn:
    """A found turn, its cached block left out when a deletion came after it was computed."""
    turn = turn_from_row(row)
    return turn if row["block_current"] else replace(turn, block=None, injected=0)


def _wal_mode(conn: sqlite3.Connection) -> None:
    """WAL mode, waiting for another process opening the file at the same moment (worker
    processes start together): SQLite answers that pragma SQLITE_BUSY at once, without its
    busy handler, while another connection recovers or converts the file."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class SQLiteStore(SQLiteAdmin, SQLiteVectors, SQLiteProviderObjects):
    """The Store protocol on one SQLite file (the memory API's operations: sqlite/admin.py; embeddings:
    sqlite/vectors.py)."""

    # A row holding any one of the search terms matches (the terms are OR'ed), so a keyword
    # retry with some of the query's words cannot find more than the full query did.
    matches_any_term = True
    # A lookup by index runs on the event loop's own connection (`_lookup`): it never waits.
    lookups_on_loop = True

    def __init__(self, path: str, *, synchronous: str = "NORMAL", search_cache_mb: int = 256,
                 checkpoint_every_s: float = CHECKPOINT_EVERY_S, wal_truncate_bytes: int = WAL_TRUNCATE_BYTES,
                 on_file_lost: Callable[[], None] | None = None) -> None:
        """`on_file_lost` is called each time the file is found deleted or replaced under the store."""
        if synchronous.upper() not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {sorted(_SYNCHRONOUS)}, not {synchronous!r}")
        self._path = path
        self._pragmas = (f"synchronous={synchronous.upper()}", f"busy_timeout={BUSY_TIMEOUT_MS}", "foreign_keys=ON",
                         "secure_delete=ON", f"cache_size=-{CACHE_KIB}")
        self._write_thread: ThreadPoolExecutor | None = None
        self._writer: sqlite3.Connection | None = None  # used on the write thread only
        self._files: OpenedFiles | None = None  # what the connections have open, set on the write thread
        self._readers: ReadPool | None = None
        self._loop_search = asyncio.Lock()  # _search: one postings search on the event loop at a time
        self._checkpointer: Checkpointer | None = None
        self._checkpoint_every_s = checkpoint_every_s
        self._wal_truncate_bytes = wal_truncate_bytes
        self._search_cache_bytes = search_cache_mb << 20
        self._on_file_lost = on_file_lost
        self._lost: str | None = None  # why the store is unavailable while it opens its path again
        self._reopening: asyncio.Task[None] | None = None
        # This process among those with the file open (sqlite/processes.py), and the claimant of
        # the extraction leases it takes (sqlite/queue.py).
        self._claimant = new_process_id()
        self._fresh_search_state()

    def _fresh_search_state(self) -> None:
        """Counts and postings built from the file's rows: none of it holds for another file."""
        # The user's own BM25 statistics, where no postings answer.
        self._message_counts = UserCounts(MESSAGES, SMALL_INDEX_ROWS)
        self._entity_counts = UserCounts(ENTITIES, SMALL_INDEX_ROWS)
        self._reasoning_counts = UserCounts(REASONING, SMALL_INDEX_ROWS)
        self._message_indexes = MessageIndexes(self._path, self._pragmas, self._search_cache_bytes, MESSAGE_WEIGHTS)
        self._entity_indexes = EntityIndexes(self._path, self._pragmas, self._search_cache_bytes, ENTITY_WEIGHTS)

    @property
    def message_indexes(self) -> MessageIndexes:
        """The in-memory postings that answer message searches (sqlite/message_index.py)."""
        return self._message_indexes

    @property
    def entity_indexes(self) -> EntityIndexes:
        """The in-memory postings that answer entity searches (sqlite/entity_index.py)."""
        return self._entity_indexes

    # --- lifecycle

    async def open(self) -> None:
        """Connect, migrate the schema, mark turns left pending by a crash as interrupted."""
        if self._writer is not None:
            return
        self._write_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memproxy-sqlite-writer")
        try:
            await self._connect()
        except sqlite3.Error as exc:
            await self.close()
            raise StoreError(f"cannot open {self._path}: {_reason(exc)}") from exc

    async def _connect(self) -> None:
        """Open the write connection, the readers and the checkpointer on the path."""
        self._writer = await asyncio.get_running_loop().run_in_executor(self._write_thread, self._open_writer)
        self._readers = ReadPool(self._path, self._pragmas, READERS)
        self._loop_search = asyncio.Lock()  # of this event loop
        await self._readers.run(lambda conn: conn.execute("SELECT 1").fetchall())
        self._checkpointer = Checkpointer(self._path, self._pragmas, self._checkpoint_every_s,
                                          self._wal_truncate_bytes)
        self._checkpointer.start()

    def _open_writer(self) -> sqlite3.Connection:
        """The write connection, on the write thread: WAL, schema, crash recovery, the files' identity."""
        conn = sqlite3.connect(self._path, isolation_level=None)
        try:
            for pragma in self._pragmas:
                conn.execute(f"PRAGMA {pragma}")
            _wal_mode(conn)
            conn.execute("PRAGMA wal_autocheckpoint=0")  # the Checkpointer's thread does it
            migrate(conn)
            transaction(conn, lambda: recover(conn, register(conn, self._claimant, time.time())))
            self._files = OpenedFiles(self._path)  # once WAL mode has made the WAL and its index
        except BaseException:
            conn.close()
            raise
        return conn

    async def close(self) -> None:
        """Finish queued reads and writes and release every connection."""
        reopening, self._reopening = self._reopening, None
        if reopening is not None:
            reopening.cancel()
            await asyncio.gather(reopening, return_exceptions=True)
        if self._writer is not None and self._lost is None:
            try:  # its extraction items are due again at once, for whichever process goes on
                await self._on_writer(self._leave)
            except StoreError as exc:  # the next process to open the file finds this one gone
                log.warning("store %s: cannot record this process leaving the file (%s)", self._path, exc)
        self._lost = None
        await self._release()
        thread, self._write_thread = self._write_thread, None
        if thread is not None:
            thread.shutdown(wait=False)

    def _leave(self, conn: sqlite3.Connection) -> None:
        """On the write thread: this process closes the file, handing back its extraction items."""
        release_all(conn, self._claimant)
        deregister(conn, self._claimant)

    async def _release(self) -> None:
        """Close every connection, after the reads and writes queued on them (the write thread stays)."""
        loop = asyncio.get_running_loop()
        readers, writer, checkpointer = self._readers, self._writer, self._checkpointer
        self._readers, self._writer, self._checkpointer, self._files = None, None, None, None
        if checkpointer is not None:
            await loop.run_in_executor(None, checkpointer.stop)
        if readers is not None:
            try:
                await readers.close()
            except sqlite3.Error:
                pass  # closing a broken connection: nothing left to flush
        for indexes in (self._message_indexes, self._entity_indexes):
            await loop.run_in_executor(None, indexes.close)
        if writer is not None and self._write_thread is not None:
            # Queued behind any batch still running, so that batch commits first.
            await loop.run_in_executor(self._write_thread, writer.close)

    # --- the file deleted or replaced under the store

    def _file_lost(self, why: str) -> None:
        """Stop using connections to a file gone from the path, and open the path again."""
        if self._lost is not None:
            return
        self._lost = why
        log.error("store %s: %s while open; opening the path again (a new, empty database when no file is"
                  " there). Writes not yet committed wait and land there; what the old file held is gone",
                  self._path, why)
        if self._on_file_lost is not None:
            self._on_file_lost()
        self._reopening = asyncio.get_running_loop().create_task(self._reopen(), name="memproxy-sqlite-reopen")

    async def _reopen(self) -> None:
        # Every connection to the old file is closed before the path is opened: the last one
        # to close removes the WAL and its index by name, which must not be the new file's.
        delay, failure, files = REOPEN_FIRST_S, "", self._files
        while True:
            await self._release()
            if files is not None:
                if removed := files.remove_left_behind():
                    log.warning("store %s: removed %s, left behind by the file that is gone", self._path,
                                " and ".join(removed))
                files = None
            self._fresh_search_state()
            try:
                await self._connect()
                break
            except (sqlite3.Error, OSError) as exc:
                if _reason(exc) != failure:  # logged once per reason, not once per attempt
                    failure = _reason(exc)
                    log.error("store %s: cannot open it again (%s); retrying, every %.0f s at most",
                              self._path, failure, REOPEN_MAX_S)
            await asyncio.sleep(delay)
            delay = min(delay * 2, REOPEN_MAX_S)
        self._lost = None
        log.warning("store %s: open again, memory on", self._path)

    async def _on_write_thread(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work(write connection)` on the write thread; a commit into a file gone from the path is a failure."""
        if self._lost is not None:
            raise StoreError(f"store unavailable: {self._lost}")
        thread = self._write_thread
        if thread is None or self._writer is None:
            raise StoreError("store is not open")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def call() -> None:
            if not done.cancelled():  # else the caller gave up before the thread came to it
                answer(loop, done, lambda: self._checked(work))
        thread.submit(call)
        try:
            return await done
        except FileChanged as exc:
            self._file_lost(str(exc))
            raise StoreError(f"store unavailable: {exc}") from exc

    def _checked(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """On the write thread: `work`, then a look at the files before it counts as done."""
        writer, files = self._writer, self._files
        if writer is None or files is None:
            raise StoreError("store is not open")
        try:
            result = work(writer)
        except sqlite3.Error:
            files.check()  # the error may be the deletion's doing (I/O errors on a deleted WAL)
            raise
        # Gone before or while `work` ran, the file took its commit along: the error has the
        # caller apply it again, to the file the path holds once opened again. One look
        # after, not one before as well: the answer's commit, which a response waits for,
        # pays for each (three stat calls).
        files.check()
        return result

    def searched_in_memory(self) -> dict[str, int]:
        return {"messages": self._message_indexes.users, "entities": self._entity_indexes.users}

    async def ping(self) -> bool:
        """True when the database answers a trivial query from the file at its path."""
        if self._lost is not None:
            return False
        if self._files is not None and (change := self._files.change()) is not None:
            self._file_lost(change)  # found here when no write came since
            return False
        try:
            rows = await self._rows("SELECT 1", [])
            return bool(rows[0][0] == 1)
        except StoreError:
            return False

    # --- writes

    async def apply(self, ops: Sequence[WriteOp]) -> None:
        """Apply a batch of writes in one transaction; raise StoreError on failure.

        The batch runs as one call on the write thread: a caller cancelled meanwhile does
        not stop it, so it commits or rolls back whole.
        """
        if not ops:
            return
        batch = list(ops)
        try:
            await self._on_write_thread(lambda conn: apply_batch(conn, batch))
        except _INVALID_WRITE as exc:
            raise StoreError(_reason(exc), transient=False) from exc
        except sqlite3.Error as exc:
            raise StoreError(_reason(exc)) from exc

    # --- reads

    @property
    def answered_at(self) -> float:
        """time.monotonic() of the last read the store answered: the circuit breaker tells by it a
        store that answers nobody from a proxy too busy to take the answers in."""
        readers = self._readers
        return readers.answered_at if readers is not None else float("-inf")

    async def _read(self, work: Callable[[sqlite3.Connection], T], *, here: bool = False) -> T:
        """`work(connection)` on a read connection (`here`: the event loop's, for a lookup of a few
        rows by an index, sqlite/readers.py); StoreError when SQLite fails or the store is closed."""
        readers = self._readers
        if self._lost is not None:
            raise StoreError(f"store unavailable: {self._lost}")
        if readers is None:
            raise StoreError("store is not open")
        try:
            return await (readers.run_here(work) if here else readers.run(work))
        except RuntimeError as exc:  # the pool shut down under us: closed meanwhile
            raise StoreError("store is not open") from exc
        except sqlite3.Error as exc:
            # SQLite answers a read of a deleted WAL with I/O errors: then the file is lost.
            if self._files is not None and (change := self._files.change()) is not None:
                self._file_lost(change)
            raise StoreError(_reason(exc)) from exc

    async def _search(self, indexes: PostingsCache, user: str,
                      search: Callable[[sqlite3.Connection, bool], T]) -> T:
        """`search(connection, postings_only)` on the event loop while the user's postings answer it,
        else on a reader thread. A postings search is Python holding the GIL: on a thread it only
        adds a hand-off each way, each of which under load waits for the GIL and the busy loop
        (about 1.7 ms of CPU and more of wall time a recall at 10,000 memories). FTS5 runs in
        SQLite, which releases the GIL: that is what a reader thread is for.

        One search on the loop at a time, and the loop reads its sockets between two: the
        recalls of a burst would otherwise run all their searches in one pass of the loop, and
        other clients' streams would get their events late, in batches."""
        if indexes.enabled and indexes.holds(user):
            async with self._loop_search:
                try:
                    return await self._read(lambda conn: search(conn, True), here=True)
                except PostingsNotReady:
                    pass  # behind, held by a thread, dropped meanwhile, or terms the postings do not hold
                finally:
                    await asyncio.sleep(0)  # the next search waits for the loop's next pass
        return await self._read(lambda conn: search(conn, False))

    async def _rows(self, sql: str, params: Sequence[Any]) -> list[sqlite3.Row]:
        rows: list[sqlite3.Row] = await self._read(lambda conn: conn.execute(sql, params).fetchall())
        return rows

    async def _lookup(self, sql: str, params: Sequence[Any]) -> list[sqlite3.Row]:
        """`_rows` for a lookup of a few rows by an index, on the event loop's connection."""
        rows: list[sqlite3.Row] = await self._read(lambda conn: conn.execute(sql, params).fetchall(), here=True)
        return rows

    # --- turn and conversation identity

    async def find_turn(self, scope: Scope, call_ids: Sequence[str], history_hash: str, since: datetime,
                        previous_response: str | None = None) -> FoundTurn:
        """The user's generation and the turn the request belongs to, each lookup one statement (one snapshot)."""
        agent, agent_params = agent_clause(scope, "t")
        lookups: list[tuple[str, list[Any]]] = []
        if call_ids:
            # Of the turns that carried these ids, the one the request continues (TurnReads.find_turn).
            lookups.append((
                f"SELECT {_TURN_COLUMNS}, t.block_generation FROM turn_tool_calls c JOIN turns t"
                " ON t.user_id = c.user_id AND t.turn_key = c.turn_key"
                f" WHERE c.user_id = ? AND c.call_id IN (SELECT value FROM json_each(?)){agent}"
                " ORDER BY t.turn_key IS (SELECT turn_key FROM responses WHERE user_id = ? AND response_id = ?) DESC,"
                " t.history_hash = ? DESC, t.created_at DESC, t.seq DESC LIMIT 1",
                [scope.user, json.dumps(list(call_ids)), *agent_params, scope.user, previous_response,
                 history_hash]))
        lookups.append((
            f"SELECT {_TURN_COLUMNS}, t.block_generation FROM turns t WHERE t.user_id = ? AND t.history_hash = ?"
            f" AND t.created_at >= ?{agent} ORDER BY t.created_at DESC, t.seq DESC LIMIT 1",
            [scope.user, history_hash, to_ts(since), *agent_params]))
        key = generation_key(scope.user)

        def find(conn: sqlite3.Connection) -> FoundTurn:
            for lookup, params in lookups:
                row = conn.execute(
                    "SELECT g.generation, t.*, t.block_generation >= g.generation AS block_current FROM"
                    " (SELECT ifnull((SELECT generation FROM generations WHERE id = ?), 0) AS generation) g"
                    f" LEFT JOIN ({lookup}) t ON 1", [key, *params]).fetchone()
                if row["turn_key"] is not None:
                    return FoundTurn(_current_turn(row), row["generation"])
            return FoundTurn(None, row["generation"])

        return await self._read(find, here=True)

    async def provider_response(self, scope: Scope, conversation_id: str, response_id: str) -> str | None:
        """The provider's own id recorded for a response id the client saw in the conversation, if any."""
        rows = await self._rows("SELECT provider_id FROM responses WHERE user_id = ? AND response_id = ?"
                                " AND conversation_id = ?", [scope.user, response_id, conversation_id])
        return rows[0]["provider_id"] if rows else None

    async def memory_exchanges(self, scope: Scope, turn_key: str, call_ids: Sequence[str]) -> dict[str, str]:
        """call id -> the memory exchange the turn recorded with it (tools mode), for those that have one."""
        if not call_ids:
            return {}
        rows = await self._rows(
            "SELECT call_id, exchange FROM turn_tool_calls WHERE user_id = ? AND turn_key = ? AND exchange IS NOT NULL"
            " AND call_id IN (SELECT value FROM json_each(?))", [scope.user, turn_key, json.dumps(list(call_ids))])
        return {row["call_id"]: row["exchange"] for row in rows}

    async def response_chain(self, scope: Scope, response_id: str) -> ResponseChain | None:
        """The conversation of a recorded response id and the messages of its chain's turns."""
        rows = await self._rows(
            "WITH RECURSIVE chain(response_id, parent_id, turn_key, conversation_id, depth) AS ("
            " SELECT response_id, parent_id, turn_key, conversation_id, 0 FROM responses"
            " WHERE user_id = ? AND response_id = ?"
            " UNION ALL SELECT r.response_id, r.parent_id, r.turn_key, r.conversation_id, c.depth + 1"
            " FROM responses r JOIN chain c ON r.user_id = ? AND r.response_id = c.parent_id WHERE c.depth < ?)"
            " SELECT c.depth, c.conversation_id, m.content FROM chain c"
            " LEFT JOIN messages m ON m.user_id = ? AND m.turn_key = c.turn_key ORDER BY c.depth DESC, m.seq",
            [scope.user, clean_text(response_id), scope.user, RESPONSE_CHAIN_MAX, scope.user],
        )
        if not rows:
            return None
        conversation = next(str(row[1]) for row in rows if row[0] == 0)
        return ResponseChain(conversation, tuple(dict.fromkeys(str(row[2]) for row in rows if row[2] is not None)))

    async def turn(self, scope: Scope, turn_key: str) -> Turn | None:
        """One turn by key."""
        agent, agent_params = agent_clause(scope, "t")
        rows = await self._rows(
            f"SELECT {_TURN_COLUMNS} FROM turns t WHERE t.user_id = ? AND t.turn_key = ?{agent}",
            [scope.user, turn_key, *agent_params],
        )
        return turn_from_row(rows[0]) if rows else None

    async def conversation_by_assistant_hashes(self, scope: Scope, hashes: Sequence[str]) -> str | None:
        """The conversation holding the first of `hashes` (newest first) that was saved.

        When several conversations hold that text, the most recently active one wins.
        """
        if not hashes:
            return None
        agent, agent_params = agent_clause(scope, "m")
        read = self._lookup if len(hashes) <= LOOKUP_MAX_KEYS else self._rows
        rows = await read(
            # CROSS JOIN keeps the hashes outside: left to itself the planner scans the user's messages.
            "SELECT m.conversation_id FROM json_each(?) AS h"
            " CROSS JOIN messages m ON m.user_id = ? AND m.content_hash = h.value AND m.role = 'assistant'"
            " JOIN conversations c ON c.user_id = m.user_id AND c.id = m.conversation_id"
            f" WHERE 1{agent} ORDER BY h.key, c.last_active_at DESC, c.id DESC LIMIT 1",
            [json.dumps(list(hashes)), scope.user, *agent_params],
        )
        return rows[0]["conversation_id"] if rows else None

    async def hook_context(self, scope: Scope, conversation_id: str) -> list[tuple[int, str]]:
        """The conversation's queued hook context, oldest first, as (seq, text)."""
        rows = await self._rows("SELECT seq, text FROM hook_context WHERE user_id = ? AND conversation_id = ?"
                                " ORDER BY seq", [scope.user, conversation_id])
        return [(row["seq"], row["text"]) for row in rows]

    async def latest_conversation(self, scope: Scope) -> str | None:
        """The user's most recently active conversation."""
        ids = await self.recent_conversations(scope, 1)
        return ids[0] if ids else None

    async def recent_conversations(self, scope: Scope, limit: int | None) -> list[str]:
        """Ids of the user's conversations, most recently active first (all when None)."""
        agent, agent_params = agent_clause(scope, "c")
        read = self._rows if limit is None else self._lookup
        rows = await read(
            f"SELECT c.id FROM conversations c WHERE c.user_id = ?{agent}"
            " ORDER BY c.last_active_at DESC, c.id DESC LIMIT ?",
            [scope.user, *agent_params, -1 if limit is None else limit],
        )
        return [row["id"] for row in rows]

    # --- reading what was saved

    async def messages(self, scope: Scope, conversation_id: str, *, limit: int = 100) -> list[StoredMessage]:
        """The first `limit` messages of one conversation, oldest first."""
        agent, params = agent_clause(scope, "m")
        rows = await self._rows(
            f"SELECT m.* FROM messages m WHERE m.user_id = ? AND m.conversation_id = ?{agent}"
            " ORDER BY m.created_at, m.seq LIMIT ?",
            [scope.user, conversation_id, *params, limit],
        )
        return [message_from_row(row) for row in rows]

    async def reasoning(self, scope: Scope, *, limit: int = 100) -> list[ReasoningTrace]:
        """Reasoning traces of the user (of the agent when one is set), newest first."""
        agent, agent_params = agent_clause(scope, "x", per_agent=True)
        rows = await self._rows(
            f"SELECT x.* FROM reasoning x WHERE x.user_id = ?{agent} ORDER BY x.created_at DESC, x.seq DESC LIMIT ?",
            [scope.user, *agent_params, limit],
        )
        return [trace_from_row(row) for row in rows]

    async def entities(self, scope: Scope) -> list[Entity]:
        """The user's entities, oldest first."""
        agent, agent_params = agent_clause(scope, "e")
        rows = await self._rows(
            f"SELECT e.* FROM entities e WHERE e.user_id = ?{agent} ORDER BY e.seq", [scope.user, *agent_params]
        )
        return [entity_from_row(row) for row in rows]

    async def relationships(self, scope: Scope, entity_id: str, *, current_only: bool = True,
                            limit: int | None = None) -> list[Relationship]:
        """Edges from or to one entity, the newest fact first (the `limit` newest when given)."""
        agent, agent_params = agent_clause(scope, "edge")
        current = " AND edge.invalid_at IS NULL" if current_only else ""
        n = -1 if limit is None else limit

        def newest(end: str) -> str:
            # The user filter sits innermost (outside, SQLite scanned all the user's edges), and
            # each direction's newest come off its index in order (schema v14), LIMIT rows each.
            return (f"SELECT * FROM (SELECT edge.seq, edge.valid_from FROM relationships edge"
                    f" WHERE edge.user_id = ? AND edge.{end} = ?{current}{agent}"
                    " ORDER BY edge.valid_from DESC, edge.seq DESC LIMIT ?)")

        # UNION: an edge from the entity to itself is one edge. The names are joined to the
        # `limit` chosen only.
        sql = (f"{RELATIONSHIP_SELECT} WHERE r.seq IN (SELECT seq FROM ({newest('from_id')} UNION {newest('to_id')})"
               " ORDER BY valid_from DESC, seq DESC LIMIT ?) ORDER BY r.valid_from DESC, r.seq DESC")
        params = [scope.user, entity_id, *agent_params, n, scope.user, entity_id, *agent_params, n, n]
        # A recall's few newest edges are a lookup by index, read on the event loop; every edge
        # of an entity (the memory API's) is a read of any length, on a reader thread.
        rows = await (self._rows if limit is None else self._lookup)(sql, params)
        return [relationship_from_row(row) for row in rows]

    async def user_node(self, scope: Scope) -> Entity | None:
        """The entity standing for the user (type `user`, the first made), if extraction has made one."""
        agent, agent_params = agent_clause(scope, "e")
        rows = await self._lookup(
            f"SELECT e.* FROM entities e WHERE e.user_id = ? AND e.type = ?{agent} ORDER BY e.seq LIMIT 1",
            [scope.user, USER_TYPE, *agent_params],
        )
        return entity_from_row(rows[0]) if rows else None

    # --- the extraction queue (every user's: the background worker is not a request)

    async def claim_extraction(self, limit: int, now: datetime, *, max_chars: int | None = None
                               ) -> list[QueuedMessage]:
        """Due, unparked items, oldest first, each with its scope and message (text cut at `max_chars`).

        The processes on one file share the queue: the items are leased to this store for
        CLAIM_LEASE, and a user another process holds items of is skipped, so one user's items
        are extracted and applied once, in queue order (sqlite/queue.py)."""
        if not await self._read(lambda conn: anything_due(conn, self._claimant, now)):
            return []
        return await self._on_writer(lambda conn: claim(conn, self._claimant, limit, now, max_chars))

    async def release_extraction(self, queue_ids: Sequence[int]) -> None:
        """End this process's leases on the items: they are due again at once."""
        if queue_ids:
            ids = list(queue_ids)
            await self._on_writer(lambda conn: release(conn, self._claimant, ids))

    async def queue_depth(self) -> dict[str, int]:
        """Items waiting for extraction (`pending`, retries included) and given up on (`parked`)."""
        rows = await self._rows("SELECT parked, count(*) AS n FROM extraction_queue GROUP BY parked", [])
        counts = {bool(row["parked"]): row["n"] for row in rows}
        return {"pending": counts.get(False, 0), "parked": counts.get(True, 0)}

    async def export(self, scope: Scope) -> AsyncIterator[dict[str, Any]]:
        """Every exportable record of the user as the export's JSON Lines objects, in import order."""
        for alias, select, key, shape in EXPORT.tables():
            agent, agent_params = agent_clause(scope, alias)
            columns = ", ".join(f"{alias}.{k}" for k in key)
            base = f"{select} WHERE {alias}.user_id = ?{agent}"

            def read(after: list[Any]) -> Awaitable[list[sqlite3.Row]]:
                where = f" AND ({columns}) > ({', '.join('?' * len(key))})" if after else ""
                return self._rows(f"{base}{where} ORDER BY {columns} LIMIT ?",
                                  [scope.user, *agent_params, *after, EXPORT_PAGE])

            async for row in pages(read, key):
                yield shape(row)

    # --- retrieval: BM25 over the user's own rows (FTS5 finds them); higher is better

    async def search_messages(self, scope: Scope, terms: Sequence[str], *,
                              conversation_ids: Sequence[str] | None = None,
                              exclude_conversation_id: str | None = None,
                              limit: int = 20) -> list[tuple[StoredMessage, float]]:
        """BM25 over the user's messages (the user's own statistics), best first (sqlite/search.py)."""
        return await self._search(self._message_indexes, scope.user, lambda conn, postings_only: search_message_index(
            conn, self._message_counts, self._message_indexes, scope, terms, conversation_ids=conversation_ids,
            exclude_conversation_id=exclude_conversation_id, limit=limit, postings_only=postings_only))

    async def search_entities(
        self, scope: Scope, terms: Sequence[str], *, limit: int = 20
    ) -> list[tuple[Entity, float]]:
        """BM25 over the user's entities (name, type, description), best first (sqlite/search.py)."""
        return await self._search(self._entity_indexes, scope.user, lambda conn, postings_only: search_entity_index(
            conn, self._entity_counts, self._entity_indexes, scope, terms, limit=limit, postings_only=postings_only))

    async def search_reasoning(
        self, scope: Scope, terms: Sequence[str], *, limit: int = 20
    ) -> list[tuple[ReasoningTrace, float]]:
        """BM25 over the user's reasoning traces (task, steps, answer), best first (sqlite/search.py).

        Most users have no trace (no one uses tools): one lookup by the user's index on the
        event loop's connection says so, and only a user with traces goes to a reader thread.
        Asked at every search, not remembered: another process may have saved one since."""
        if not (await self._lookup("SELECT 1 FROM reasoning WHERE user_id = ? LIMIT 1", [scope.user])):
            return []
        return await self._read(lambda conn: search_reasoning_index(conn, self._reasoning_counts, scope, terms,
                                                                    limit=limit))
