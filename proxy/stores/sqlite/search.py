"""Message, entity and reasoning search on SQLite: BM25 over the user's own statistics.

A score depends on the searching user's rows and nothing else: N is the user's rows in the
index, the mean length their mean FTS5 token count, a term's rarity the user's rows saying
it. FTS5's own bm25() counts all of those over every user's rows, so another user saying a
word 400 times moved a user's score for it from 2e-06 to 5.9 (and the ranking with it):
FTS5 here only *finds* candidates, and Python scores them (sqlite.postings.scores), with
exactly the arithmetic the in-memory postings use in numpy.

Messages and entities of a user who has searched before are searched in memory
(sqlite/postings.py), their statistics counted from the same postings; FTS5 answers the
rest, the statistics then counted in the search's read transaction (sqlite/user_stats.py).
The same rows with the same scores either way (tests/test_postings.py and
tests/test_search_isolation.py hold the two side by side).

A search costs about the number of rows holding *any* query term, so it is bounded:

- a conversation-filtered search scores only that conversation's rows saying a term;
- a whole-history search of a user with more than SMALL_INDEX_ROWS rows scores only the
  rows saying the query's rarest terms (by the user's own counts), as many terms as fit in
  a budget of CANDIDATE_SHARE of the user's rows (at most CANDIDATE_MAX_ROWS), still by BM25
  over every term; only a row saying none of those (but a common word: "plan",
  "deadline") is no longer found;
- when even the rarest term is said by more rows than the budget, the newest budget's worth
  of them are the candidates (counting only rows the search may return: not a conversation
  it leaves out, nor another agent's under isolation).

A user's index of at most SMALL_INDEX_ROWS rows is searched whole: every row saying a term
is scored, as pruning there cost LoCoMo 2.5 points of recall.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

from proxy.models import Entity, ReasoningTrace, Scope, StoredMessage
from proxy.stores.sqlite.entity_index import EntityIndexes, entity_snapshot
from proxy.stores.sqlite.message_index import OWN_COLUMN, MessageIndexes
from proxy.stores.sqlite.message_index import snapshot as message_snapshot
from proxy.stores.sqlite.postings import (
    ASCII_TOKEN,
    FAST_TERM,
    Filter,
    Statistics,
    fts_tokens,
    read_transaction,
    scores,
    totals,
    varints,
)
from proxy.stores.indexed_text import steps_from_json
from proxy.stores.sqlite.rows import agent_clause, from_ts, json_tuple
from proxy.stores.sqlite.user_stats import FtsIndex, UserCounts
from proxy.stores.sqlite.user_stats import quoted as fts_quoted
from proxy.stores.search_budget import Plan

# A message is found by its own words (`terms`); the words said before it (`context`) add
# to its score but never find it on their own.
MESSAGES = FtsIndex("messages", "m", ("terms", "context"), (1.0, 0.3),
                    "m.id, m.conversation_id, m.role, m.content, m.created_at", finding_column=OWN_COLUMN)
MESSAGE_WEIGHTS = MESSAGES.weights
ENTITIES = FtsIndex("entities", "e", ("name_terms", "type_terms", "description_terms"), (2.0, 1.0, 1.0),
                    "e.id, e.name, e.type, e.description, e.memory_type, e.confidence, e.tags, e.aliases,"
                    " e.provenance")
ENTITY_WEIGHTS = ENTITIES.weights
# What a trace hit is built from: these alone, not the index text stored beside them (a
# trace's is as long as the trace).
REASONING = FtsIndex("reasoning", "x", ("terms",), (1.0,),
                     "x.id, x.conversation_id, x.task, x.steps, x.answer, x.created_at")

# A hit read back is a plain tuple, its rowid first and then its index's `columns` in order:
# a search builds dozens a request, and sqlite3.Row's lookups by name cost a third more.
Values = tuple[Any, ...]


def _message(v: Values) -> StoredMessage:
    return StoredMessage(v[1], v[2], v[3], v[4], from_ts(v[5]))


def _entity(v: Values) -> Entity:
    return Entity(v[1], v[2], v[3], v[4], v[5], v[6], json_tuple(v[7]), json_tuple(v[8]), json_tuple(v[9]))


def _trace(v: Values) -> ReasoningTrace:
    return ReasoningTrace(v[1], v[2], v[3], steps_from_json(v[4]), v[5], from_ts(v[6]))


# Each kind's table, as a hit of it is read, and the item built from the values read: a vector
# hit the lexical stream missed is read back by its id the same way (sqlite/vectors.py).
HIT_READS: dict[str, tuple[FtsIndex, Callable[[Values], Any]]] = {
    "message": (MESSAGES, _message), "entity": (ENTITIES, _entity), "reasoning": (REASONING, _trace),
}


class PostingsNotReady(Exception):
    """A search asked to use the user's postings only found them not built or not current: FTS5
    must answer it, on a reader thread (store.py runs postings searches on the event loop)."""


def match_query(terms: Sequence[str]) -> str | None:
    """An FTS5 query matching any of the terms, each quoted so no term is an operator."""
    quoted = [fts_quoted(t) for t in searchable(terms)]
    return " OR ".join(quoted) or None


def searchable(terms: Sequence[str]) -> list[str]:
    """The distinct terms an FTS5 query can hold (a term with no letter or digit matches nothing)."""
    return [t for t in dict.fromkeys(terms) if any(c.isalnum() for c in t)]


def _tokens(docsize: bytes | None) -> float:
    """A row's tokens, from its FTS5 docsize record."""
    return float(sum(varints(docsize))) if docsize else 0.0


