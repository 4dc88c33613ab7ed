"""The users' postings of one table (sqlite/postings.py), least recently used first within a
memory bound, each built on a thread of its own and caught up before every search.

A table's subclass (sqlite/message_index.py, sqlite/entity_index.py) says how its rows are
built into postings and how the postings catch up with what was committed since.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from enum import Enum

from proxy.stores.sqlite.postings import UserPostings

log = logging.getLogger("memproxy.store")

# A user whose postings do not fit the cache are not built again for this long; after a
# failed build (the store unreadable), this long.
TOO_BIG_RETRY_S = 600.0
FAILED_RETRY_S = 60.0
# A search on the event loop catches up only postings this close to its snapshot (rowids or
# change-log rows, every user's): a catch-up walks them all, and past this many it is left
# to a reader thread, where SQLite's part of it releases the GIL.
LOOP_CATCH_UP_MAX = 256


class CatchUp(Enum):
    """What a table's catch-up made of a user's postings for one search."""

    READY = "ready"  # current for the search's snapshot
    LATER = "later"  # the snapshot is older than the postings: this search goes to FTS5
    REBUILD = "rebuild"  # stale or too far behind: dropped and built again


class PostingsCache:
    """The users' postings of one table, least recently used first, within `max_bytes`; built on a
    thread of its own. A table's subclass says how to build and how to catch up."""

    name = "postings"

    def __init__(self, path: str, pragmas: Sequence[str], max_bytes: int, weights: Sequence[float],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._path = path
        self._weights = tuple(weights)  # bm25()'s column weights, as the table's FTS5 search gives them
        self._pragmas = tuple(pragmas)
        self.max_bytes = max_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._users: OrderedDict[str, UserPostings] = OrderedDict()
        self._wanted: set[str] = set()
        self._not_before: dict[str, float] = {}  # users not to build again before then
        self._builds: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._builder: threading.Thread | None = None
        self.builds = 0  # postings built so far
        self.searches = 0  # searches the postings answered (the others went to FTS5)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def build(self, conn: sqlite3.Connection, user: str) -> UserPostings:
        """The user's postings, read in chunks (on the builder's connection, in read transactions of its own)."""
        raise NotImplementedError

    def catch_up(self, conn: sqlite3.Connection, postings: UserPostings, seen: object) -> CatchUp:
        """Bring the postings to what `conn`'s open transaction sees (`seen`: the table's snapshot)."""
        raise NotImplementedError

    def behind(self, postings: UserPostings, seen: object) -> int:
        """How far the postings are behind `seen` (rowids or change-log rows)."""
        raise NotImplementedError

    def ready(self, conn: sqlite3.Connection, user: str, seen: object, *, on_loop: bool = False) -> UserPostings | None:
        """The user's postings, current for `conn`'s open transaction; None to search FTS5.

        A user without postings has them built in the background. `on_loop`: None too when
        they are far behind or another thread holds them, rather than wait.
        """
        with self._lock:
            postings = self._users.get(user)
            if postings is not None:
                self._users.move_to_end(user)
        if postings is None:
            self._want(user)
            return None
        if on_loop and self.behind(postings, seen) > LOOP_CATCH_UP_MAX:
            return None  # a reader thread catches up, SQLite releasing the GIL
        if not postings.lock.acquire(blocking=not on_loop):
            return None  # a thread is catching up or searching: the loop waits for no lock
        try:
            before = postings.nbytes
            outcome = self.catch_up(conn, postings, seen)
            grew = postings.nbytes > before
            if outcome is CatchUp.READY:
                self.searches += 1
        finally:
            postings.lock.release()
        if outcome is CatchUp.REBUILD:
            with self._lock:
                if self._users.get(user) is postings:
                    del self._users[user]
            self._want(user)
        if outcome is not CatchUp.READY:
            return None
        if grew:
            self._trim()
        return postings

    @property
    def nbytes(self) -> int:
        """What all the users' postings take, roughly (UserPostings.nbytes)."""
        with self._lock:
            return sum(postings.nbytes for postings in self._users.values())

    @property
    def users(self) -> int:
        """Users whose postings are built and cached."""
        with self._lock:
            return len(self._users)

    def holds(self, user: str) -> bool:
        """True when the user's postings are built and cached."""
        with self._lock:
            return user in self._users

    def forget(self, user: str) -> None:
        """Drop the user's postings (the user was deleted)."""
        with self._lock:
            self._users.pop(user, None)
            self._wanted.discard(user)

    def close(self) -> None:
        """Stop the builder and drop every user's postings."""
        builder, self._builder = self._builder, None
        if builder is not None:
            self._builds.put(None)
            builder.join(timeout=5)
        with self._lock:
            self._users.clear()
            self._wanted.clear()

    def _want(self, user: str) -> None:
        with self._lock:
            now = self._clock()
            if user in self._wanted or self._not_before.get(user, 0.0) > now:
                return
            self._not_before = {u: until for u, until in self._not_before.items() if until > now}
            self._wanted.add(user)
            if self._builder is None:
                self._builder = threading.Thread(target=self._build_loop, name=f"memproxy-{self.name}", daemon=True)
                self._builder.start()
        self._builds.put(user)

    def _build_loop(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while (user := self._builds.get()) is not None:
                postings: UserPostings | None = None
                try:
                    conn = conn or self._connect()
                    postings = self.build(conn, user)
                    postings.join()
                    self.builds += 1
                except Exception as exc:  # the user's searches go on in FTS5; built again a minute later
                    log.warning("%s: cannot build for a user (%s)", self.name, exc,
                                exc_info=not isinstance(exc, sqlite3.Error))
                    postings = None
                self._install(user, postings)
        finally:
            if conn is not None:
                conn.close()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        for pragma in self._pragmas:
            conn.execute(f"PRAGMA {pragma}")
        return conn

    def _install(self, user: str, postings: UserPostings | None) -> None:
        """Cache a user's new postings; None: the build failed."""
        with self._lock:
            if user not in self._wanted:
                return  # forgotten while it was built (the user deleted, the store closed)
            self._wanted.discard(user)
            if postings is None:
                self._not_before[user] = self._clock() + FAILED_RETRY_S
                return
            if postings.nbytes > self.max_bytes:
                self._not_before[user] = self._clock() + TOO_BIG_RETRY_S
                log.info("%s: a user's postings (%d MiB) exceed store.search_cache_mb", self.name,
                         postings.nbytes >> 20)
                return
            self._users[user] = postings
            self._users.move_to_end(user)
        self._trim()

    def _trim(self) -> None:
        total = self.nbytes
        with self._lock:
            while total > self.max_bytes and len(self._users) > 1:
                _, evicted = self._users.popitem(last=False)
                total -= evicted.nbytes
