"""How many rows of a whole FTS5 index say each term, counted once and then kept current.

bm25() weighs a term by the rows of the whole index saying it, and a whole-history search
keeps its candidates to its rarest terms. FTS5 counts a term by walking its doclist, every
user's rows of it, and after each commit the walk reads its pages again: under
bench/overhead.py's load, counting an entity search's terms took 14-30% of the readers' busy
time (py-spy).

`LoggedTermCounts` counts a term through FTS5's vocabulary the first time it is asked, and
from then on adds what the table's change log says happened since: the messages committed
(sqlite_message_index.py), the entity texts replaced (sqlite_entity_index.py). Each answer
is exact for the read transaction it is asked in, so a search depends on what is stored and
nothing else. Thread-safe; the least recently asked terms are dropped past `size`.
"""

from __future__ import annotations

import sqlite3
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass

# Past this many log rows since the last lookup, the counts are dropped and read afresh
# (one vocabulary read per term asked), not tokenised row by row on the request path.
CHANGES_MAX = 2048


@dataclass(frozen=True)
class LogPosition:
    """Where a read transaction sees a change log: its newest row, its oldest kept row, and a
    generation that moves when the log cannot say what changed (counts are then dropped)."""

    newest: int
    oldest: int = 0
    generation: int = 0


class LoggedTermCounts(ABC):
    """Per term, a tuple of counts (one per kind a table counts), exact at `_scanned`.

    Tuples, replaced when a count changes, not lists changed in place: Python's garbage
    collector stops tracking a tuple of ints, so 8,192 terms a table are 8,192 objects fewer
    for each full collection to walk.
    """

    def __init__(self, size: int = 8192) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._counts: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._scanned = 0  # the counts hold every change up to this log row
        self._generation = -1

    def exact(self, conn: sqlite3.Connection, terms: Sequence[str], seen: LogPosition) -> dict[str, list[int]]:
        """Each term's counts as the read transaction that saw `seen` sees them."""
        with self._lock:
            behind = seen.newest - self._scanned
            if (seen.generation != self._generation or not self._counts or behind > CHANGES_MAX
                    or (behind > 0 and seen.oldest > self._scanned + 1)):
                self._counts.clear()
                self._generation, self._scanned = seen.generation, seen.newest
            elif behind < 0:  # an older snapshot than the counts (two reads side by side around a commit)
                return self._read(conn, terms)
            elif behind > 0:
                self._add_changes(conn, self._counts, self._scanned, seen.newest)
                self._scanned = seen.newest
            missing = [t for t in terms if t not in self._counts]
            if missing:
                self._counts.update((term, tuple(counts)) for term, counts in self._read(conn, missing).items())
            found = {}
            for term in terms:
                found[term] = list(self._counts[term])
                self._counts.move_to_end(term)
            while len(self._counts) > self._size:
                self._counts.popitem(last=False)
            return found

    @abstractmethod
    def _read(self, conn: sqlite3.Connection, terms: Sequence[str]) -> dict[str, list[int]]:
        """The terms' counts from FTS5's vocabulary, in the caller's read transaction."""

    @abstractmethod
    def _add_changes(self, conn: sqlite3.Connection, counts: MutableMapping[str, tuple[int, ...]], after: int,
                     upto: int) -> None:
        """Adjust the `counts` kept for the changes logged after row `after`, up to row `upto`."""
