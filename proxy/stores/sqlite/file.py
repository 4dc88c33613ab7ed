"""Whether the files a SQLite store opened are still the ones at its path.

A database file deleted under a running process is not an error to SQLite: its open
connections keep reading and committing into the unlinked inode, every write reports
success, and all of it vanishes when the process stops. Renaming another database over
the path does the same. So the store records the device and inode of the database, its
WAL and its shared-memory file when it opens them, and compares them with what the path
holds now: three `stat` calls, a few microseconds, cheap enough to run after every commit.
"""

from __future__ import annotations

import os

# The database, its write-ahead log, and the WAL index every connection maps.
SUFFIXES = ("", "-wal", "-shm")

_Identity = tuple[int, int]


class FileChanged(Exception):
    """The path no longer holds the file the store's connections have open."""


class _Unknown(Exception):
    """The path cannot be looked at (a directory made unreadable): no verdict either way."""


def _identity(path: str) -> _Identity | None:
    """(device, inode) of the file at `path`; None when there is none (it or its directory gone)."""
    try:
        found = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise _Unknown(str(exc)) from exc
    return found.st_dev, found.st_ino


class OpenedFiles:
    """The identity of a store's files as it opened them, to compare with what its path holds later."""

    def __init__(self, path: str) -> None:
        self._path = path
        # A file missing at open (no WAL yet) is left out: SQLite makes it later, which is no change.
        self._opened: dict[str, _Identity] = {}
        for suffix in SUFFIXES:
            try:
                if (found := _identity(path + suffix)) is not None:
                    self._opened[suffix] = found
            except _Unknown:
                pass  # not compared later either

    def change(self) -> str | None:
        """What happened to the files since they were opened (`memproxy.db deleted`), or None."""
        for suffix, opened in self._opened.items():
            try:
                now = _identity(self._path + suffix)
            except _Unknown:
                continue  # SQLite's own errors will say what is wrong, if anything is
            if now != opened:
                name = os.path.basename(self._path) + suffix
                return f"{name} {'deleted' if now is None else 'replaced'}"
        return None

    def remove_left_behind(self) -> list[str]:
        """Once every connection to the files is closed: remove the WAL and its index that a
        database file gone from the path left there; the names removed.

        SQLite's last close removes them, but not once the database file was moved or
        deleted, and a database put at the path would read the old file's WAL as its own.
        """
        try:
            if _identity(self._path) == self._opened.get(""):
                return []  # the database is still there: the WAL left (another process uses it) is its own
        except _Unknown:
            return []
        removed = []
        for suffix in SUFFIXES[1:]:
            try:
                if suffix in self._opened and _identity(self._path + suffix) == self._opened[suffix]:
                    os.remove(self._path + suffix)
                    removed.append(os.path.basename(self._path) + suffix)
            except (_Unknown, OSError):
                pass  # gone meanwhile, or nothing can be said: the open that follows says what is wrong
        return removed

    def check(self) -> None:
        """Raise FileChanged when a file was deleted or replaced since it was opened."""
        if (change := self.change()) is not None:
            raise FileChanged(change)
