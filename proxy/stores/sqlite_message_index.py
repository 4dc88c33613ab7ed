"""In-memory postings of active users' messages: the message search without FTS5's doclist walk.

FTS5 finds a search's candidates by walking the doclists of the query's terms, every
user's rows among them, and scores each through bm25()'s auxiliary-function API: a
whole-history search of bench/retrieval.py's 10,000 messages took 1.3 ms where numpy over
the user's own postings takes about 0.1. This index holds, per user, every message's
conversation, agent, FTS5 token count and each term's weighted frequency in numpy arrays
that grow as messages arrive, and answers `sqlite_search`'s message searches with the
candidates and the order FTS5 would have given.

It is an accelerator, never the truth:

- scores are bm25()'s, computed as fts5_aux.c computes them: rows and tokens come from
  FTS5's averages record in the search's own read transaction, the rows saying each term
  from its vocabulary (kept current as rows arrive: `MessageTermCounts`), each row's token
  count from its docsize table, and the frequencies are summed column by column. FTS5 and
  the postings are searched with the same candidate plan, so a search returns the same rows
  with the same scores whether a user's index is built yet or not
  (tests/test_message_index.py holds the two side by side);
- every hit is read back from `messages` by rowid and user, so a message deleted meanwhile
  is never returned;
- it catches up, in the search's transaction, with the user's messages committed since
  (rowids only grow), and is dropped and rebuilt when `search_epoch` moves: a trigger counts
  every message deletion and re-indexing, by this process or another.

A user's index is built on a thread of its own the first time the user searches, from one
snapshot; meanwhile (and for a query term FTS5 would tokenise differently: anything but
`[a-z0-9_]`) the search goes to FTS5. Indexes are kept least-recently-used within
`store.search_cache_mb`.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import re
import sqlite3
import threading
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

log = logging.getLogger("memproxy.store")

# bm25()'s constants (fts5_aux.c).
K1 = 1.2
B = 0.75
MIN_IDF = 1e-6
# A search catches up with at most this many new messages of the user; past it the index is
# dropped and rebuilt off the request path, the search going to FTS5 meanwhile.
CATCH_UP_MAX = 512
# Nor does a search walk more rowids than this to catch up (a user idle while others wrote).
SCAN_MAX = 20_000
# A user whose index does not fit the cache is not built again for this long.
TOO_BIG_RETRY_S = 600.0
# Rough cost of the index in memory (about 6 MiB for bench/retrieval.py's 10,000 messages):
# per message, per posting, per distinct term or conversation.
DOC_BYTES = 48
POSTING_BYTES = 24
TERM_BYTES = 400

# fts5vocab tables of messages_fts, made on each read connection (sqlite_search.prepare_reader).
VOCAB_COLUMNS = "temp.messages_vocab"  # rows saying a term, per column
VOCAB_ROWS = "temp.messages_vocab_rows"  # rows saying a term in any column
OWN_COLUMN = "terms"  # a message's own words; `context` holds the words said before it
FAST_TERM = re.compile(r"[a-z0-9_]+")  # a term FTS5 (unicode61, tokenchars '_') keeps as one token
_ASCII_TOKEN = re.compile(r"[a-z0-9_]+")
_TOKEN = re.compile(r"\w+")


def fts_tokens(text: str) -> list[str]:
    """The tokens FTS5's unicode61 tokenizer (tokenchars '_', diacritics removed) makes of `text`."""
    if text.isascii():
        return _ASCII_TOKEN.findall(text.lower())
    folded = "".join(c for c in unicodedata.normalize("NFD", text.lower()) if not unicodedata.combining(c))
    return _TOKEN.findall(folded)


def _varints(data: bytes) -> list[int]:
    """Every SQLite varint in `data` (FTS5's counts: 7 bits a byte, big-endian, a 9th byte of 8)."""
    values, at = [], 0
    while at < len(data):
        value = 0
        for n in range(9):
            byte = data[at]
            at += 1
            if n == 8:
                value = (value << 8) | byte
                break
            value = (value << 7) | (byte & 0x7F)
            if not byte & 0x80:
                break
        values.append(value)
    return values


@dataclass(frozen=True)
class Statistics:
    """What bm25() reads of the whole index for one query: its rows, mean row length, rows per term."""

    rows: int
    mean_tokens: float
    rows_saying: dict[str, int]

    def idf(self, term: str) -> float:
        hits = self.rows_saying.get(term, 0)
        idf = math.log((self.rows - hits + 0.5) / (hits + 0.5))
        return idf if idf > 0.0 else MIN_IDF


