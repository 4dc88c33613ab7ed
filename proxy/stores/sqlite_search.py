"""Message, entity and reasoning search on SQLite: FTS5 BM25 whose cost follows the query's rare terms.

FTS5 scores every row its MATCH yields, and the statement then reads each one's row to
check the user; walking the doclists themselves is cheaper, but not free. So a search costs
about the number of rows holding *any* query term, and a term found in a tenth of all
messages ("plan", "deadline") made a search of a 100k-message history take 20-40 ms. Bounds:

- a conversation-filtered search scores only that conversation's rows: the rowid range
  they span bounds the index walk, a membership test picks them out (`rowid IN (...)`
  used as an index would rerun the BM25 statistics once per row: 0.3 s for 50 conversations);
- a whole-history search scores only the rows saying the query's rarest terms, as many
  terms as fit in a budget of CANDIDATE_SHARE of the indexed rows (at most
  CANDIDATE_MAX_ROWS), still by BM25 over every
  term, so a hit ranks as it did; only a row saying none of those (but a common word:
  "plan", "deadline") is no longer found. How many rows say each term comes from an
  fts5vocab table, kept exact from then on (sqlite_term_counts.py) for messages as rows
  arrive and for entities as their text changes; for traces cached briefly. On
  bench/retrieval.py's 100k-message history the hits were the unbounded search's for all
  200 queries, at a quarter of its cost; at 10k, for 187 (the first hit for 199);
- when even the rarest term is said by more rows than the budget (a user who asks the
  same kind of question every day), the newest budget's worth of them are the candidates
  (counting only rows the search may return: not a conversation it leaves out, nor another
  agent's under isolation), and the index walk is kept to the rowids they span, so no
  search grows with the history.

Messages and entities of a user who has searched before are searched in memory
(sqlite_postings.py) with the same plan and bm25() to the bit; FTS5 answers the rest.

A small index (SMALL_INDEX_ROWS) is searched whole: scoring all of it costs what the bounds
would, and pruning there cost LoCoMo 2.5 points of recall.

BM25 statistics stay the whole corpus's either way: FTS5 counts each term over its doclist.

Not done: a per-user token in the index (a column weighted 0), ANDed into every MATCH so
the index rather than a join keeps other users' rows out. Measured at 100k messages (130k
rows): a user holding a tenth of the rows searched up to 7x faster, but the user holding
most of them up to 2x slower (BM25 walks the token's doclist, as long as the user's
history, to count it), and every full-text index would have to be rebuilt.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from proxy.models import Entity, ReasoningTrace, Scope, StoredMessage
from proxy.stores.sqlite_entity_index import (
    EntityIndexes,
    EntityTermCounts,
    entity_snapshot,
)
from proxy.stores.sqlite_message_index import (
    OWN_COLUMN,
    VOCAB_ROWS,
    MessageIndexes,
    MessageTermCounts,
)
from proxy.stores.sqlite_message_index import snapshot as message_snapshot
from proxy.stores.sqlite_postings import (
    FAST_TERM,
    Filter,
    fts_tokens,
    read_transaction,
    rows_saying,
    totals,
)
from proxy.stores.sqlite_rows import (
    agent_clause,
    entity_from_row,
    message_from_row,
    trace_from_row,
)
from proxy.stores.sqlite_term_counts import LoggedTermCounts, LogPosition

# A whole-history search scores the rows saying its rarest terms, as many terms as this
# share of the indexed rows holds...
CANDIDATE_SHARE = 0.03
# ...never fewer than this many rows...
CANDIDATE_MIN_ROWS = 200
# ...and never more: BM25 costs FTS5 1-2 us a row, so no search scores more than this many.
CANDIDATE_MAX_ROWS = 1000
# An index this small is searched whole: it costs what the budget above would allow.
SMALL_INDEX_ROWS = CANDIDATE_MAX_ROWS


@dataclass(frozen=True)
class FtsIndex:
    """An external-content FTS5 index over `table`, searched by BM25 with these column weights."""

    table: str
    alias: str
    weights: str
    columns: str  # what a hit is built from, read only for the best rows
    finding_column: str | None = None  # a row is found by a term in this column only (None: any)

    @property
    def fts(self) -> str:
        return f"{self.table}_fts"

    @property
    def vocab(self) -> str:
        return f"temp.{self.table}_vocab"

    def finding(self, query: str) -> str:
        """The MATCH expression that finds candidates for `query`."""
        return f"{self.finding_column} : ({query})" if self.finding_column else query


# A message is found by its own words (`terms`); the words said before it (`context`) add
# to its score but never find it on their own.
MESSAGES = FtsIndex("messages", "m", "1.0, 0.3", "m.id, m.conversation_id, m.role, m.content, m.created_at",
                    finding_column=OWN_COLUMN)
MESSAGE_WEIGHTS = tuple(float(w) for w in MESSAGES.weights.split(","))  # own words, context
ENTITIES = FtsIndex("entities", "e", "2.0, 1.0, 1.0",
                    "e.id, e.name, e.type, e.description, e.memory_type, e.confidence, e.tags, e.aliases,"
                    " e.provenance")
ENTITY_WEIGHTS = tuple(float(w) for w in ENTITIES.weights.split(","))  # name, type, description
# What trace_from_row reads: a hit is built from these alone, not from the index text
# stored beside them (a trace's is as long as the trace).
REASONING = FtsIndex("reasoning", "x", "1.0", "x.id, x.conversation_id, x.task, x.steps, x.answer, x.created_at")
_AS_INDEXED = re.compile(r"[a-z0-9_]+")  # a term the vocabulary holds as written (unicode61 folds the rest)


def match_query(terms: Sequence[str]) -> str | None:
    """An FTS5 query matching any of the terms, each quoted so no term is an operator."""
    quoted = ['"' + t.replace('"', '""') + '"' for t in searchable(terms)]
    return " OR ".join(quoted) or None


def searchable(terms: Sequence[str]) -> list[str]:
    """The distinct terms an FTS5 query can hold (a term with no letter or digit matches nothing)."""
    return [t for t in dict.fromkeys(terms) if any(c.isalnum() for c in t)]


def prepare_reader(conn: sqlite3.Connection) -> None:
    """Per read connection: the vocabulary tables the term counts come from (temp: nothing is written)."""
    for index in (MESSAGES, ENTITIES, REASONING):
        kind = "col" if index.finding_column else "row"
        conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS {index.vocab} USING fts5vocab(main, {index.fts}, {kind})")
    # Messages are also counted in any column, for bm25()'s IDF (sqlite_message_index.MessageTermCounts,
    # which reads MESSAGES.vocab as VOCAB_COLUMNS).
    conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS {VOCAB_ROWS} USING fts5vocab(main, {MESSAGES.fts}, row)")


def indexed_rows(conn: sqlite3.Connection, index: FtsIndex = MESSAGES) -> int:
    """Rows in the index: the N of its BM25, kept by FTS5 in its averages record (id 1).

    One row read, where `count(*)` on the table walks all of it.
    """
    row = conn.execute(f"SELECT block FROM {index.fts}_data WHERE id = 1").fetchone()
    return totals(row[0] if row else None)[0]


@dataclass(frozen=True)
class ReasoningSnapshot:
    """What a read transaction sees of the traces: rows indexed, the newest rowid, `reasoning_epoch`."""

    rows: int
    newest: int
    epoch: int


def reasoning_snapshot(conn: sqlite3.Connection) -> ReasoningSnapshot:
    """One statement: the newest rowid, `reasoning_epoch` (schema v7), and FTS5's row count."""
    newest, epoch, averages = conn.execute(
        "SELECT (SELECT ifnull(max(seq), 0) FROM reasoning), (SELECT epoch FROM reasoning_epoch WHERE id = 1),"
        f" (SELECT block FROM {REASONING.fts}_data WHERE id = 1)").fetchone()
    return ReasoningSnapshot(totals(averages)[0], newest, epoch or 0)


