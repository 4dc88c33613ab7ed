"""Plan the keys setup sets in an agent's files, show the change (keys masked), and write it.

A file is written atomically (a temporary file beside it, then a rename) with its mode kept;
a file setup creates is 0600 (it may come to hold keys). What `--undo` needs is undo.py's.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.agent_setup.documents import MISSING, Key, document
from proxy.redaction.redact import redact

NEW_FILE_MODE = 0o600


@dataclass(frozen=True)
class Change:
    """One key setup sets: `make` gives its new value from the value it holds (or MISSING)."""

    key: Key
    make: Callable[[Any], Any]
    announce: bool = False  # replacing a different value is said (a base URL, a provider)


@dataclass(frozen=True)
class Target:
    """A file setup edits, its format (documents.document's kinds) and the keys it sets there."""

    path: Path
    kind: str
    changes: tuple[Change, ...]


@dataclass
class Edit:
    """What setup would do to one file."""

    target: Target
    before: bytes | None  # None: no such file
    after: bytes
    applied: list[tuple[Key, Any, Any]] = field(default_factory=list)  # (key, old value or MISSING, new value)
    created_tables: list[Key] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def changes_file(self) -> bool:
        return self.before != self.after


def read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def plan(target: Target) -> Edit:
    """The edit of one file; Unparseable when the file cannot be read as its format."""
    before = read(target.path)
    doc = document(target.kind, target.path, before)
    edit = Edit(target, before, before or b"")
    for change in target.changes:
        old = doc.get(change.key)
        new = change.make(old)
        if old == new:
            continue
        for depth in range(1, len(change.key)):
            if doc.get(change.key[:depth]) is MISSING and change.key[:depth] not in edit.created_tables:
                edit.created_tables.append(change.key[:depth])
        doc.set(change.key, new)
        edit.applied.append((change.key, old, new))
        if change.announce and old is not MISSING:
            edit.notes.append(f"{target.path}: replacing {dotted(change.key)} = {masked(json.dumps(old))} "
                              f"(--undo restores it)")
    if edit.applied:
        edit.after = doc.dump()
    return edit


def dotted(key: Key) -> str:
    return ".".join(key)


_SECRET_NAME = r"[\w.-]*(?:api[-_]?key|token|secret|password|authorization|cookie)"
_SECRET_FIELD = re.compile(rf"""(?i)(["']?{_SECRET_NAME}["']?\s*[:=]\s*["'])([^"']+)(["'])""")
# A header line inside a string value (ANTHROPIC_CUSTOM_HEADERS holds `Name: value`, one a line).
_SECRET_HEADER = re.compile(rf"""(?i)((?:^|(?<=["\s])){_SECRET_NAME}:[ \t]*)([^"\\]+)""")


# A `.env` line (in a diff, after its +, - or space) setting a variable named like a key, unquoted.
_SECRET_VARIABLE = re.compile(r"""(?i)^([+ -]?\s*(?:export\s+)?[\w.-]*(?:api_?key|token|secret|password)[\w.-]*"""
                              r"""\s*=\s*)([^"'\s].*)$""")


def masked(text: str) -> str:
    """`text` with keys and tokens hidden: secret-looking values, and values of fields named like keys."""
    # A JSON or TOML string's `\n` is read as the line break it stands for (headers, one a line).
    parts = (_SECRET_HEADER.sub(r"\1****", redact(part)) for part in text.split("\\n"))
    lines = "\n".join(parts).replace("\n", "\\n")
    lines = _SECRET_FIELD.sub(lambda m: f"{m.group(1)}****{m.group(3)}", lines)
    return _SECRET_VARIABLE.sub(lambda m: f"{m.group(1)}****", lines)


def diff(edit: Edit) -> str:
    """The edit as a unified diff, keys masked."""
    old = (edit.before or b"").decode("utf-8", "replace").splitlines(keepends=True)
    new = edit.after.decode("utf-8", "replace").splitlines(keepends=True)
    name = str(edit.target.path)
    lines = difflib.unified_diff(old, new, "/dev/null" if edit.before is None else name, name)
    return "".join(masked(line.rstrip("\n")) + "\n" for line in lines)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` in one rename (write_all)."""
    write_all([(path, data)])


def write_all(files: list[tuple[Path, bytes]]) -> None:
    """Write every file or none: each is staged in a temporary file beside it first, so a
    directory that refuses a write stops the run before any file changed; then each is
    renamed into place, keeping its mode (0600 for a new file). A symlinked file is written
    where the link points, and the link stays."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, data in files:
            staged.append(_staged(path, data))
    except BaseException:
        for temporary, _ in staged:
            temporary.unlink(missing_ok=True)
        raise
    for temporary, path in staged:
        os.replace(temporary, path)


def _staged(path: Path, data: bytes) -> tuple[Path, Path]:
    """`data` in a temporary file beside `path` with `path`'s mode: (the temporary file, the real path)."""
    path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = NEW_FILE_MODE
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".memproxy", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return Path(temporary), path