class MessageTermCounts:
    """How many rows of the whole message index say each term: in their own words (the
    finding column, which sets a whole-history search's candidate budget) and in any column
    (bm25()'s IDF).

    FTS5 counts a term by walking its doclist, as long as the term is common. Here a term is
    counted once, then kept current by adding the rows committed since (any user's, a few a
    turn), and every count is forgotten when `search_epoch` moves (a row deleted or
    re-indexed). Each answer is exact for the snapshot it is asked in. Thread-safe;
    least-recently-used terms dropped past `size`.
    """

    def __init__(self, size: int = 8192) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._counts: OrderedDict[str, list[int]] = OrderedDict()  # term: [own words, any column]
        self._scanned_seq = 0  # the counts hold every row up to this rowid
        self._epoch = -1

    def lookup(self, conn: sqlite3.Connection, terms: Sequence[str], seen: Snapshot
               ) -> tuple[dict[str, int], dict[str, int]]:
        """(rows saying each term in their own words, rows saying it anywhere), in `seen`."""
        with self._lock:
            if seen.epoch != self._epoch or not self._counts or seen.visible_seq - self._scanned_seq > SCAN_MAX:
                self._counts.clear()
                self._epoch, self._scanned_seq = seen.epoch, seen.visible_seq
            elif seen.visible_seq < self._scanned_seq:
                # An older snapshot than the counts (two reads side by side around a commit).
                return _split(self._read(conn, terms))
            elif seen.visible_seq > self._scanned_seq:
                self._add_rows(conn, seen.visible_seq)
            missing = [t for t in terms if t not in self._counts]
            if missing:
                self._counts.update(self._read(conn, missing))
            found = {}
            for term in terms:
                found[term] = self._counts[term]
                self._counts.move_to_end(term)
            while len(self._counts) > self._size:
                self._counts.popitem(last=False)
            return _split(found)

    @staticmethod
    def _read(conn: sqlite3.Connection, terms: Sequence[str]) -> dict[str, list[int]]:
        wanted = json.dumps(list(terms))
        found = {term: [0, 0] for term in terms}
        for term, count in conn.execute(f"SELECT term, doc FROM {VOCAB_COLUMNS} WHERE col = '{OWN_COLUMN}'"
                                        " AND term IN (SELECT value FROM json_each(?))", [wanted]):
            found[term][0] = count
        for term, count in conn.execute(f"SELECT term, doc FROM {VOCAB_ROWS} WHERE term IN"
                                        " (SELECT value FROM json_each(?))", [wanted]):
            found[term][1] = count
        return found

    def _add_rows(self, conn: sqlite3.Connection, visible_seq: int) -> None:
        counts = self._counts
        for terms, context in conn.execute("SELECT terms, context FROM messages WHERE seq > ? AND seq <= ?",
                                           (self._scanned_seq, visible_seq)):
            own = set(fts_tokens(terms))
            for token in own | set(fts_tokens(context)):
                if (count := counts.get(token)) is not None:
                    count[0] += token in own
                    count[1] += 1
        self._scanned_seq = visible_seq


def _split(counts: dict[str, list[int]]) -> tuple[dict[str, int], dict[str, int]]:
    return {t: c[0] for t, c in counts.items()}, {t: c[1] for t, c in counts.items()}


@dataclass(frozen=True)
class Snapshot:
    """What a read transaction sees of the message index: its newest rowid, the epoch, FTS5's totals."""

    visible_seq: int
    epoch: int
    rows: int
    tokens: int

    def statistics(self, saying: dict[str, int]) -> Statistics:
        """bm25()'s figures for a query whose terms `saying` rows say."""
        return Statistics(self.rows, self.tokens / self.rows if self.rows else 0.0, saying)


def snapshot(conn: sqlite3.Connection) -> Snapshot:
    """One statement: the newest rowid, `search_epoch`, and FTS5's averages record (rows, then tokens per column)."""
    visible, current_epoch, averages = conn.execute(
        "SELECT (SELECT ifnull(max(seq), 0) FROM messages), (SELECT epoch FROM search_epoch WHERE id = 1),"
        " (SELECT block FROM messages_fts_data WHERE id = 1)").fetchone()
    totals = _varints(averages) if averages else [0]
    return Snapshot(visible, current_epoch or 0, totals[0], sum(totals[1:]))