def indexed_rows(conn: sqlite3.Connection, index: FtsIndex = MESSAGES) -> int:
    """Rows in the whole index (every user's), kept by FTS5 in its averages record (id 1).

    One row read, where `count(*)` on the table walks all of it.
    """
    row = conn.execute(f"SELECT block FROM {index.fts}_data WHERE id = 1").fetchone()
    return totals(row[0] if row else None)[0]


def search_messages(
    conn: sqlite3.Connection,
    counts: UserCounts,
    indexes: MessageIndexes,
    scope: Scope,
    terms: Sequence[str],
    *,
    conversation_ids: Sequence[str] | None,
    exclude_conversation_id: str | None,
    limit: int,
    postings_only: bool = False,
) -> list[tuple[StoredMessage, float]]:
    """BM25 over the user's messages with the user's statistics, best first: from the user's
    postings when they are built (sqlite/message_index.py), else FTS5 finds and `scores` ranks;
    the same either way. `postings_only`: PostingsNotReady instead of FTS5.

    A message the postings ranked is read back from the table, unless they kept it from an
    earlier search: a message never changes without `search_epoch` moving (schema v7: any
    column), and postings built before it moved are never searched again.
    """
    wanted = searchable(terms)
    if not wanted or (conversation_ids is not None and not conversation_ids):
        return []
    whole_history = conversation_ids is None
    with read_transaction(conn):
        seen = message_snapshot(conn)
        postings = indexes.ready(conn, scope.user, seen, on_loop=postings_only) if indexes.enabled and _plain(wanted) else None
        if postings is None:
            if postings_only:
                raise PostingsNotReady
            stats, own = counts.statistics(conn, scope.user, wanted, seen.visible_seq, seen.epoch)
            wanted = _said(wanted, stats)
            if not wanted:
                return []
            plan = Plan.of(wanted, own, stats.rows, whole_history=whole_history)
            where, params = agent_clause(scope, MESSAGES.alias)
            if exclude_conversation_id is not None:
                where += f" AND {MESSAGES.alias}.conversation_id != ?"
                params.append(exclude_conversation_id)
            best = _search(conn, MESSAGES, scope, plan, stats, where, params, conversation_ids, limit)
            return [(_message(row), score) for row, score in _read_back(conn, MESSAGES, scope, best)]
        allowed = Filter(conversation_ids, exclude_conversation_id, scope.agent_isolated, scope.agent)
        with _locked(postings.lock, postings_only):
            stats, own = postings.statistics(wanted, seen.visible_seq)
            plan = Plan.of(wanted, own, stats.rows, whole_history=whole_history)
            best = postings.search(plan.terms, plan.finding, stats, allowed, plan.newest, limit, seen.visible_seq)
            kept = {seq: cast(StoredMessage, hit) for seq, _ in best if (hit := postings.hit(seq)) is not None}
        unread = [(seq, score) for seq, score in best if seq not in kept]
        read = {row[0]: _message(row) for row, _ in _read_back(conn, MESSAGES, scope, unread)}
        if read and postings.lock.acquire(blocking=not postings_only):  # busy: kept another time
            try:
                for seq, message in read.items():
                    postings.keep_hit(seq, message, len(message.content))
            finally:
                postings.lock.release()
        found = {**kept, **read}
        return [(found[seq], score) for seq, score in best if seq in found]


