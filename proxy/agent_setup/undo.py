"""What `--undo` needs, and undoing.

It is kept in memproxy's own state directory (`$XDG_STATE_HOME/memproxy/setup`, default
`~/.local/state/memproxy/setup`, one 0600 file per edited file, named by a hash of its
path), never beside the agent's files (a project's `.mcp.json` is often checked in):

- the bytes setup wrote (their hash) and the lines that turn them back into the original,
  so a file nobody touched since comes back byte for byte (a file setup created is removed);
- each key setup set, with the value it had before, so a file the agent or the user changed
  since is undone key by key: a key still holding what setup wrote gets its old value back
  (or goes), and one changed since is left as it is, and said so.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.agent_setup.documents import MISSING, Document, Key, Unparseable, document
from proxy.agent_setup.edits import Edit, Target, dotted, read, write_all, write_atomically

STATE_VERSION = 1


def state_dir(env: Mapping[str, str], home: Path) -> Path:
    """memproxy's own directory for what --undo needs."""
    base = env.get("XDG_STATE_HOME") or str(home / ".local" / "state")
    return Path(base) / "memproxy" / "setup"


def state_path(directory: Path, path: Path) -> Path:
    key = hashlib.sha256(os.path.realpath(path).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return directory / f"{key}.json"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _lines(data: bytes) -> list[str]:
    return data.decode("utf-8", "surrogateescape").splitlines(keepends=True)


def _back(written: bytes, original: bytes) -> list[list[Any]]:
    """The line edits that turn `written` into `original` (only the lines that differ are kept)."""
    ops = difflib.SequenceMatcher(None, _lines(written), _lines(original), autojunk=False).get_opcodes()
    target = _lines(original)
    return [[i1, i2, target[j1:j2]] for tag, i1, i2, j1, j2 in ops if tag != "equal"]


def _restored(written: bytes, back: list[list[Any]]) -> bytes:
    lines = _lines(written)
    out: list[str] = []
    at = 0
    for i1, i2, replacement in back:
        out += lines[at:i1] + replacement
        at = i2
    out += lines[at:]
    return "".join(out).encode("utf-8", "surrogateescape")


def _encoded(value: Any) -> dict[str, Any]:
    return {} if value is MISSING else {"value": value}


def _decoded(slot: dict[str, Any]) -> Any:
    return slot["value"] if "value" in slot else MISSING


def apply(edits: list[Edit], directory: Path, agent: str) -> None:
    """Write the edits and keep (or extend) what --undo needs, all or none: the states are
    renamed into place first, so an interrupted run never leaves a change that cannot be undone."""
    states = [_state(edit, directory, agent) for edit in edits]
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_all([*states, *((edit.target.path, edit.after) for edit in edits)])


def _state(edit: Edit, directory: Path, agent: str) -> tuple[Path, bytes]:
    """Where --undo's state for the edit's file goes, and its new bytes."""
    path = edit.target.path
    where = state_path(directory, path)
    old = _load_state(where)
    if old is None:
        created, original = edit.before is None, edit.before
        keys: dict[Key, dict[str, Any]] = {}
        tables: list[Key] = []
    else:
        created = bool(old["created"])
        # The original is known exactly only while the file is what setup wrote last time.
        exact = edit.before is not None and _sha(edit.before) == old["written_sha256"] and old["back"] is not None
        original = _restored(edit.before, old["back"]) if exact and edit.before is not None else None
        keys = {tuple(entry["key"]): entry for entry in old["keys"]}
        tables = [tuple(key) for key in old["created_tables"]]
    for key, before, after in edit.applied:
        entry = keys.get(key)
        keys[key] = {"key": list(key), "before": entry["before"] if entry is not None else _encoded(before),
                     "after": after}
    tables += [key for key in edit.created_tables if key not in tables]
    state = {"version": STATE_VERSION, "agent": agent, "path": str(path), "created": created,
             "written_sha256": _sha(edit.after),
             "back": [] if created else None if original is None else _back(edit.after, original),
             "keys": list(keys.values()), "created_tables": [list(key) for key in tables]}
    return where, json.dumps(state, indent=1).encode()


def _load_state(where: Path) -> dict[str, Any] | None:
    raw = read(where)
    if raw is None:
        return None
    try:
        state = json.loads(raw)
    except ValueError:
        state = None
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise Unparseable(f"{where} is not a memproxy setup state file this version reads")
    return state


@dataclass
class Undo:
    """What --undo would do to one file: write `after` (None: remove the file), or nothing."""

    path: Path
    state_file: Path
    before: bytes | None
    after: bytes | None
    notes: list[str] = field(default_factory=list)
    found: bool = True  # setup had changed this file


def plan_undo(target: Target, directory: Path) -> Undo:
    """The undo of one file; Unparseable when a file changed since cannot be read."""
    where = state_path(directory, target.path)
    state = _load_state(where)
    current = read(target.path)
    if state is None:
        return Undo(target.path, where, current, current, found=False)
    if current is None:
        return Undo(target.path, where, None, None, [f"{target.path}: already gone"])
    if _sha(current) == state["written_sha256"] and (state["created"] or state["back"] is not None):
        return Undo(target.path, where, current, None if state["created"] else _restored(current, state["back"]))
    doc = document(target.kind, target.path, current)
    undo = Undo(target.path, where, current, current)
    for entry in reversed(state["keys"]):
        key = tuple(entry["key"])
        if doc.get(key) != entry["after"]:
            undo.notes.append(f"{target.path}: {dotted(key)} was changed since setup; left as it is")
            continue
        _put(doc, key, _decoded(entry["before"]))
    for key in sorted((tuple(k) for k in state["created_tables"]), key=len, reverse=True):
        if doc.get(key) == {}:
            doc.delete(key)
    undo.after = doc.dump()
    if state["created"] and document(target.kind, target.path, undo.after).get(()) in ({}, MISSING):
        undo.after = None  # setup made the file, and nothing else is in it
    return undo


def _put(doc: Document, key: Key, value: Any) -> None:
    if value is MISSING:
        doc.delete(key)
    else:
        doc.set(key, value)


def apply_undo(undo: Undo) -> None:
    if undo.after is None:
        Path(os.path.realpath(undo.path)).unlink(missing_ok=True)
    elif undo.after != undo.before:
        write_atomically(undo.path, undo.after)
    undo.state_file.unlink(missing_ok=True)