class ReasoningTermCounts(LoggedTermCounts):
    """How many traces of the whole index say each term (a search's candidate plan), exact for
    the search's snapshot. Traces are only appended, so the rows committed since the last
    lookup are the log; `reasoning_epoch` moving (a trace deleted or changed) drops every count."""

    def lookup(self, conn: sqlite3.Connection, terms: Sequence[str], seen: ReasoningSnapshot) -> dict[str, int]:
        """Rows saying each term, in `seen`."""
        found = self.exact(conn, terms, LogPosition(seen.newest, generation=seen.epoch))
        return {term: counts[0] for term, counts in found.items()}

    def _read(self, conn: sqlite3.Connection, terms: Sequence[str]) -> dict[str, list[int]]:
        return {term: [count] for term, count in rows_saying(conn, REASONING.vocab, terms).items()}

    def _add_changes(self, conn: sqlite3.Connection, counts: MutableMapping[str, tuple[int, ...]], after: int,
                     upto: int) -> None:
        for (terms,) in conn.execute("SELECT terms FROM reasoning WHERE seq > ? AND seq <= ?", (after, upto)):
            for token in set(fts_tokens(terms)):
                if (count := counts.get(token)) is not None:
                    counts[token] = (count[0] + 1,)


def candidate_terms(terms: Sequence[str], counts: dict[str, int], rows: int) -> list[str] | None:
    """The terms a whole-history search keeps its candidates to, or None to score every match.

    `counts` are the rows saying each term. The rarest terms are kept while the rows saying
    them fit the budget; the others still count toward each candidate's score. The rarest
    term that occurs is always kept, so a search never comes back empty for want of a term.
    """
    if rows <= SMALL_INDEX_ROWS:
        return None
    budget = candidate_budget(rows)
    present = sorted((t for t in terms if counts.get(t, 0) > 0), key=lambda t: (counts[t], t))
    kept: list[str] = []
    for term in present:
        budget -= counts[term]
        if budget < 0:
            break
        kept.append(term)
    return None if len(kept) == len(present) else kept or present[:1]


