"""In-memory postings of active users' rows of an FTS5 index: a search without FTS5's doclist walk.

FTS5 finds a search's candidates by walking the doclists of the query's terms, every
user's rows among them, and scores each through bm25()'s auxiliary-function API: a
whole-history search of bench/retrieval.py's 10,000 messages took 1.1-1.5 ms where numpy
over the user's own postings takes 0.1-0.3. `UserPostings` holds one user's rows (their
conversation, agent, FTS5 token count and each term's weighted frequency) in numpy arrays
that grow as rows arrive; `PostingsCache` (sqlite/postings_cache.py) keeps the users'
postings least-recently-used within a memory bound, builds them on a thread of its own,
and has them caught up before each search. sqlite/message_index.py and
sqlite/entity_index.py say how each table's rows are caught up with; sqlite/search.py
searches either engine with one candidate plan.

The postings are an accelerator, never the truth:

- scores are bm25()'s, computed as fts5_aux.c computes them from FTS5's own statistics
  (rows and tokens from its averages record, rows saying each term from its vocabulary,
  each row's tokens from its docsize table), read in the search's own read transaction,
  with each term's frequency summed column by column as bm25() sums it; so a search
  returns the same rows with the same scores whether a user's postings are built yet or
  not (tests/test_postings.py holds the two engines side by side);
- every hit is read back from its table by rowid and user, so a row deleted meanwhile is
  never returned;
- a search sees only what its snapshot sees; one that cannot (its snapshot is older than
  the postings, or they fell too far behind) goes to FTS5, and stale postings are rebuilt.

A query term FTS5 would tokenise differently from how it is written (anything but
`[a-z0-9_]`) goes to FTS5 too: its phrase is FTS5's to match. So only those terms' counts
must agree with FTS5's tokenizer, and `fts_tokens` makes them the same tokens from the
text memproxy stores (tests/test_postings.py); other scripts' tokens may differ (FTS5
keeps Greek accents), which no search through the postings can see.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
import threading
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")

# bm25()'s constants (fts5_aux.c).
K1 = 1.2
B = 0.75
MIN_IDF = 1e-6
# A search catches up with at most this many changed rows of the user, and walks at most
# this many rowids (of every user) to find them; past either the postings are rebuilt off
# the request path, the search going to FTS5 meanwhile.
CATCH_UP_MAX = 512
SCAN_MAX = 20_000
# Rough cost in memory (about 6 MiB for bench/retrieval.py's 10,000 messages): per row,
# per posting, per distinct term or conversation, with the spare room of arrays grown since their build.
ROW_BYTES = 48
POSTING_BYTES = 24
TERM_BYTES = 400
# The rows a user's searches returned last, kept as built (`UserPostings.hit`): at most this
# many, each of a text no longer than HIT_CHARS (a pasted document is read again), counted
# at HIT_BYTES each (2.5 MiB a user at most). A cross-session search returns up to 57 rows:
# 256 held the candidates of four questions, and a user asking eight in turn had every row
# read back and built again at every search (bench/request_cpu.py).
HITS_KEPT = 1024
HIT_CHARS = 2000
HIT_BYTES = 2560

# A build runs Python for every row it reads, holding the GIL; a waiting thread gets it back
# only at CPython's switch interval (5 ms). Building a 100,000-message history took 3.4 s,
# and meanwhile other clients' streams arrived in batches (1.36 events a read) and recalls
# ran past their deadline (bench/retrieval.py). So a build rests REST_S after every BURST_S
# of work, taking a third of the GIL at most: 1.03 events a read, no recall late, the build
# about three times as long (FTS5 answers meanwhile). Resting as long as it works still
# batched them (1.15).
BURST_S = 0.001
REST_S = 0.002
# A build reads the user's rows this many at a time, each chunk in a read transaction of its
# own: one snapshot held for a whole paced build (15 s for 100,000 messages) would keep the
# WAL from being checkpointed meanwhile. What changes between chunks the catch-up already
# covers (sqlite/message_index.py, sqlite/entity_index.py).
BUILD_CHUNK = 500

FAST_TERM = re.compile(r"[a-z0-9_]+")  # a term FTS5 (unicode61, tokenchars '_') keeps as one token
ASCII_TOKEN = re.compile(r"[a-z0-9_]+")
_TOKEN = re.compile(r"\w+")


def fts_tokens(text: str) -> list[str]:
    """The tokens FTS5's unicode61 tokenizer (tokenchars '_', diacritics removed) makes of `text`."""
    if text.isascii():
        return ASCII_TOKEN.findall(text.lower())
    folded = "".join(c for c in unicodedata.normalize("NFD", text.lower()) if not unicodedata.combining(c))
    return _TOKEN.findall(folded)