def search_entities(
    conn: sqlite3.Connection, counts: UserCounts, indexes: EntityIndexes, scope: Scope, terms: Sequence[str], *,
    limit: int, postings_only: bool = False,
) -> list[tuple[Entity, float]]:
    """BM25 over the user's entities (name, type, description) with the user's statistics, best
    first: from the user's postings when they are built (sqlite/entity_index.py), else FTS5
    finds and `scores` ranks; the same either way. `postings_only`: PostingsNotReady instead of FTS5."""
    wanted = searchable(terms)
    if not wanted:
        return []
    with read_transaction(conn):
        postings = (indexes.ready(conn, scope.user, entity_snapshot(conn), on_loop=postings_only) if indexes.enabled and _plain(wanted)
                    else None)
        if postings is None:
            if postings_only:
                raise PostingsNotReady
            # Entities change in place, logged without their text: the counts are kept until
            # any entity changes (the change log's AUTOINCREMENT never goes back).
            changes = conn.execute("SELECT ifnull((SELECT seq FROM sqlite_sequence WHERE name = 'entity_changes'),"
                                   " 0)").fetchone()[0]
            stats, saying = counts.statistics(conn, scope.user, wanted, 0, changes)
            wanted = _said(wanted, stats)
            if not wanted:
                return []
            plan = Plan.of(wanted, saying, stats.rows, whole_history=True)
            where, params = agent_clause(scope, ENTITIES.alias)
            best = _search(conn, ENTITIES, scope, plan, stats, where, params, None, limit)
        else:
            with _locked(postings.lock, postings_only):
                stats, saying = postings.statistics(wanted)
                plan = Plan.of(wanted, saying, stats.rows, whole_history=True)
                best = postings.search(plan.terms, plan.finding, stats,
                                       Filter(agent_isolated=scope.agent_isolated, agent=scope.agent),
                                       plan.newest, limit)
        return [(_entity(row), score) for row, score in _read_back(conn, ENTITIES, scope, best)]


def search_reasoning(
    conn: sqlite3.Connection, counts: UserCounts, scope: Scope, terms: Sequence[str], *, limit: int,
) -> list[tuple[ReasoningTrace, float]]:
    """BM25 over the user's reasoning traces (task, steps, answer) with the user's statistics,
    best first (run on a reader thread): of the scope's agent whenever it names one (traces
    are per agent). FTS5 finds, `scores` ranks: a user's traces are few, and a third postings
    builder beside the messages' and entities' took the GIL from the first searches."""
    wanted = searchable(terms)
    if not wanted:
        return []
    with read_transaction(conn):
        newest, epoch = conn.execute("SELECT (SELECT ifnull(max(seq), 0) FROM reasoning),"
                                     " (SELECT epoch FROM reasoning_epoch WHERE id = 1)").fetchone()
        stats, saying = counts.statistics(conn, scope.user, wanted, newest, epoch or 0)
        wanted = _said(wanted, stats)
        if not wanted:
            return []
        where, params = agent_clause(scope, REASONING.alias, per_agent=True)
        plan = Plan.of(wanted, saying, stats.rows, whole_history=True)
        best = _search(conn, REASONING, scope, plan, stats, where, params, None, limit)
        return [(_trace(row), score) for row, score in _read_back(conn, REASONING, scope, best)]


@contextmanager
def _locked(lock: threading.Lock, on_loop: bool) -> Iterator[None]:
    """`lock` held for the block; on the event loop only if it is free at once (a reader thread
    holding it for a catch-up would stop the loop): else PostingsNotReady, and a thread waits."""
    if not lock.acquire(blocking=not on_loop):
        raise PostingsNotReady
    try:
        yield
    finally:
        lock.release()


def _said(terms: list[str], stats: Statistics) -> list[str]:
    """The terms some row of the user says: one no row says matches nothing and adds nothing
    to a score, but FTS5 would still walk it."""
    return [t for t in terms if stats.rows_saying.get(t, 0) > 0]


def _plain(terms: Sequence[str]) -> bool:
    """True when FTS5 keeps every term as one token: the postings can match them (a phrase is FTS5's)."""
    return all(FAST_TERM.fullmatch(t) for t in terms)


def _read_back(conn: sqlite3.Connection, index: FtsIndex, scope: Scope, best: list[tuple[int, float]]
                ) -> list[tuple[Values, float]]:
    """The rows ranked, in their order, read from the table (a row gone since is left out)."""
    if not best:
        return []
    t = index.alias
    cursor = conn.cursor()
    cursor.row_factory = None
    found = {row[0]: row for row in cursor.execute(
        f"SELECT {t}.seq, {index.columns} FROM json_each(?) j CROSS JOIN {index.table} {t} ON {t}.seq = j.value"
        f" WHERE {t}.user_id = ?", [json.dumps([seq for seq, _ in best]), scope.user])}
    return [(found[seq], score) for seq, score in best if seq in found]