def candidate_budget(rows: int) -> int:
    """The most candidates a whole-history search of an index of `rows` rows scores."""
    return min(CANDIDATE_MAX_ROWS, max(CANDIDATE_MIN_ROWS, int(CANDIDATE_SHARE * rows)))


@dataclass(frozen=True)
class Plan:
    """Which rows a search scores: those saying one of `finding` (in the finding column), the
    newest `newest` of them when set; each scored over every one of `terms`."""

    terms: list[str]
    finding: list[str]
    newest: int | None

    @staticmethod
    def of(terms: list[str], counts: dict[str, int], rows: int, *, whole_history: bool) -> Plan:
        """A conversation search scores all its rows saying a term; a whole-history search keeps to its
        rarest terms within the budget (`counts`: rows saying each term, of `rows` indexed)."""
        if not whole_history:
            return Plan(terms, terms, None)
        return Plan(terms, candidate_terms(terms, counts, rows) or terms,
                    candidate_budget(rows) if rows > SMALL_INDEX_ROWS else None)


def search_messages(
    conn: sqlite3.Connection,
    counts: MessageTermCounts,
    indexes: MessageIndexes,
    scope: Scope,
    terms: Sequence[str],
    *,
    conversation_ids: Sequence[str] | None,
    exclude_conversation_id: str | None,
    limit: int,
) -> list[tuple[StoredMessage, float]]:
    """BM25 over the user's messages, best first (run on a reader thread): from the user's
    postings when they are built (sqlite_message_index.py), else FTS5; the same either way.

    A message the postings ranked is read back from the table, unless they kept it from an
    earlier search: a message never changes without `search_epoch` moving (schema v7: any
    column), and postings built before it moved are never searched again.
    """
    wanted = searchable(terms)
    if not wanted or (conversation_ids is not None and not conversation_ids):
        return []
    with read_transaction(conn):
        seen = message_snapshot(conn)
        own, anywhere = counts.lookup(conn, wanted, seen)
        plan = Plan.of(wanted, own, seen.rows, whole_history=conversation_ids is None)
        postings = indexes.ready(conn, scope.user, seen) if indexes.enabled and _plain(wanted) else None
        if postings is None:
            where, params = agent_clause(scope, MESSAGES.alias)
            if exclude_conversation_id is not None:
                where += f" AND {MESSAGES.alias}.conversation_id != ?"
                params.append(exclude_conversation_id)
            rows = _search(conn, MESSAGES, scope, plan, where, params, conversation_ids, limit)
            return [(message_from_row(row), row["score"]) for row in rows]
        where = Filter(conversation_ids, exclude_conversation_id, scope.agent_isolated, scope.agent)
        with postings.lock:
            best = postings.search(plan.terms, plan.finding, seen.statistics(anywhere), where, plan.newest, limit,
                                   seen.visible_seq)
            kept = {seq: cast(StoredMessage, hit) for seq, _ in best if (hit := postings.hit(seq)) is not None}
        unread = [(seq, score) for seq, score in best if seq not in kept]
        read = {row["seq"]: message_from_row(row) for row, _ in _read_back(conn, MESSAGES, scope, unread)}
        if read:
            with postings.lock:
                for seq, message in read.items():
                    postings.keep_hit(seq, message, len(message.content))
        found = {**kept, **read}
        return [(found[seq], score) for seq, score in best if seq in found]