class _Growing:
    """A numpy array that values are appended to: appends wait in a list (a numpy item
    assignment costs what a dozen list appends do) and are joined when the array is next read."""

    __slots__ = ("_array", "_dtype", "_pending")

    def __init__(self, dtype: type) -> None:
        self._dtype = dtype
        self._array = np.empty(0, dtype=dtype)
        self._pending: list[object] = []

    def append(self, value: object) -> None:
        self._pending.append(value)

    def array(self) -> np.ndarray:
        if self._pending:
            self._array = np.concatenate([self._array, np.array(self._pending, dtype=self._dtype)])
            self._pending = []
        return self._array


class _Postings:
    """One term's messages (positions in the user's index, ascending), weighted frequency, and
    whether the message's own words say it (the finding column) or only its context."""

    __slots__ = ("docs", "freqs", "own")

    def __init__(self) -> None:
        self.docs = _Growing(np.int32)
        self.freqs = _Growing(np.float64)
        self.own = _Growing(np.bool_)


@dataclass(frozen=True)
class Filter:
    """Which of the user's messages a search may return."""

    conversations: Sequence[str] | None = None  # only these (a conversation search), or any
    excluded: str | None = None  # never this conversation
    agent_isolated: bool = False  # only `agent`'s messages
    agent: str | None = None


