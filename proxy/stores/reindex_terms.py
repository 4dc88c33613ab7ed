"""Stored index terms made again with the current tokeniser (`memproxy reindex --terms`), on either store.

Each item keeps the terms proxy.terms made of its text when it was saved: the `*terms`
columns, and a message's `context`, made of the terms of the messages said just before it.
When the tokeniser changes (a7a6971: words of every script, where terms were ASCII only)
the items saved before keep their old terms, and the new query terms never find them.

A batch reads the next rows in the order of an index both stores have (a message's
conversation in time order, so the messages before it are at hand), computes each row's
terms from its stored text, and updates the rows whose stored terms differ. The update
fires the store's own triggers, as an edit does: FTS5 re-indexes the row on SQLite; the
postings and the per-user statistics follow on PostgreSQL. So BM25's counts stay right.

Rows are compared, not stamped with a tokeniser version: a message's context changes with
the messages before it, which a version of its own would not show; a replica still running
older code would go on writing old terms under any mark; and every write path would have
to set it. A run writes only what differs, so running again (after an interruption, or
after the next tokeniser change) rewrites nothing that is current; the price is that every
run reads and tokenises every row.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.stores.base import TERMS_TABLES, ReindexedPage, Store, TermsTable
from proxy.stores.indexed_text import (
    CONTEXT_MESSAGES,
    INDEX_MAX_CHARS,
    context_terms,
    entity_terms,
    index_terms,
    reasoning_terms,
    steps_from_json,
)

# Rows per transaction: SQLite's writers (the proxy's too) wait for each one, ~50 ms at this size.
REINDEX_BATCH = 500
# sqlite3.Row and asyncpg.Record both read by column name; neither is a typing Mapping.
Row = Any
Mark = Callable[[Any], str]  # a parameter's placeholder in the SQL being built (`?`, `$n`)


@dataclass(frozen=True)
class TermsColumns:
    """Where the index terms of one table come from and go, and the order its rows are read in."""

    table: TermsTable
    key: tuple[str, ...]  # an index of the table on both stores, user_id first
    text: tuple[str, ...]  # SQL of what the terms are made from
    terms: tuple[str, ...]  # the stored terms columns

    @property
    def columns(self) -> str:
        """What a batch reads of each row."""
        return ", ".join(dict.fromkeys(("seq", *self.key, *self.text, *self.terms)))


TERMS_COLUMNS: dict[TermsTable, TermsColumns] = {
    # Only the text index_terms reads: a pasted 5 MB message is not read whole.
    "messages": TermsColumns("messages", ("user_id", "conversation_id", "created_at", "seq"),
                             (f"substr(content, 1, {INDEX_MAX_CHARS}) AS content",), ("terms", "context")),
    "entities": TermsColumns("entities", ("user_id", "id"), ("name", "type", "description", "aliases"),
                             ("name_terms", "type_terms", "description_terms")),
    "reasoning": TermsColumns("reasoning", ("user_id", "id"), ("task", "steps", "answer"), ("terms",)),
}


def page_query(spec: TermsColumns, *, after: tuple[Any, ...] | None, limit: int, mark: Mark,
               user: str | None = None, among: str | None = None, columns: str | None = None,
               upto: tuple[Any, ...] | None = None) -> str:
    """SQL: `columns` of the next `limit` rows after the key `after` (and not past `upto`), in key order.

    `user` keeps to one user's rows (the key's other columns then bound the index range);
    `among` is SQL for the users whose rows may be read, when there are several.
    """
    where: list[str] = []
    if user is not None or among is not None:
        where.append(f"user_id = {mark(user) if user is not None else among}")
    if after is not None:
        key, values = (spec.key[1:], after[1:]) if user is not None else (spec.key, after)
        where.append(f"({', '.join(key)}) > ({', '.join(mark(value) for value in values)})")
    if upto is not None:
        where.append(f"({', '.join(spec.key)}) <= ({', '.join(mark(value) for value in upto)})")
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return (f"SELECT {columns or spec.columns} FROM {spec.table}{clause}"
            f" ORDER BY {', '.join(spec.key)} LIMIT {mark(limit)}")


def said_before_query(first: Row, mark: Mark) -> str:
    """SQL: the text of the messages said just before the message `first` in its conversation, newest first."""
    return (f"SELECT substr(content, 1, {INDEX_MAX_CHARS}) AS content FROM messages"
            f" WHERE user_id = {mark(first['user_id'])} AND conversation_id = {mark(first['conversation_id'])}"
            f" AND (created_at, seq) < ({mark(first['created_at'])}, {mark(first['seq'])})"
            f" ORDER BY created_at DESC, seq DESC LIMIT {CONTEXT_MESSAGES}")


def rewrites(spec: TermsColumns, rows: Sequence[Row], said_before: Sequence[str] = ()) -> list[tuple[Any, ...]]:
    """(terms columns..., seq) of each row whose stored terms the current tokeniser would not write.

    `said_before` is the text of the messages said just before the first row, oldest first.
    """
    fresh: list[tuple[Any, ...]]
    if spec.table == "messages":
        fresh = _message_terms(rows, said_before)
    elif spec.table == "entities":
        fresh = [entity_terms(r["name"], r["type"], r["description"], json.loads(r["aliases"])) for r in rows]
    else:
        fresh = [(reasoning_terms(r["task"], steps_from_json(r["steps"]), r["answer"]),) for r in rows]
    return [(*new, row["seq"]) for row, new in zip(rows, fresh) if new != tuple(row[c] for c in spec.terms)]


def _message_terms(rows: Sequence[Row], said_before: Sequence[str]) -> list[tuple[str, str]]:
    """(terms, context) of each message, the rows in key order (sqlite/batch.py writes them so).

    Rows come conversation by conversation, in time order: the messages before a row are the
    rows before it, but for the first conversation, which may have begun before this batch.
    """
    earlier = [index_terms(text) for text in said_before]
    out: list[tuple[str, str]] = []
    for n, row in enumerate(rows):
        if n and (row["user_id"], row["conversation_id"]) != (rows[n - 1]["user_id"], rows[n - 1]["conversation_id"]):
            earlier = []
        terms = index_terms(row["content"])
        out.append((terms, context_terms(earlier)))
        earlier = [*earlier, terms][-CONTEXT_MESSAGES:]
    return out


def page_of(spec: TermsColumns, rows: Sequence[Row], limit: int, rewritten: int,
            upto: tuple[Any, ...] | None = None) -> ReindexedPage:
    """The batch's result: a short batch was the table's last, or, read within a window that
    ends at the key `upto`, the window's last (the next batch starts after it)."""
    after = tuple(rows[-1][column] for column in spec.key) if len(rows) >= limit else upto
    return ReindexedPage(len(rows), rewritten, after)


@dataclass
class TermsCounts:
    """What `memproxy reindex --terms` did, per table: rows read, and rows whose terms it rewrote."""

    read: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TERMS_TABLES, 0))
    reindexed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TERMS_TABLES, 0))


async def reindex_all(store: Store, counts: TermsCounts, *, user: str | None = None, batch: int = REINDEX_BATCH,
                      on_batch: Callable[[TermsTable, bool], None] = lambda table, done: None) -> TermsCounts:
    """Every table's terms made again (of `user`, or everyone's), batch by batch; `counts` fill as it goes,
    and `on_batch(table, done)` is told of each batch."""
    for table in TERMS_TABLES:
        after: tuple[Any, ...] | None = None
        while True:
            page = await store.reindex_terms(table, after=after, limit=batch, user=user)
            counts.read[table] += page.read
            counts.reindexed[table] += page.rewritten
            on_batch(table, page.after is None)
            if page.after is None:
                break
            after = page.after
    return counts
