"""The read half of PostgresStore: saved items, exports and BM25 search (sqlite/store.py is the reference).

Search is FTS5's bm25() computed inside PostgreSQL from the inverted index of
postgres/schema.py: per-user counts (term_stats, lexicon_stats) give each term's document
frequency, N and the mean length; the query terms' postings, read through their primary
key, give each candidate's term frequency and length; all in the same statement (so the
same snapshot), and no process keeps an index that could go stale.

A whole-history search is bounded as on SQLite (search_budget.py): past SMALL_INDEX_ROWS
items of the user, only the rarer query terms find candidates (candidate_terms), and when
even the rarest is said by more items than candidate_budget, only the newest budget's worth
the search may return (newest_candidates, read newest first through the postings' key) are
scored, still by BM25 over every term with the user's statistics.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any

import asyncpg

from proxy.extracted import USER_TYPE
from proxy.models import Entity, ReasoningTrace, Relationship, Scope, StoredMessage
from proxy.stores.export_records import EXPORT_PAGE, RELATIONSHIP_SELECT, pages
from proxy.stores.postgres.rows import (
    EXPORT,
    entity_from_record,
    message_from_record,
    relationship_from_record,
    trace_from_record,
)
from proxy.stores.search_budget import Plan

_TERM = re.compile(r"\w+")  # letters and digits of any script, and "_", as the index text splits


def _terms(terms: Sequence[str]) -> list[str]:
    """Query terms as index terms: lower case, split where the index text never joins."""
    return list(dict.fromkeys(t for term in terms for t in _TERM.findall(term.lower())))


class Args(list[Any]):
    """Query parameters collected while the SQL is built: `args(value)` gives its `$n`."""

    def __call__(self, value: Any) -> str:
        self.append(value)
        return f"${len(self)}"


def agent_clause(scope: Scope, alias: str, args: Args, *, per_agent: bool = False) -> str:
    """Limit rows to the scope's agent under isolation (or always, for per-agent data)."""
    if scope.agent_isolated or (per_agent and scope.agent is not None):
        return f" AND {alias}.agent_id IS NOT DISTINCT FROM {args(scope.agent)}"
    return ""


def bm25(kind: str, table: str, alias: str, args: Args, scope: Scope, terms: list[str], *, limit: int,
         where: str = "", candidates: str = "", keep: str | None = None, own_words: bool = False) -> str:
    """The user's `limit` best items for `terms` by FTS5's bm25() (higher is better), with `score`.

    term_stats gives each query term's document frequency (so its IDF) and lexicon_stats N
    and the mean length, per user; the postings of the query terms, read through their
    primary key, give each candidate's term frequency and length. k1 = 1.2, b = 0.75 and
    the IDF floor of 1e-6 are FTS5's. Only the best `keep` (an SQL expression; all when None) are
    looked up in `table`, so a common word costs an index range of postings, never a scan of
    the user's items: `keep` must be enough for `where` (a filter on the items) to leave
    `limit`. `candidates` (a subquery of item seqs) limits the items scored, not the IDF;
    `own_words`: only items holding a term in a column that finds them (a message's own words).
    """
    user, wanted = args(scope.user), args(terms)
    # Each posting with its term's IDF: the postings of the query terms, by key.
    postings = (f"(SELECT q.doc, q.tf, q.dl, q.finds, idf.idf, idf.ord FROM {kind}_postings q JOIN idf"
                f" ON idf.term = q.term"
                f" WHERE q.user_id = {user} AND q.term = ANY({wanted}::text[])) p")
    found = " HAVING bool_or(p.finds)" if own_words else ""
    if candidates:
        # Materialised, and each candidate's posting of each term read by its whole key (LATERAL),
        # so the plan starts from the (few) candidates: left to itself the planner walked a common
        # term's postings (16,000 of them for a budget of 480) and hashed them against the
        # candidates, or read every posting of the user for each candidate; OFFSET 0 keeps it from
        # flattening the LATERAL back into such a join.
        postings = (f"cand CROSS JOIN idf CROSS JOIN LATERAL (SELECT q.doc, q.tf, q.dl, q.finds, idf.idf, idf.ord FROM"
                    f" {kind}_postings q WHERE q.user_id = {user} AND q.term = idf.term AND q.doc = cand.doc"
                    " OFFSET 0) p")
        candidates = f" cand AS MATERIALIZED (SELECT DISTINCT c.doc FROM ({candidates}) c(doc)),"
    best = "" if keep is None else f" LIMIT {keep}"
    # The statistics MATERIALIZED: a handful of rows, read once; inlined, the planner could
    # read them again for every posting.
    return (
        f"WITH s AS MATERIALIZED (SELECT sum(docs)::float8 AS n, greatest(sum(tokens), 1)::float8"
        f" / greatest(sum(docs), 1) AS avgdl FROM lexicon_stats WHERE user_id = {user} AND kind = '{kind}'),"
        f" idf AS MATERIALIZED (SELECT d.term, array_position({wanted}::text[], d.term) AS ord,"
        " greatest(ln((s.n - d.docs + 0.5) / (d.docs + 0.5)), 1e-6) AS idf"
        f" FROM (SELECT term, sum(docs) AS docs FROM term_stats WHERE user_id = {user} AND kind = '{kind}'"
        f" AND term = ANY({wanted}::text[]) GROUP BY term HAVING sum(docs) > 0) d CROSS JOIN s),{candidates}"
        # Each term's part computed as SQLite computes it and summed in the query's term order,
        # whatever order the plan reads the postings in: equal scores come out bit for bit as on
        # SQLite, so their tie falls to the newest on both stores.
        " scored AS (SELECT p.doc, sum(p.idf * ((p.tf * 2.2) / (p.tf + 1.2 * (0.25 + 0.75 * p.dl / s.avgdl)))"
        f" ORDER BY p.ord) AS score FROM {postings} CROSS JOIN s GROUP BY p.doc{found}),"
        f" best AS (SELECT doc, score FROM scored ORDER BY score DESC, doc DESC{best})"
        f" SELECT {alias}.*, best.score FROM best JOIN {table} {alias} ON {alias}.seq = best.doc"
        f" WHERE {alias}.user_id = {user}{where} ORDER BY best.score DESC, {alias}.seq DESC LIMIT {args(limit)}"
    )