def term_frequencies(columns: Sequence[str], weights: Sequence[float], finding_column: int | None = None
                     ) -> tuple[dict[str, float], set[str]]:
    """A row's weighted frequency of each term (its instances' column weights added one by one,
    column by column, as fts5_aux.c adds them), and the terms its finding column says (all of
    them when it has none)."""
    freqs: dict[str, float] = {}
    finds: set[str] = set()
    for column, (text, weight) in enumerate(zip(columns, weights, strict=True)):
        tokens = fts_tokens(text)
        for token in tokens:
            freqs[token] = freqs.get(token, 0.0) + weight
        if finding_column is None or column == finding_column:
            finds.update(tokens)
    return freqs, finds


def paced(items: Iterable[T], clock: Callable[[], float] = time.perf_counter,
          rest: Callable[[float], None] = time.sleep) -> Iterator[T]:
    """`items`, the caller resting REST_S after every BURST_S it spends on them (off the request
    path only: a background build leaves the GIL to the event loop and the readers)."""
    started = clock()
    for item in items:
        yield item
        if clock() - started >= BURST_S:
            rest(REST_S)
            started = clock()


@contextmanager
def read_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One snapshot for the reads inside (a search's counts, statistics, catch-up and rows; a build's chunk)."""
    if conn.in_transaction:  # left open by a read that failed half-way: nothing to keep
        conn.rollback()
    conn.execute("BEGIN")
    try:
        yield
    finally:
        conn.execute("COMMIT")


def rows_by_seq(conn: sqlite3.Connection, select: str, seqs: Sequence[int]) -> Iterator[tuple[Any, ...]]:
    """The rows `select` reads for these rowids (its `FROM` joins `j`, a json_each of them, to the
    table as `t.seq = j.value`), BUILD_CHUNK at a time, each chunk in a read transaction of its
    own; a row deleted meanwhile is left out."""
    for start in range(0, len(seqs), BUILD_CHUNK):
        with read_transaction(conn):  # rows fetched one by one: a paced caller rests between them
            yield from conn.execute(select, [json.dumps(seqs[start:start + BUILD_CHUNK])])


def varints(data: bytes) -> list[int]:
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


def totals(averages: bytes | None) -> tuple[int, int]:
    """(rows, tokens in every column) from FTS5's averages record."""
    counts = varints(averages) if averages else [0]
    return counts[0], sum(counts[1:])


@dataclass(frozen=True)
class Statistics:
    """What BM25 reads of one user's rows for one query: their count, mean length, rows saying each term."""

    rows: int
    tokens: int
    rows_saying: dict[str, int]

    @property
    def mean_tokens(self) -> float:
        return self.tokens / self.rows if self.rows else 0.0

    def idf(self, term: str) -> float:
        hits = self.rows_saying.get(term, 0)
        idf = math.log((self.rows - hits + 0.5) / (hits + 0.5))
        return idf if idf > 0.0 else MIN_IDF


def scores(stats: Statistics, terms: Sequence[str], rows: Iterable[tuple[int, dict[str, float], float]]
           ) -> list[tuple[int, float]]:
    """(rowid, score) of each row given as (rowid, its `term_frequencies`, its tokens): bm25()
    over `terms` with `stats`, each operation as `UserPostings.search` does it in numpy, so
    either way a row scores the same to the bit."""
    idfs = [(term, stats.idf(term)) for term in terms]
    out = []
    for seq, freqs, tokens in rows:
        length_part = K1 * ((1 - B) + B * tokens / stats.mean_tokens)
        score = 0.0
        for term, idf in idfs:
            if freq := freqs.get(term, 0.0):
                score += idf * ((freq * (K1 + 1.0)) / (freq + length_part))
        out.append((seq, score))
    return out


@dataclass(frozen=True)
class Filter:
    """Which of the user's rows a search may return."""

    conversations: Sequence[str] | None = None  # only these (a conversation search), or any
    excluded: str | None = None  # never this conversation
    agent_isolated: bool = False  # only `agent`'s rows
    agent: str | None = None


