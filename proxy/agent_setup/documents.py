"""An agent's settings file as a document of nested tables: read, set and remove a key by its
path, and write it back keeping everything else (JSON: its key order and indentation; TOML:
comments and formatting, through tomlkit)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Protocol

import tomlkit
import tomlkit.exceptions
from tomlkit.items import Comment, Item, Table

Key = tuple[str, ...]


class Missing:
    """A key the document does not hold."""

    def __repr__(self) -> str:
        return "(unset)"


MISSING = Missing()


class Unparseable(ValueError):
    """The file is not the format it must be in; nothing is written."""


class Document(Protocol):
    """A settings file's content as nested tables."""

    def get(self, key: Key) -> Any:
        """The plain value at `key` (dicts, lists, str, numbers, bools), or MISSING."""

    def set(self, key: Key, value: Any) -> None:
        """Set `key`, creating the tables above it."""

    def delete(self, key: Key) -> None:
        """Remove `key` if it is there."""

    def dump(self) -> bytes:
        """The file's new bytes."""


class JsonDocument:
    """A JSON object file, written back with its indentation and key order."""

    def __init__(self, path: Path, raw: bytes | None) -> None:
        self._path = path
        self._root: dict[str, Any] = {}
        self._indent: int | str | None = 2
        self._newline = True
        if raw is None or not raw.strip():
            return
        try:
            root = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise Unparseable(f"{path} is not valid JSON ({exc})") from None
        if not isinstance(root, dict):
            raise Unparseable(f"{path} must hold a JSON object, it holds {type(root).__name__}")
        self._root = root
        text = raw.decode("utf-8", "replace")
        self._indent = _indentation(text) if root else 2
        self._newline = text.endswith("\n")

    def get(self, key: Key) -> Any:
        node: Any = self._root
        for part in key:
            if not isinstance(node, dict) or part not in node:
                return MISSING
            node = node[part]
        return node

    def set(self, key: Key, value: Any) -> None:
        node = self._root
        for depth, part in enumerate(key[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise _not_a_table(self._path, key[:depth + 1], "an object")
            node = child
        node[key[-1]] = value

    def delete(self, key: Key) -> None:
        parent = self.get(key[:-1]) if len(key) > 1 else self._root
        if isinstance(parent, dict):
            parent.pop(key[-1], None)

    def dump(self) -> bytes:
        text = json.dumps(self._root, indent=self._indent, ensure_ascii=False)
        return (text + ("\n" if self._newline else "")).encode("utf-8")


class TomlDocument:
    """A TOML file edited through tomlkit: comments, order and formatting of the rest stay."""

    def __init__(self, path: Path, raw: bytes | None) -> None:
        self._path = path
        try:
            self._doc = tomlkit.parse(raw.decode("utf-8")) if raw else tomlkit.document()
        except (UnicodeDecodeError, tomlkit.exceptions.TOMLKitError) as exc:
            raise Unparseable(f"{path} is not valid TOML ({exc})") from None

    def get(self, key: Key) -> Any:
        node: Any = self._doc
        for part in key:
            if not isinstance(node, dict) or part not in node:
                return MISSING
            node = node[part]
        return node.unwrap() if isinstance(node, Item) else node

    def set(self, key: Key, value: Any) -> None:
        node: Any = self._doc
        for depth, part in enumerate(key[:-1]):
            child = node.get(part)
            if child is not None and not isinstance(child, dict):
                raise _not_a_table(self._path, key[:depth + 1], "a table")
            if child is None:
                # `[model_providers.memproxy]` alone: the table above it is implied, not written.
                child = tomlkit.table(is_super_table=depth < len(key) - 2)
                node[part] = child
            node = child
        if isinstance(value, dict):
            inline = tomlkit.inline_table()
            inline.update(value)
            node[key[-1]] = inline
        else:
            node[key[-1]] = value

    def delete(self, key: Key) -> None:
        node: Any = self._doc
        for part in key[:-1]:
            if not isinstance(node, dict) or part not in node:
                return
            node = node[part]
        if isinstance(node, dict) and key[-1] in node:
            kept = _comments(node[key[-1]])
            del node[key[-1]]
            # A comment the user wrote under a table setup takes out (the file's last table, where
            # a comment added at the end lands) is the user's: it stays, at the end of the file.
            for comment in kept:
                self._doc.add(comment)

    def dump(self) -> bytes:
        return tomlkit.dumps(self._doc).encode("utf-8")


def _comments(item: Any) -> list[Comment]:
    """The comments inside a table and the tables under it."""
    if not isinstance(item, Table):
        return []
    return [found for _, child in item.value.body
            for found in ([child] if isinstance(child, Comment) else _comments(child))]


def _not_a_table(path: Path, key: Key, kind: str) -> Unparseable:
    """Setup would have to replace a user's value to put its keys under it: it refuses."""
    return Unparseable(f"{path}: {'.'.join(key)} must be {kind} for setup to add its keys there")


def _indentation(text: str) -> int | str | None:
    """How the file indents: spaces (their number), a tab, or None for JSON on one line."""
    found = re.search(r"^([ \t]+)\S", text, re.M)
    if found is None:
        return None
    return found.group(1) if "\t" in found.group(1) else len(found.group(1))


def document(kind: str, path: Path, raw: bytes | None) -> Document:
    """The file's document; Unparseable when it is not valid `kind` ("json" or "toml")."""
    return JsonDocument(path, raw) if kind == "json" else TomlDocument(path, raw)