def _search(
    conn: sqlite3.Connection, index: FtsIndex, scope: Scope, plan: Plan, stats: Statistics,
    where: str, params: list[Any], conversation_ids: Sequence[str] | None, limit: int,
) -> list[tuple[int, float]]:
    """(rowid, score) of the user's best `limit` rows by `plan`, within the bounds above: FTS5
    finds the candidates, their indexed text is scored by `scores` with the user's `stats`."""
    query = match_query(plan.terms)
    if query is None:
        return []
    fts, t = index.fts, index.alias
    args: list[Any] = []
    if conversation_ids is not None:
        # The rows the search may return are picked first; the rowid range they span bounds
        # the index walk, a membership test picks them out.
        found = (f"chosen(seq) AS MATERIALIZED (SELECT {t}.seq FROM {index.table} {t} WHERE {t}.user_id = ?"
                 f" AND {t}.conversation_id IN (SELECT value FROM json_each(?)){where}),"
                 f" found(seq) AS MATERIALIZED (SELECT rowid FROM {fts} WHERE {fts} MATCH ?"
                 " AND rowid BETWEEN (SELECT min(seq) FROM chosen) AND (SELECT max(seq) FROM chosen)"
                 " AND +rowid IN chosen)")
        args += [scope.user, json.dumps(list(conversation_ids)), *params, index.finding(query)]
    else:
        # The user's newest rows saying a finding term (of those the search may return): all
        # of them unless the rarest term alone is said more often than the budget allows.
        # CROSS JOIN: the index drives; given the user filter alone the planner may scan the
        # user's rows and run the MATCH once per row.
        found = (f"found(seq) AS MATERIALIZED (SELECT {fts}.rowid FROM {fts} CROSS JOIN {index.table} {t}"
                 f" ON {t}.seq = {fts}.rowid WHERE {fts} MATCH ? AND {t}.user_id = ?{where}"
                 f" ORDER BY {fts}.rowid DESC LIMIT ?)")
        args += [index.finding(match_query(plan.finding) or query), scope.user, *params,
                 -1 if plan.newest is None else plan.newest]  # -1: no LIMIT
    text = ", ".join(f"{t}.{column}" for column in index.indexed)
    rows = conn.execute(
        f"WITH {found} SELECT {t}.seq, d.sz, {text} FROM found CROSS JOIN {index.table} {t} ON {t}.seq = found.seq"
        f" CROSS JOIN {fts}_docsize d ON d.id = {t}.seq", args).fetchall()
    wanted = [(term, tokens) for term in plan.terms if (tokens := fts_tokens(term))]
    # Plain terms in ASCII text (most searches) are counted among the row's runs of
    # [a-z0-9_], split by one fixed pattern: tokenising whole rows as FTS5 does cost ~30 us a
    # candidate, and a pattern made of the query's terms cost a compile, ~0.4 ms, per query.
    plain = frozenset(plan.terms) if _plain(plan.terms) else None
    scored = scores(stats, plan.terms, (
        (row[0], _frequencies(row[2:], index.weights, wanted, plain), _tokens(row[1])) for row in rows))
    scored.sort(key=lambda hit: (-hit[1], -hit[0]))
    return scored[:limit]


def _frequencies(columns: Sequence[str], weights: Sequence[float], terms: list[tuple[str, list[str]]],
                 plain: frozenset[str] | None) -> dict[str, float]:
    """A row's weighted frequency of each query term (given with the tokens FTS5 reads it as:
    `Zoë` is `zoe`, `北京` two characters, a phrase; `plain` the terms when all are plain,
    then found among ASCII text's tokens): its instances' column weights added one by one, column by column, as
    sqlite.postings.term_frequencies adds them."""
    freqs: dict[str, float] = {}
    if plain is not None and all(text.isascii() for text in columns):
        for text, weight in zip(columns, weights, strict=True):
            for token in ASCII_TOKEN.findall(text.lower()):
                if token in plain:
                    freqs[token] = freqs.get(token, 0.0) + weight
        return freqs
    said = [fts_tokens(text) for text in columns]
    for term, tokens in terms:
        freq = 0.0
        for row_tokens, weight in zip(said, weights, strict=True):
            for _ in range(_instances(row_tokens, tokens)):
                freq += weight
        if freq:
            freqs[term] = freq
    return freqs


def _instances(said: list[str], tokens: list[str]) -> int:
    """How often `tokens` stand in `said`, in order."""
    if len(tokens) == 1:
        return said.count(tokens[0])
    return sum(said[at:at + len(tokens)] == tokens for at in range(len(said) - len(tokens) + 1))