def newest_candidates(kind: str, table: str, args: Args, scope: Scope, kept: list[str], most: int,
                      visible: str = "") -> str:
    """The newest `most` items of the user (those `visible`, a filter on `table` aliased v) saying a kept term.

    Each term's postings are read newest first through their primary key (user, term, doc),
    at most `most` of them, so the cost is bounded whatever the history's length.
    """
    user = args(scope.user)
    owner = f" JOIN {table} v ON v.seq = f.doc AND v.user_id = {user}" if visible else ""
    limit = args(most)
    return (f"SELECT DISTINCT c.doc FROM unnest({args(kept)}::text[]) k(term) CROSS JOIN LATERAL"
            f" (SELECT f.doc FROM {kind}_postings f{owner} WHERE f.user_id = {user} AND f.term = k.term"
            f" AND f.finds{visible} ORDER BY f.doc DESC LIMIT {limit}) c ORDER BY c.doc DESC LIMIT {limit}")


class PostgresReads:
    """Reads and searches of one user's memory (the host provides `_fetch`)."""

    matches_any_term = True  # a row holding any one of the search terms matches (Store protocol)
    lookups_on_loop = False  # every read is a round trip to the database: lookups run side by side
    # time.monotonic() of the last read the database answered (PostgresStore._fetch): a recall that
    # timed out while reads are answered met a busy store, not a broken one (memory/breaker.py).
    answered_at = float("-inf")

    async def _fetch(self, sql: str, args: Sequence[Any]) -> list[asyncpg.Record]:  # provided by PostgresStore
        raise NotImplementedError

    async def messages(self, scope: Scope, conversation_id: str, *, limit: int = 100) -> list[StoredMessage]:
        """The first `limit` messages of one conversation, oldest first."""
        args = Args()
        where = f"m.user_id = {args(scope.user)} AND m.conversation_id = {args(conversation_id)}"
        where += agent_clause(scope, "m", args)
        rows = await self._fetch(
            f"SELECT m.* FROM messages m WHERE {where} ORDER BY m.created_at, m.seq LIMIT {args(limit)}", args
        )
        return [message_from_record(row) for row in rows]

    async def reasoning(self, scope: Scope, *, limit: int = 100) -> list[ReasoningTrace]:
        """Reasoning traces of the user (of the agent when one is set), newest first."""
        args = Args()
        rows = await self._fetch(
            f"SELECT x.* FROM reasoning x WHERE x.user_id = {args(scope.user)}"
            f"{agent_clause(scope, 'x', args, per_agent=True)} ORDER BY x.created_at DESC, x.seq DESC LIMIT {args(limit)}",
            args,
        )
        return [trace_from_record(row) for row in rows]

    async def entities(self, scope: Scope) -> list[Entity]:
        """The user's entities, oldest first."""
        args = Args()
        rows = await self._fetch(
            f"SELECT e.* FROM entities e WHERE e.user_id = {args(scope.user)}{agent_clause(scope, 'e', args)}"
            " ORDER BY e.seq",
            args,
        )
        return [entity_from_record(row) for row in rows]

    async def relationships(self, scope: Scope, entity_id: str, *, current_only: bool = True,
                            limit: int | None = None) -> list[Relationship]:
        """Edges from or to one entity, the newest fact first (the `limit` newest when given)."""
        args = Args()
        user, entity = args(scope.user), args(entity_id)
        current = " AND r.invalid_at IS NULL" if current_only else ""
        rows = await self._fetch(
            f"{RELATIONSHIP_SELECT} WHERE r.user_id = {user} AND (r.from_id = {entity} OR r.to_id = {entity})"
            f"{current}{agent_clause(scope, 'r', args)} ORDER BY r.valid_from DESC, r.seq DESC LIMIT {args(limit)}",
            args,
        )
        return [relationship_from_record(row) for row in rows]

    async def user_node(self, scope: Scope) -> Entity | None:
        """The entity standing for the user (type `user`, the first made), if extraction has made one."""
        args = Args()
        rows = await self._fetch(
            f"SELECT e.* FROM entities e WHERE e.user_id = {args(scope.user)} AND e.type = {args(USER_TYPE)}"
            f"{agent_clause(scope, 'e', args)} ORDER BY e.seq LIMIT 1",
            args,
        )
        return entity_from_record(rows[0]) if rows else None

    async def export(self, scope: Scope) -> AsyncIterator[dict[str, Any]]:
        """Every exportable record of the user as the export's JSON Lines objects, in import order."""
        for alias, select, key, shape in EXPORT.tables():
            columns = ", ".join(f"{alias}.{k}" for k in key)

            def read(after: list[Any]) -> Awaitable[list[asyncpg.Record]]:
                args = Args()
                where = f"{alias}.user_id = {args(scope.user)}{agent_clause(scope, alias, args)}"
                if after:
                    where += f" AND ({columns}) > ({', '.join(args(value) for value in after)})"
                return self._fetch(f"{select} WHERE {where} ORDER BY {columns} LIMIT {args(EXPORT_PAGE)}", args)

            async for row in pages(read, key):
                yield shape(row)

    # --- retrieval: BM25 over the user's whole corpus; higher is better

    async def search_messages(self, scope: Scope, terms: Sequence[str], *,
                              conversation_ids: Sequence[str] | None = None,
                              exclude_conversation_id: str | None = None,
                              limit: int = 20) -> list[tuple[StoredMessage, float]]:
        """BM25 over the user's messages (the user's own statistics), best first.

        As sqlite/search.py: a message is found by its own words (the words before it only
        add to its score); a whole-history search holding a common term finds only messages
        holding one of its rarer terms (`candidate_terms`), still scored by every term.
        """
        wanted = _terms(terms)
        if not wanted or (conversation_ids is not None and not conversation_ids):
            return []
        sql, args = await self.message_query(scope, wanted, conversation_ids, exclude_conversation_id, limit)
        return [(message_from_record(row), row["score"]) for row in await self._fetch(sql, args)]

    async def message_query(self, scope: Scope, wanted: list[str], conversation_ids: Sequence[str] | None,
                            exclude_conversation_id: str | None, limit: int) -> tuple[str, Args]:
        """The statement of a message search, and its arguments."""
        args = Args()
        agent = agent_clause(scope, "m", args)
        where = agent
        if exclude_conversation_id is not None:
            where += f" AND m.conversation_id <> {args(exclude_conversation_id)}"
        if conversation_ids is None:
            kept, most = await self._candidate_terms(scope, "message", wanted)
            if most is not None:
                # No longer small: the newest `most` visible messages saying a kept term.
                visible = agent_clause(scope, "v", args)
                if exclude_conversation_id is not None:
                    visible += f" AND v.conversation_id <> {args(exclude_conversation_id)}"
                found = newest_candidates("message", "messages", args, scope, kept, most, visible)
                sql = bm25("message", "messages", "m", args, scope, wanted, limit=limit, where=where,
                           candidates=found, keep=args(limit))
                return sql, args
            # Small enough to score whole: every posting of the terms, read by term, is fewer
            # reads than a look-up of each candidate's (a common word is in most of them).
            keep: str | None = None  # an agent filter may drop any number
            if not agent:
                keep = args(limit)
                if exclude_conversation_id is not None:  # the excluded conversation holds at most this many
                    keep += (f" + (SELECT count(*) FROM messages WHERE user_id = {args(scope.user)}"
                             f" AND conversation_id = {args(exclude_conversation_id)})")
            return bm25("message", "messages", "m", args, scope, wanted, limit=limit, where=where, keep=keep,
                        own_words=True), args
        # A conversation's candidates are few: each one's postings are looked up.
        found = (f"SELECT f.doc FROM message_postings f WHERE f.user_id = {args(scope.user)} AND f.finds"
                 f" AND f.term = ANY({args(wanted)}::text[]) AND f.doc IN (SELECT seq FROM messages"
                 f" WHERE user_id = {args(scope.user)} AND conversation_id = ANY({args(list(conversation_ids))}::text[]))")
        return bm25("message", "messages", "m", args, scope, wanted, limit=limit, where=where, candidates=found), args

    async def _candidate_terms(self, scope: Scope, kind: str, terms: list[str]) -> tuple[list[str], int | None]:
        """A whole-history search's finding terms (the rarer ones, as search_budget.candidate_terms keeps
        them) and its candidate budget: None while the user's index is small enough to search whole."""
        rows = await self._fetch(
            "SELECT s.docs, t.term, t.n FROM (SELECT coalesce(sum(docs), 0) AS docs FROM lexicon_stats"
            " WHERE user_id = $1 AND kind = $3) s LEFT JOIN (SELECT term, sum(finding) AS n FROM term_stats"
            " WHERE user_id = $1 AND kind = $3 AND term = ANY($2::text[]) GROUP BY term) t ON true",
            [scope.user, terms, kind],
        )
        counts = {row["term"]: int(row["n"]) for row in rows if row["term"] is not None}
        docs = int(rows[0]["docs"]) if rows else 0
        plan = Plan.of(terms, counts, docs, whole_history=True)
        return plan.finding, plan.newest

    async def search_entities(
        self, scope: Scope, terms: Sequence[str], *, limit: int = 20
    ) -> list[tuple[Entity, float]]:
        """BM25 over the user's entities (name weighted 2, type, description), best first."""
        wanted = _terms(terms)
        if not wanted:
            return []
        sql, args = await self._whole_history_query(scope, "entity", "entities", "e", wanted, limit)
        return [(entity_from_record(row), row["score"]) for row in await self._fetch(sql, args)]

    async def search_reasoning(
        self, scope: Scope, terms: Sequence[str], *, limit: int = 20
    ) -> list[tuple[ReasoningTrace, float]]:
        """BM25 over the user's reasoning traces (task, steps, answer), best first."""
        wanted = _terms(terms)
        if not wanted:
            return []
        sql, args = await self._whole_history_query(scope, "reasoning", "reasoning", "x", wanted, limit,
                                                    per_agent=True)
        return [(trace_from_record(row), row["score"]) for row in await self._fetch(sql, args)]

    async def _whole_history_query(self, scope: Scope, kind: str, table: str, alias: str, wanted: list[str],
                                   limit: int, *, per_agent: bool = False) -> tuple[str, Args]:
        """An entity or reasoning search: every match while the user's index is small, else the
        newest budget's worth of visible items saying the rarer terms (as on SQLite)."""
        args = Args()
        where = agent_clause(scope, alias, args, per_agent=per_agent)
        kept, most = await self._candidate_terms(scope, kind, wanted)
        if most is None:
            return bm25(kind, table, alias, args, scope, wanted, limit=limit, where=where,
                        keep=None if where else args(limit)), args
        found = newest_candidates(kind, table, args, scope, kept, most,
                                  agent_clause(scope, "v", args, per_agent=per_agent))
        return bm25(kind, table, alias, args, scope, wanted, limit=limit, where=where, candidates=found,
                    keep=args(limit)), args
