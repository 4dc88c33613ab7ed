"""A user's own BM25 statistics on SQLite, for a search the user's postings do not answer.

BM25 reads, for one query, the user's rows in the index, their tokens (FTS5's docsize
records), and how many of the rows say each term; for messages also how many say it in
their own words (a whole-history search's candidate plan). `user_statistics` counts them
in the search's read transaction: the rows and tokens through the user's index (at 10,000
messages 3-14 ms, linear in the history), each term through its FTS5 match joined to the
user's rows (2 ms for a word in a fifth of them). So `UserCounts` keeps them per user for
a table whose rows are only appended (messages, reasoning traces): after the first search
it adds the user's rows committed since, and counts only a term not asked before. An epoch
moving (a row deleted or changed) drops the user's counts. Each answer is exact for the
read transaction it is asked in, as the postings' (sqlite.postings.UserPostings.statistics).
"""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from proxy.stores.sqlite.postings import FAST_TERM, SCAN_MAX, Statistics, fts_tokens

# Users whose counts are kept, least recently searched dropped first, and terms kept per user.
USERS_KEPT = 256
TERMS_KEPT = 2048


@dataclass(frozen=True)
class FtsIndex:
    """An external-content FTS5 index over `indexed` of `table`, searched by BM25 with these column weights."""

    table: str
    alias: str
    indexed: tuple[str, ...]  # the indexed columns, in the index's order
    weights: tuple[float, ...]  # bm25()'s weight of each
    columns: str  # what a hit is built from, read only for the best rows
    finding_column: str | None = None  # a row is found by a term in this column only (None: any)

    @property
    def fts(self) -> str:
        return f"{self.table}_fts"

    def finding(self, query: str) -> str:
        """The MATCH expression that finds candidates for `query`."""
        return f"{self.finding_column} : ({query})" if self.finding_column else query


def quoted(term: str) -> str:
    """The term as an FTS5 string: never an operator."""
    return '"' + term.replace('"', '""') + '"'


def user_totals(conn: sqlite3.Connection, index: FtsIndex, user: str, after: int = 0, upto: int | None = None
                ) -> tuple[int, int]:
    """(rows, tokens) of the user's rows in the index (those with a rowid in (after, upto] when given)."""
    t = index.alias
    where = f"{t}.user_id = ?"
    args: list[Any] = [user]
    if upto is not None:  # `+`: the rowid range drives, not the user's whole history
        where, args = f"{t}.seq > ? AND {t}.seq <= ? AND +{t}.user_id = ?", [after, upto, user]
    rows, sizes = conn.execute(
        f"SELECT count(*), group_concat(hex(d.sz), '') FROM {index.table} {t}"
        f" CROSS JOIN {index.fts}_docsize d ON d.id = {t}.seq WHERE {where}", args).fetchone()
    return rows, _varint_sum(bytes.fromhex(sizes or ""))


def _varint_sum(data: bytes) -> int:
    """The sum of the SQLite varints `data` holds, end to end (FTS5's docsize records: 7 bits a
    byte, big-endian, the high bit set on every byte but a value's last). Counts of tokens
    never reach the 9-byte form."""
    codes = np.frombuffer(data, dtype=np.uint8)
    if not (codes & 0x80).any():  # every count under 128: one byte each
        return int(codes.sum(dtype=np.int64))
    ends = np.flatnonzero(codes < 0x80)
    at = np.arange(len(codes))
    later = ends[np.searchsorted(ends, at)] - at  # bytes after this one in its value
    return int(((codes & 0x7F).astype(np.int64) << (7 * later)).sum())


def user_statistics(conn: sqlite3.Connection, index: FtsIndex, user: str, terms: Sequence[str], planned_from: int
                    ) -> tuple[Statistics, dict[str, int]]:
    """The user's own BM25 figures for `terms` in the caller's read transaction, and the rows
    saying each term in the finding column (as UserPostings.statistics gives them; counted
    only past `planned_from` rows, where a search's candidate plan reads them)."""
    rows, tokens = user_totals(conn, index, user)
    saying, finding = _saying(conn, index, user, terms, rows > planned_from)
    return Statistics(rows, tokens, saying), finding