class UserIndex:
    """One user's messages as postings, in rowid order; `lock` is held to catch up and search."""

    def __init__(self, user: str, epoch: int, weights: tuple[float, float]) -> None:
        self.user = user
        self.epoch = epoch
        self.scanned_seq = 0  # every message up to this rowid is added, if the user's
        self.lock = threading.Lock()
        self._weights = weights
        self._seqs = _Growing(np.int64)
        self._conversations = _Growing(np.int32)
        self._agents = _Growing(np.int32)
        self._tokens = _Growing(np.float64)
        self._conversation_codes: dict[str, int] = {}
        self._by_conversation: dict[int, _Growing] = {}  # each conversation's messages
        self._agent_codes: dict[str | None, int] = {}
        self._postings: dict[str, _Postings] = {}
        self._count = 0
        self._posting_count = 0

    @property
    def nbytes(self) -> int:
        return (self._count * DOC_BYTES + self._posting_count * POSTING_BYTES
                + (len(self._postings) + len(self._by_conversation)) * TERM_BYTES)

    def add(self, seq: int, conversation_id: str, agent_id: str | None, terms: str, context: str,
            docsize: bytes) -> None:
        """Append one message (rowids ascending): bm25()'s frequency of each term is its
        instances' column weights added one by one, own words first, as fts5_aux.c adds them."""
        position = self._count
        own_weight, context_weight = self._weights
        freqs: dict[str, float] = {}
        for token in fts_tokens(terms):
            freqs[token] = freqs.get(token, 0.0) + own_weight
        own = set(freqs)
        for token in fts_tokens(context):
            freqs[token] = freqs.get(token, 0.0) + context_weight
        for token, freq in freqs.items():
            postings = self._postings.get(token)
            if postings is None:
                postings = self._postings[token] = _Postings()
            postings.docs.append(position)
            postings.freqs.append(freq)
            postings.own.append(token in own)
        self._seqs.append(seq)
        conversation = self._conversation_codes.setdefault(conversation_id, len(self._conversation_codes))
        self._conversations.append(conversation)
        self._by_conversation.setdefault(conversation, _Growing(np.int32)).append(position)
        self._agents.append(self._agent_codes.setdefault(agent_id, len(self._agent_codes)))
        self._tokens.append(float(sum(_varints(docsize))))
        self._count += 1
        self._posting_count += len(freqs)

    def join(self) -> None:
        """Join every array's appends (a built index: its lists would hold it twice over)."""
        growing = [self._seqs, self._conversations, self._agents, self._tokens, *self._by_conversation.values()]
        for postings in self._postings.values():
            growing += (postings.docs, postings.freqs, postings.own)
        for array in growing:
            array.array()

    def search(self, terms: Sequence[str], finding: Sequence[str], stats: Statistics, where: Filter,
               newest: int | None, limit: int, visible_seq: int) -> list[tuple[int, float]]:
        """(rowid, score) of the best `limit` messages, best first, as `sqlite_search._search` ranks them.

        Candidates are the messages whose own words say a `finding` term (the newest `newest`
        of them when set), among those `where` allows and committed by `visible_seq`; each
        is scored by bm25() over every one of `terms`.
        """
        seqs = self._seqs.array()
        visible = int(np.searchsorted(seqs, visible_seq, side="right"))
        if where.conversations is not None:
            candidates = self._saying(self._in_conversations(where.conversations), finding)
        else:
            found = [p.docs.array()[p.own.array()] for t in finding if (p := self._postings.get(t)) is not None]
            if not found:
                return []
            # Each list is ascending and distinct already: only several need merging.
            candidates = found[0] if len(found) == 1 else np.unique(np.concatenate(found))
        candidates = candidates[candidates < visible]
        candidates = candidates[self._allowed(candidates, where)]
        if newest is not None:
            candidates = candidates[-newest:]
        if not len(candidates):
            return []
        tokens = self._tokens.array()[candidates]
        length_part = K1 * ((1 - B) + B * tokens / stats.mean_tokens)
        scores = np.zeros(len(candidates), dtype=np.float64)
        for term in terms:
            postings = self._postings.get(term)
            if postings is None:
                continue  # bm25() adds exactly 0.0 for a term the row does not say
            docs = postings.docs.array()
            at = np.minimum(np.searchsorted(docs, candidates), len(docs) - 1)
            freqs = np.where(docs[at] == candidates, postings.freqs.array()[at], 0.0)
            scores += stats.idf(term) * ((freqs * (K1 + 1.0)) / (freqs + length_part))
        rowids = seqs[candidates]
        best = np.lexsort((-rowids, -scores))[:limit]
        return [(int(rowids[n]), float(scores[n])) for n in best]

    def _in_conversations(self, conversation_ids: Sequence[str]) -> np.ndarray:
        """The messages of these conversations, ascending."""
        lists = [self._by_conversation[code].array() for c in conversation_ids
                 if (code := self._conversation_codes.get(c)) is not None]
        return np.unique(np.concatenate(lists)) if lists else np.empty(0, dtype=np.int32)

    def _saying(self, pool: np.ndarray, terms: Sequence[str]) -> np.ndarray:
        """The messages of `pool` whose own words say one of `terms`."""
        says = np.zeros(len(pool), dtype=bool)
        for term in terms:
            postings = self._postings.get(term)
            if postings is None or not len(pool):
                continue
            docs = postings.docs.array()
            at = np.minimum(np.searchsorted(docs, pool), len(docs) - 1)
            says |= (docs[at] == pool) & postings.own.array()[at]
        return pool[says]

    def _allowed(self, candidates: np.ndarray, where: Filter) -> np.ndarray:
        keep = np.ones(len(candidates), dtype=bool)
        if where.excluded is not None and where.excluded in self._conversation_codes:
            keep &= self._conversations.array()[candidates] != self._conversation_codes[where.excluded]
        if where.agent_isolated:
            keep &= self._agents.array()[candidates] == self._agent_codes.get(where.agent, -1)
        return keep


# rowid, conversation, agent, own words, context, FTS5 docsize: what `UserIndex.add` takes.
_ROWS = ("SELECT m.seq, m.conversation_id, m.agent_id, m.terms, m.context, d.sz FROM messages m"
         " CROSS JOIN messages_fts_docsize d ON d.id = m.seq")