def search_entities(
    conn: sqlite3.Connection, counts: EntityTermCounts, indexes: EntityIndexes, scope: Scope, terms: Sequence[str],
    *, limit: int,
) -> list[tuple[Entity, float]]:
    """BM25 over the user's entities (name, type, description), best first (run on a reader thread):
    from the user's postings when they are built (sqlite_entity_index.py), else FTS5; the same either way.

    The rows saying each term are exact for the search's snapshot, for the plan and for
    bm25()'s IDF alike, so the answer depends on what is stored and nothing else.
    """
    wanted = searchable(terms)
    if not wanted:
        return []
    with read_transaction(conn):
        seen = entity_snapshot(conn)
        saying = counts.lookup(conn, wanted, seen)
        wanted = _said(wanted, saying)
        if not wanted:
            return []
        plan = Plan.of(wanted, saying, seen.rows, whole_history=True)
        postings = indexes.ready(conn, scope.user, seen) if indexes.enabled and _plain(wanted) else None
        if postings is None:
            where, params = agent_clause(scope, ENTITIES.alias)
            return [(entity_from_row(row), row["score"])
                    for row in _search(conn, ENTITIES, scope, plan, where, params, None, limit)]
        where = Filter(agent_isolated=scope.agent_isolated, agent=scope.agent)
        with postings.lock:
            best = postings.search(plan.terms, plan.finding, seen.statistics(saying), where, plan.newest, limit)
        return [(entity_from_row(row), score) for row, score in _read_back(conn, ENTITIES, scope, best)]


def search_reasoning(
    conn: sqlite3.Connection, counts: ReasoningTermCounts, scope: Scope, terms: Sequence[str], *, limit: int,
) -> list[tuple[ReasoningTrace, float]]:
    """BM25 over the user's reasoning traces (task, steps, answer), best first (run on a reader thread):
    of the scope's agent whenever it names one (traces are per agent)."""
    wanted = searchable(terms)
    if not wanted:
        return []
    with read_transaction(conn):
        seen = reasoning_snapshot(conn)
        saying = counts.lookup(conn, wanted, seen)
        wanted = _said(wanted, saying)
        if not wanted:
            return []
        where, params = agent_clause(scope, REASONING.alias, per_agent=True)
        plan = Plan.of(wanted, saying, seen.rows, whole_history=True)
        return [(trace_from_row(row), row["score"])
                for row in _search(conn, REASONING, scope, plan, where, params, None, limit)]


def _said(terms: list[str], counts: dict[str, int]) -> list[str]:
    """The terms some row says. One no row says matches nothing and adds nothing to a score, but
    FTS5 still walks it (a zero count is never a cached one). A term the tokenizer would fold
    (`INTERNAL_HBR`) is counted under another spelling: kept."""
    return [t for t in terms if counts.get(t, 0) > 0 or not _AS_INDEXED.fullmatch(t)]


def _plain(terms: Sequence[str]) -> bool:
    """True when FTS5 keeps every term as one token: the postings can match them (a phrase is FTS5's)."""
    return all(FAST_TERM.fullmatch(t) for t in terms)


def _read_back(conn: sqlite3.Connection, index: FtsIndex, scope: Scope, best: list[tuple[int, float]]
               ) -> list[tuple[sqlite3.Row, float]]:
    """The rows the postings ranked, in their order, read from the table (a row gone since is left out)."""
    if not best:
        return []
    t = index.alias
    found = {row["seq"]: row for row in conn.execute(
        f"SELECT {t}.seq, {index.columns} FROM json_each(?) j CROSS JOIN {index.table} {t} ON {t}.seq = j.value"
        f" WHERE {t}.user_id = ?", [json.dumps([seq for seq, _ in best]), scope.user])}
    return [(found[seq], score) for seq, score in best if seq in found]