def _saying(conn: sqlite3.Connection, index: FtsIndex, user: str, terms: Sequence[str], planned: bool
            ) -> tuple[dict[str, int], dict[str, int]]:
    """The user's rows saying each term anywhere, and in the finding column (when `planned`;
    else as anywhere), through FTS5."""
    fts, t = index.fts, index.alias
    count = (f"SELECT count(*) FROM {fts} CROSS JOIN {index.table} {t} ON {t}.seq = {fts}.rowid"
             f" WHERE {fts} MATCH ? AND {t}.user_id = ?")
    saying = {term: conn.execute(count, [quoted(term), user]).fetchone()[0] for term in terms}
    if index.finding_column is None or not planned:
        return saying, saying
    finding = {term: conn.execute(count, [index.finding(quoted(term)), user]).fetchone()[0] if saying[term] else 0
               for term in terms}
    return saying, finding


@dataclass
class _Counted:
    """One user's counts, exact up to rowid `scanned` in `epoch`."""

    epoch: int
    scanned: int
    rows: int
    tokens: int
    terms: OrderedDict[str, tuple[int, int]] = field(default_factory=OrderedDict)  # anywhere, finding column


class UserCounts:
    """Each recently searched user's statistics of an append-only index, kept exact (thread-safe).

    A table changed in place with no log of what (entities) passes the count of its changes
    as the epoch and 0 as the newest rowid: any change has the user counted again.
    """

    def __init__(self, index: FtsIndex, planned_from: int) -> None:
        self._index = index
        self._planned_from = planned_from  # past this many rows a search's plan reads the finding counts
        self._finding = index.indexed.index(index.finding_column) if index.finding_column else None
        self._lock = threading.Lock()
        self._users: OrderedDict[str, _Counted] = OrderedDict()

    def statistics(self, conn: sqlite3.Connection, user: str, terms: Sequence[str], newest: int, epoch: int
                   ) -> tuple[Statistics, dict[str, int]]:
        """`user_statistics` for a read transaction that sees rowids up to `newest` in `epoch`."""
        with self._lock:
            counted = self._users.get(user)
            if counted is not None and counted.epoch == epoch and newest < counted.scanned:
                return user_statistics(conn, self._index, user, terms, self._planned_from)  # older than the counts
            if counted is None or counted.epoch != epoch or newest - counted.scanned > SCAN_MAX:
                counted = _Counted(epoch, newest, *user_totals(conn, self._index, user))
            elif newest > counted.scanned:
                self._catch_up(conn, user, counted, newest)
            self._users[user] = counted
            self._users.move_to_end(user)
            while len(self._users) > USERS_KEPT:
                self._users.popitem(last=False)
            missing = [t for t in terms if t not in counted.terms]
            if missing:
                saying, finding = _saying(conn, self._index, user, missing, counted.rows > self._planned_from)
                counted.terms.update((t, (saying[t], finding[t])) for t in missing if FAST_TERM.fullmatch(t))
            else:
                saying, finding = {}, {}
            for term in terms:
                if term in counted.terms:
                    saying[term], finding[term] = counted.terms[term]
                    counted.terms.move_to_end(term)
            while len(counted.terms) > TERMS_KEPT:
                counted.terms.popitem(last=False)
            return Statistics(counted.rows, counted.tokens, saying), finding

    def _catch_up(self, conn: sqlite3.Connection, user: str, counted: _Counted, newest: int) -> None:
        """Add the user's rows committed after `counted.scanned`, up to `newest`."""
        rows, tokens = user_totals(conn, self._index, user, counted.scanned, newest)
        planned = counted.rows > self._planned_from  # as `_saying` counted them
        if rows and counted.terms:
            t = self._index.alias
            text = ", ".join(f"{t}.{column}" for column in self._index.indexed)
            for columns in conn.execute(f"SELECT {text} FROM {self._index.table} {t} WHERE {t}.seq > ?"
                                        f" AND {t}.seq <= ? AND +{t}.user_id = ?", [counted.scanned, newest, user]):
                said = [set(fts_tokens(column)) for column in columns]
                anywhere = set().union(*said)
                finds = anywhere if self._finding is None or not planned else said[self._finding]
                for term in anywhere.intersection(counted.terms):
                    saying, finding = counted.terms[term]
                    counted.terms[term] = (saying + 1, finding + (term in finds))
        if counted.rows <= self._planned_from < counted.rows + rows:
            counted.terms.clear()  # their finding counts were not counted: the plan reads them from now on
        counted.rows += rows
        counted.tokens += tokens
        counted.scanned = newest
