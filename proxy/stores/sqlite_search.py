"""Message search on SQLite: FTS5 BM25 whose cost follows the query's rare terms.

FTS5 scores every row its MATCH yields, and the statement then reads each one's message
row to check the user; walking the doclists themselves is cheap. So a search costs about
the number of rows holding *any* query term, and a term found in a tenth of all messages
("plan", "deadline") made a search of a 100k-message history take 20-40 ms. Two bounds:

- a conversation-filtered search scores only that conversation's rows: the rowid range
  they span bounds the index walk, a membership test picks them out (`rowid IN (...)`
  used as an index would rerun the BM25 statistics once per row: 0.3 s for 50 conversations);
- a whole-history search scores only the messages saying the query's rarest terms, as
  many terms as fit in a budget of CANDIDATE_SHARE of the indexed messages, still by BM25
  over every term, so a hit ranks as it did; only a message saying none of those (but a
  common word: "plan", "deadline") is no longer found. How many messages say each term
  comes from an fts5vocab table, cached briefly. On bench/retrieval.py's 100k-message
  history the hits were the unbounded search's for all 200 queries, at a quarter of its
  cost; at 10k, for 187 (the first hit for 199).

BM25 statistics stay the whole corpus's either way: FTS5 counts each term over its doclist.

Not done: a per-user token in the index (a column weighted 0), ANDed into every MATCH so
the index rather than a join keeps other users' rows out. Measured at 100k messages (130k
rows): a user holding a tenth of the rows searched up to 7x faster, but the user holding
most of them up to 2x slower (BM25 walks the token's doclist, as long as the user's
history, to count it), and every full-text index would have to be rebuilt.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from proxy.models import Scope, StoredMessage
from proxy.stores.sqlite_rows import message_from_row

# A whole-history search scores the messages saying its rarest terms, as many terms as
# this share of the indexed messages holds...
CANDIDATE_SHARE = 0.03
# ...and never fewer than this many messages. On bench/retrieval.py's 10k history a search
# scoring up to 1,000 rows cost what one scoring 200 did (1.5 ms, the index walk dominates),
# and a history this small is searched whole: pruning at 200 cost LoCoMo 2.5 points of recall.
CANDIDATE_MIN_ROWS = 1000
# Document counts change as messages arrive; a count a minute old still tells rare from common.
COUNTS_TTL_S = 60.0
COUNTS_CACHED_TERMS = 4096
VOCAB_TABLE = "temp.messages_vocab"
OWN_WORDS = "terms"  # the messages_fts column of a message's own words (the other: its context)
# What message_from_row reads: a hit is built from these, not from the index text beside them.
MESSAGE_COLUMNS = "m.id, m.conversation_id, m.role, m.content, m.created_at"

AgentClause = Callable[[Scope, str], tuple[str, list[Any]]]


def match_query(terms: Sequence[str]) -> str | None:
    """An FTS5 query matching any of the terms, each quoted so no term is an operator."""
    quoted = ['"' + t.replace('"', '""') + '"' for t in searchable(terms)]
    return " OR ".join(quoted) or None


def searchable(terms: Sequence[str]) -> list[str]:
    """The distinct terms an FTS5 query can hold (a term with no letter or digit matches nothing)."""
    return [t for t in dict.fromkeys(terms) if any(c.isalnum() for c in t)]


def prepare_reader(conn: sqlite3.Connection) -> None:
    """Per read connection: the vocabulary table the term counts come from (temp: nothing is written)."""
    conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS {VOCAB_TABLE} USING fts5vocab(main, messages_fts, col)")


def _varint(data: bytes, at: int) -> int:
    """An SQLite varint (as FTS5 stores its counts): 7 bits a byte, big-endian, a 9th byte of 8."""
    value = 0
    for n in range(8):
        byte = data[at + n]
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value
    return (value << 8) | data[at + 8]


def indexed_rows(conn: sqlite3.Connection) -> int:
    """Rows in messages_fts: the N of its BM25, kept by FTS5 in its averages record (id 1).

    One row read, where `count(*)` on messages walks the whole table.
    """
    row = conn.execute("SELECT block FROM messages_fts_data WHERE id = 1").fetchone()
    return _varint(row[0], 0) if row and row[0] else 0


class TermCounts:
    """How many indexed messages say each term in their own words, cached for COUNTS_TTL_S; thread-safe."""

    def __init__(self, *, ttl: float = COUNTS_TTL_S, size: int = COUNTS_CACHED_TERMS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._size = size
        self._clock = clock
        self._lock = threading.Lock()
        self._terms: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self._rows: tuple[int, float] | None = None

    def lookup(self, conn: sqlite3.Connection, terms: Sequence[str]) -> tuple[dict[str, int], int]:
        """Document counts of `terms` and the number of indexed rows, from the cache or the index."""
        now = self._clock()
        known: dict[str, int] = {}
        with self._lock:
            for term in terms:
                cached = self._terms.get(term)
                if cached is not None and cached[1] > now:
                    known[term] = cached[0]
                    self._terms.move_to_end(term)
            rows = self._rows[0] if self._rows is not None and self._rows[1] > now else None
        missing = [t for t in terms if t not in known]
        fetched = dict.fromkeys(missing, 0)
        if missing:
            # fts5vocab counts a term by walking its doclist: cheap for a rare term, and a
            # common one is asked often enough to stay cached.
            fetched.update(conn.execute(f"SELECT term, doc FROM {VOCAB_TABLE} WHERE col = ? AND term IN"
                                        " (SELECT value FROM json_each(?))", (OWN_WORDS, json.dumps(missing))))
        if rows is None:
            rows = indexed_rows(conn)
        with self._lock:
            expires = now + self._ttl
            for term, count in fetched.items():
                self._terms[term] = (count, expires)
                self._terms.move_to_end(term)
            while len(self._terms) > self._size:
                self._terms.popitem(last=False)
            self._rows = (rows, expires)
        return {**known, **fetched}, rows


def candidate_terms(terms: Sequence[str], counts: dict[str, int], rows: int) -> list[str] | None:
    """The terms a whole-history search keeps its candidates to, or None to score every match.

    `counts` are the messages saying each term. The rarest terms are kept while the
    messages saying them fit the budget; the others still count toward each candidate's
    score. The rarest term that occurs is always kept, so a search never comes back empty
    for want of a term.
    """
    budget = max(CANDIDATE_MIN_ROWS, CANDIDATE_SHARE * rows)
    present = sorted((t for t in terms if counts.get(t, 0) > 0), key=lambda t: (counts[t], t))
    kept: list[str] = []
    for term in present:
        budget -= counts[term]
        if budget < 0:
            break
        kept.append(term)
    return None if len(kept) == len(present) else kept or present[:1]


def search_messages(
    conn: sqlite3.Connection,
    counts: TermCounts,
    scope: Scope,
    terms: Sequence[str],
    *,
    agent_clause: AgentClause,
    weights: str,
    conversation_ids: Sequence[str] | None,
    exclude_conversation_id: str | None,
    limit: int,
) -> list[tuple[StoredMessage, float]]:
    """BM25 over the user's messages, best first (run on a reader thread)."""
    wanted = searchable(terms)
    query = match_query(wanted)
    if query is None or (conversation_ids is not None and not conversation_ids):
        return []
    ctes: list[str] = []
    params: list[Any] = []
    span = ""  # the rowid range the chosen conversations' messages lie in: bounds the index walk
    kept = wanted
    if conversation_ids is not None:
        ctes.append("chosen(seq) AS MATERIALIZED (SELECT seq FROM messages WHERE user_id = ?"
                    " AND conversation_id IN (SELECT value FROM json_each(?)))")
        params += [scope.user, json.dumps(list(conversation_ids))]
        span = " BETWEEN (SELECT min(seq) FROM chosen) AND (SELECT max(seq) FROM chosen)"
    else:
        kept = candidate_terms(wanted, *counts.lookup(conn, wanted)) or wanted
    # Candidates hold a kept term in their own words: the context column adds to a
    # message's score but never finds it on its own (a message is found by what it says).
    ctes.append("found(seq) AS MATERIALIZED (SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?"
                + (f" AND rowid{span} AND +rowid IN chosen)" if span else ")"))
    params += [f"{OWN_WORDS} : ({match_query(kept)})", query, scope.user]
    agent, agent_params = agent_clause(scope, "m")
    where = f"messages_fts MATCH ?{f' AND messages_fts.rowid{span}' if span else ''}"
    where += f" AND +messages_fts.rowid IN found AND m.user_id = ?{agent}"
    params += agent_params
    if exclude_conversation_id is not None:
        where += " AND m.conversation_id != ?"
        params.append(exclude_conversation_id)
    # CROSS JOIN: the index drives; given the user filter alone the planner may scan the
    # user's messages and run the MATCH once per row. Only the best rows' text is read:
    # sorting every candidate's whole row cost a fifth of the search.
    ctes.append(f"best(seq, score) AS (SELECT m.seq, -bm25(messages_fts, {weights}) AS score"
                " FROM messages_fts CROSS JOIN messages m ON m.seq = messages_fts.rowid"
                f" WHERE {where} ORDER BY score DESC, m.seq DESC LIMIT ?)")
    rows = conn.execute(
        f"WITH {', '.join(ctes)} SELECT {MESSAGE_COLUMNS}, best.score AS score FROM best"
        " CROSS JOIN messages m ON m.seq = best.seq ORDER BY best.score DESC, m.seq DESC",
        [*params, limit],
    ).fetchall()
    return [(message_from_row(row), row["score"]) for row in rows]