def _search(
    conn: sqlite3.Connection, index: FtsIndex, scope: Scope, plan: Plan,
    where: str, params: list[Any], conversation_ids: Sequence[str] | None, limit: int,
) -> list[sqlite3.Row]:
    """The best `limit` rows of the user by `plan`, each with its score, within the bounds above."""
    query = match_query(plan.terms)
    if query is None:
        return []
    fts, t = index.fts, index.alias
    if conversation_ids is None and plan.newest is None and index.finding_column is None:
        # A small index, searched whole: the rows saying a term are scored as they are found.
        return conn.execute(
            f"WITH best(seq, score) AS (SELECT {fts}.rowid, -bm25({fts}, {index.weights}) AS score FROM {fts}"
            f" CROSS JOIN {index.table} {t} ON {t}.seq = {fts}.rowid WHERE {fts} MATCH ? AND {t}.user_id = ?{where}"
            f" ORDER BY score DESC, {fts}.rowid DESC LIMIT ?) SELECT {index.columns}, best.score AS score FROM best"
            f" CROSS JOIN {index.table} {t} ON {t}.seq = best.seq ORDER BY best.score DESC, {t}.seq DESC",
            [query, scope.user, *params, limit],
        ).fetchall()
    ctes: list[str] = []
    args: list[Any] = []
    # The rows the search may return (the user's, the agent's under isolation, outside a
    # conversation left out) are picked before the budget: a long current conversation
    # or another agent's history once filled it, and cross-session found nothing.
    if conversation_ids is not None:
        ctes.append(f"chosen(seq) AS MATERIALIZED (SELECT {t}.seq FROM {index.table} {t} WHERE {t}.user_id = ?"
                    f" AND {t}.conversation_id IN (SELECT value FROM json_each(?)){where})")
        args += [scope.user, json.dumps(list(conversation_ids)), *params]
        ctes.append(f"found(seq) AS MATERIALIZED (SELECT rowid FROM {fts} WHERE {fts} MATCH ?"
                    " AND rowid BETWEEN (SELECT min(seq) FROM chosen) AND (SELECT max(seq) FROM chosen)"
                    " AND +rowid IN chosen)")
        args.append(index.finding(query))
    else:
        # The user's newest rows saying a finding term: all of them unless the rarest term
        # alone is said more often than the budget allows. CROSS JOIN: the index drives;
        # given the user filter alone the planner may scan the user's rows and run the
        # MATCH once per row.
        ctes.append(f"found(seq) AS MATERIALIZED (SELECT {fts}.rowid FROM {fts} CROSS JOIN {index.table} {t}"
                    f" ON {t}.seq = {fts}.rowid WHERE {fts} MATCH ? AND {t}.user_id = ?{where}"
                    f" ORDER BY {fts}.rowid DESC LIMIT ?)")
        most = -1 if plan.newest is None else plan.newest  # -1: no LIMIT
        args += [index.finding(match_query(plan.finding) or query), scope.user, *params, most]
    # The rowids the candidates span bound the walk of the scoring MATCH. Only the best
    # rows' text is read: sorting every candidate's whole row cost a fifth of the search.
    span = f" AND {fts}.rowid BETWEEN (SELECT min(seq) FROM found) AND (SELECT max(seq) FROM found)"
    ctes.append(f"best(seq, score) AS (SELECT {fts}.rowid, -bm25({fts}, {index.weights}) AS score"
                f" FROM {fts} WHERE {fts} MATCH ?{span} AND +{fts}.rowid IN found"
                f" ORDER BY score DESC, {fts}.rowid DESC LIMIT ?)")
    args += [query, limit]
    return conn.execute(
        f"WITH {', '.join(ctes)} SELECT {index.columns}, best.score AS score FROM best"
        f" CROSS JOIN {index.table} {t} ON {t}.seq = best.seq ORDER BY best.score DESC, {t}.seq DESC",
        args,
    ).fetchall()