def _appended(view: np.ndarray, values: Sequence[object]) -> np.ndarray:
    """`view` with `values` after it, written into spare room at its end: an array made here
    views a buffer with room for half as many again, so each value is copied O(1) times
    (a copy of the whole array per append cost 82 us an array at 130,000 rows)."""
    length = len(view)
    end = length + len(values)
    buffer = view.base if view.base is not None else view
    if end > len(buffer):
        buffer = np.empty(max(end, length * 3 // 2), dtype=view.dtype)
        buffer[:length] = view
    buffer[length:end] = values
    return buffer[:end]


class _Growing:
    """A numpy array that values are appended to: appends wait in a list (a numpy item
    assignment costs what a dozen list appends do) and are copied in when the array is next read."""

    __slots__ = ("_pending", "_view")

    def __init__(self, dtype: type) -> None:
        self._view: np.ndarray = np.empty(0, dtype=dtype)
        self._pending: list[object] | None = None

    def append(self, value: object) -> None:
        if self._pending is None:
            self._pending = []
        self._pending.append(value)

    def array(self) -> np.ndarray:
        if self._pending is not None:
            self._view = _appended(self._view, self._pending)
            self._pending = None
        return self._view


class _Keyed:
    """Per key (a term, a conversation), rows of a few columns appended in order, read as numpy
    arrays. One dict of tuples, not objects per key: a tuple of arrays is no work for Python's
    garbage collector, whose full collections walked seven objects a term (at
    bench/retrieval.py's 100,000 messages a full collection took 49-55 ms, and 13-19 since)."""

    __slots__ = ("_arrays", "_dtypes", "_keys", "_pending")

    def __init__(self, *dtypes: type) -> None:
        self._dtypes = dtypes
        self._arrays: dict[object, tuple[np.ndarray, ...]] = {}
        self._pending: dict[object, list[object]] = {}  # rows not yet in the arrays, one flat list a key
        self._keys = 0

    def __len__(self) -> int:
        return self._keys

    def append(self, key: object, *row: object) -> None:
        pending = self._pending.get(key)
        if pending is None:
            self._keys += key not in self._arrays
            pending = self._pending[key] = []
        pending.extend(row)

    def get(self, key: object) -> tuple[np.ndarray, ...] | None:
        """The key's columns, or None for a key never appended to."""
        flat = self._pending.pop(key, None)
        arrays = self._arrays.get(key)
        if flat is None:
            return arrays
        width = len(self._dtypes)
        columns = [flat[n::width] for n in range(width)]
        if arrays is None:
            arrays = tuple(np.array(column, dtype=dtype) for column, dtype in zip(columns, self._dtypes, strict=True))
        else:
            arrays = tuple(_appended(array, column) for array, column in zip(arrays, columns, strict=True))
        self._arrays[key] = arrays
        return arrays

    def pending(self) -> list[object]:
        """The keys with rows not yet in their arrays."""
        return list(self._pending)


def _union(positions: list[np.ndarray]) -> np.ndarray:
    """The positions of several ascending lists, each once, ascending: np.unique's answer, at a
    fifth of its cost for a few hundred positions (it hashes them before it sorts)."""
    merged = np.concatenate(positions)
    merged.sort()
    first = np.empty(len(merged), dtype=bool)
    first[:1] = True
    np.not_equal(merged[1:], merged[:-1], out=first[1:])
    return merged[first]


class UserPostings:
    """One user's rows of an FTS5 index as postings; `lock` is held to catch up and to search.

    A row is appended at the next position. A changed row is marked dead and appended again,
    so positions follow rowids until a row changes (`ordered`).
    """

    def __init__(self, user: str, weights: Sequence[float], finding_column: int | None) -> None:
        self.user = user
        self.lock = threading.Lock()
        self.caught_up_to = 0  # what the table's catch-up (sqlite/*_index.py) has read up to
        self.epoch = 0  # what the table's catch-up checks they were built in (messages: search_epoch)
        self.ordered = True
        self._weights = tuple(weights)
        self._finding_column = finding_column
        self._seqs = _Growing(np.int64)
        self._conversations = _Growing(np.int32)
        self._agents = _Growing(np.int32)
        self._tokens = _Growing(np.float64)
        self._alive = _Growing(np.bool_)
        self._position: dict[int, int] = {}  # rowid: position of its live row
        self._conversation_codes: dict[str | None, int] = {}
        self._by_conversation = _Keyed(np.int32)  # each conversation's positions
        self._agent_codes: dict[str | None, int] = {}
        # Per term: the positions of the rows saying it (ascending), its weighted frequency in
        # each, and whether the row's finding column says it (when the index has one).
        self._postings = _Keyed(np.int32, np.float64, np.bool_)
        self._count = 0
        self._last_seq = 0
        self._dead = 0
        self._posting_count = 0
        self._live_tokens = 0  # FTS5 tokens of the live rows: the user's total for bm25's mean length
        self._hits: OrderedDict[int, object] = OrderedDict()

    @property
    def nbytes(self) -> int:
        return (self._count * ROW_BYTES + self._posting_count * POSTING_BYTES
                + (len(self._postings) + len(self._by_conversation)) * TERM_BYTES + len(self._hits) * HIT_BYTES)

    def hit(self, seq: int) -> object | None:
        """The row as a search last returned it, built, while it still reads so; None when not kept."""
        item = self._hits.get(seq)
        if item is not None:
            self._hits.move_to_end(seq)
        return item

    def keep_hit(self, seq: int, item: object, chars: int) -> None:
        """Keep a row a search returned, built from what it read of the table at `caught_up_to`."""
        if chars <= HIT_CHARS and seq in self._position:
            self._hits[seq] = item
            self._hits.move_to_end(seq)
            if len(self._hits) > HITS_KEPT:
                self._hits.popitem(last=False)

    @property
    def dead_share(self) -> float:
        return self._dead / self._count if self._count else 0.0

    def add(self, seq: int, conversation_id: str | None, agent_id: str | None, columns: Sequence[str],
            docsize: bytes) -> None:
        """The row's current version (`term_frequencies`)."""
        self.remove(seq)
        if seq < self._last_seq:
            self.ordered = False
        self._last_seq = seq
        position = self._count
        freqs, finds = term_frequencies(columns, self._weights, self._finding_column)
        for token, freq in freqs.items():
            self._postings.append(token, position, freq, token in finds)
        self._seqs.append(seq)
        conversation = self._conversation_codes.setdefault(conversation_id, len(self._conversation_codes))
        self._conversations.append(conversation)
        self._by_conversation.append(conversation, position)
        self._agents.append(self._agent_codes.setdefault(agent_id, len(self._agent_codes)))
        tokens = sum(varints(docsize))
        self._tokens.append(float(tokens))
        self._alive.append(True)
        self._position[seq] = position
        self._count += 1
        self._posting_count += len(freqs)
        self._live_tokens += tokens

    def remove(self, seq: int) -> None:
        """Forget the row (deleted, or about to be added again as it now reads)."""
        self._hits.pop(seq, None)
        position = self._position.pop(seq, None)
        if position is not None:
            self._alive.array()[position] = False
            self._dead += 1
            self._live_tokens -= int(self._tokens.array()[position])

    def statistics(self, terms: Sequence[str], visible_seq: int | None = None) -> tuple[Statistics, dict[str, int]]:
        """The user's own BM25 figures for `terms` (rows, tokens, rows saying each term in any
        column), and the rows saying each in the finding column: of the live rows committed by
        `visible_seq` (all when None)."""
        end = self._count
        if visible_seq is not None and visible_seq < self._last_seq:
            end = int(np.searchsorted(self._seqs.array(), visible_seq, side="right")) if self.ordered else -1
        if end == self._count and not self._dead:
            rows, tokens, visible = self._count, self._live_tokens, None
        else:
            visible = self._alive.array().copy()
            if end != self._count:
                visible &= (self._seqs.array() <= visible_seq) if end < 0 else (np.arange(self._count) < end)
            rows, tokens = int(np.count_nonzero(visible)), int(self._tokens.array()[visible].sum())
        saying: dict[str, int] = {}
        finding: dict[str, int] = {}
        for term in terms:
            postings = self._postings.get(term)
            if postings is None:
                saying[term] = finding[term] = 0
                continue
            docs, _, finds = postings
            if visible is not None:
                live = visible[docs]
                saying[term], finding[term] = int(np.count_nonzero(live)), int(np.count_nonzero(finds & live))
            else:
                saying[term], finding[term] = len(docs), int(np.count_nonzero(finds))
        return Statistics(rows, tokens, saying), finding

    def join(self) -> None:
        """Join every array's appends (built postings: their lists would hold them twice over);
        paced, on the builder's thread."""
        for array in paced((self._seqs, self._conversations, self._agents, self._tokens, self._alive)):
            array.array()
        for keyed in (self._by_conversation, self._postings):
            for key in paced(keyed.pending()):
                keyed.get(key)

    def search(self, terms: Sequence[str], finding: Sequence[str], stats: Statistics, where: Filter,
               newest: int | None, limit: int, visible_seq: int | None = None) -> list[tuple[int, float]]:
        """(rowid, score) of the best `limit` rows, best first, as `sqlite.search._search` ranks them.

        Candidates are the rows whose finding column says a `finding` term (the newest `newest`
        of them by rowid when set), among those `where` allows (and, rows being appended in
        rowid order, committed by `visible_seq`); each is scored by bm25() over all `terms`.
        """
        seqs = self._seqs.array()
        if where.conversations is not None:
            candidates = self._saying(self._in_conversations(where.conversations), finding)
        else:
            found = []
            for term in finding:
                if (postings := self._postings.get(term)) is not None:
                    docs, _, finds = postings
                    found.append(docs[finds])
            if not found:
                return []
            candidates = found[0] if len(found) == 1 else _union(found)
        if visible_seq is not None and not (self.ordered and visible_seq >= self._last_seq):
            candidates = candidates[candidates < int(np.searchsorted(seqs, visible_seq, side="right"))]
        if (allowed := self._allowed(candidates, where)) is not None:
            candidates = candidates[allowed]
        if newest is not None and len(candidates) > newest:
            if self.ordered:
                candidates = candidates[-newest:]
            else:
                candidates = candidates[np.argsort(seqs[candidates], kind="stable")[-newest:]]
        if not len(candidates):
            return []
        tokens = self._tokens.array()[candidates]
        length_part = K1 * ((1 - B) + B * tokens / stats.mean_tokens)
        scores = np.zeros(len(candidates), dtype=np.float64)
        for term in terms:
            postings = self._postings.get(term)
            if postings is None:
                continue  # bm25() adds exactly 0.0 for a term the row does not say
            docs, term_freqs, _ = postings
            at = np.minimum(np.searchsorted(docs, candidates), len(docs) - 1)
            freqs = np.where(docs[at] == candidates, term_freqs[at], 0.0)
            scores += stats.idf(term) * ((freqs * (K1 + 1.0)) / (freqs + length_part))
        rowids = seqs[candidates]
        best = np.lexsort((-rowids, -scores))[:limit]
        return list(zip(rowids[best].tolist(), scores[best].tolist()))

    def _in_conversations(self, conversation_ids: Sequence[str]) -> np.ndarray:
        """The positions of these conversations' rows, ascending."""
        lists = []
        for conversation_id in conversation_ids:
            code = self._conversation_codes.get(conversation_id)
            if code is not None and (positions := self._by_conversation.get(code)) is not None:
                lists.append(positions[0])
        return np.unique(np.concatenate(lists)) if lists else np.empty(0, dtype=np.int32)

    def _saying(self, pool: np.ndarray, terms: Sequence[str]) -> np.ndarray:
        """The rows of `pool` whose finding column says one of `terms`."""
        says = np.zeros(len(pool), dtype=bool)
        for term in terms:
            postings = self._postings.get(term)
            if postings is None or not len(pool):
                continue
            docs, _, finds = postings
            at = np.minimum(np.searchsorted(docs, pool), len(docs) - 1)
            says |= (docs[at] == pool) & finds[at]
        return pool[says]

    def _allowed(self, candidates: np.ndarray, where: Filter) -> np.ndarray | None:
        """Which of the candidates `where` allows (and are alive); None when all of them are."""
        excluded = self._conversation_codes.get(where.excluded) if where.excluded is not None else None
        if not (self._dead or excluded is not None or where.agent_isolated):
            return None
        keep = self._alive.array()[candidates] if self._dead else np.ones(len(candidates), dtype=bool)
        if excluded is not None:
            keep &= self._conversations.array()[candidates] != excluded
        if where.agent_isolated:
            keep &= self._agents.array()[candidates] == self._agent_codes.get(where.agent, -1)
        return keep