def _epoch(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT epoch FROM search_epoch WHERE id = 1").fetchone()
    return int(row[0]) if row else 0


class MessageIndexes:
    """The users' indexes, least recently used first, within `max_bytes`; built on a thread of their own."""

    def __init__(self, path: str, pragmas: Sequence[str], max_bytes: int, weights: tuple[float, float],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._path = path
        self._pragmas = tuple(pragmas)
        self.max_bytes = max_bytes
        self._weights = weights
        self._clock = clock
        self._lock = threading.Lock()
        self._indexes: OrderedDict[str, UserIndex] = OrderedDict()
        self._wanted: set[str] = set()
        self._too_big: dict[str, float] = {}
        self._builds: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._builder: threading.Thread | None = None
        self.builds = 0  # indexes built so far
        self.searches = 0  # searches an index answered (the others went to FTS5)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def ready(self, conn: sqlite3.Connection, user: str, seen: Snapshot) -> UserIndex | None:
        """The user's index, caught up with what `conn`'s open transaction sees (`seen`); None to
        search FTS5. A user without one has it built in the background.
        """
        visible_seq = seen.visible_seq
        with self._lock:
            index = self._indexes.get(user)
            if index is not None:
                self._indexes.move_to_end(user)
        if index is None:
            self._want(user)
            return None
        if index.epoch != seen.epoch:
            self._drop(user, index)
            self._want(user)
            return None
        with index.lock:
            if visible_seq <= index.scanned_seq:
                self.searches += 1
                return index
            if visible_seq - index.scanned_seq > SCAN_MAX:
                self._drop(user, index)
                self._want(user)
                return None
            # Only the rowids committed since this user's last search are walked (`+`: not
            # the user's index, which would walk all of the user's messages).
            new = conn.execute(f"{_ROWS} WHERE m.seq > ? AND m.seq <= ? AND +m.user_id = ? ORDER BY m.seq LIMIT ?",
                               (index.scanned_seq, visible_seq, user, CATCH_UP_MAX + 1)).fetchall()
            if len(new) > CATCH_UP_MAX:
                self._drop(user, index)
                self._want(user)
                return None
            for row in new:
                index.add(*row)
            index.scanned_seq = visible_seq
            self.searches += 1
        if new:
            self._trim()
        return index

    def holds(self, user: str) -> bool:
        """True when the user's index is built and cached."""
        with self._lock:
            return user in self._indexes

    def forget(self, user: str) -> None:
        """Drop the user's index (the user was deleted)."""
        with self._lock:
            self._indexes.pop(user, None)
            self._wanted.discard(user)

    def close(self) -> None:
        """Stop the builder; indexes are dropped."""
        builder, self._builder = self._builder, None
        if builder is not None:
            self._builds.put(None)
            builder.join(timeout=5)
        with self._lock:
            self._indexes.clear()

    def _want(self, user: str) -> None:
        with self._lock:
            now = self._clock()
            if user in self._wanted or self._too_big.get(user, 0.0) > now:
                return
            self._too_big = {u: until for u, until in self._too_big.items() if until > now}
            self._wanted.add(user)
            if self._builder is None:
                self._builder = threading.Thread(target=self._build_loop, name="memproxy-message-index", daemon=True)
                self._builder.start()
        self._builds.put(user)

    def _drop(self, user: str, index: UserIndex) -> None:
        with self._lock:
            if self._indexes.get(user) is index:
                del self._indexes[user]

    def _build_loop(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while (user := self._builds.get()) is not None:
                try:
                    conn = conn or self._connect()
                    index = self._build(conn, user)
                except sqlite3.Error as exc:  # the store went away or is locked: searches use FTS5
                    log.warning("message index: cannot build for a user (%s)", exc)
                    index = None
                self._install(user, index)
        finally:
            if conn is not None:
                conn.close()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        for pragma in self._pragmas:
            conn.execute(f"PRAGMA {pragma}")
        return conn

    def _build(self, conn: sqlite3.Connection, user: str) -> UserIndex:
        conn.execute("BEGIN")
        try:
            index = UserIndex(user, _epoch(conn), self._weights)
            index.scanned_seq = conn.execute("SELECT ifnull(max(seq), 0) FROM messages").fetchone()[0]
            for row in conn.execute(f"{_ROWS} WHERE m.user_id = ? ORDER BY m.seq", (user,)):
                index.add(*row)
        finally:
            conn.execute("COMMIT")
        index.join()
        self.builds += 1
        return index

    def _install(self, user: str, index: UserIndex | None) -> None:
        with self._lock:
            self._wanted.discard(user)
            if index is None:
                return
            if index.nbytes > self.max_bytes:
                self._too_big[user] = self._clock() + TOO_BIG_RETRY_S
                log.info("message index: a user's index (%d MiB) exceeds memory.search_cache_mb", index.nbytes >> 20)
                return
            self._indexes[user] = index
            self._indexes.move_to_end(user)
        self._trim()

    def _trim(self) -> None:
        with self._lock:
            total = sum(index.nbytes for index in self._indexes.values())
            while total > self.max_bytes and len(self._indexes) > 1:
                _, evicted = self._indexes.popitem(last=False)
                total -= evicted.nbytes
