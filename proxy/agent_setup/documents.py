"""An agent's settings file as a document of nested tables: read, set and remove a key by its
path, and write it back keeping everything else (JSON: its key order and indentation; TOML:
comments and formatting, through tomlkit; a `.env` file: every line setup does not set)."""

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


# A `.env` line: `[export ]NAME=value`, the value quoted or not (a ` #` starts a comment after it).
_ASSIGNMENT = re.compile(r"^(\s*(?:export\s+)?)([\w.-]+)(\s*=\s*)(.*?)\s*$")
_QUOTED = re.compile(r"""^(["'`])(.*)\1(\s+#.*)?$""")


class EnvDocument:
    """A `.env` file (`NAME=value`, one a line, as the `dotenv` package reads it), edited line by line so
    the lines setup does not set stay byte for byte; `get(())` gives every variable as a dict. A line
    that is neither blank, a comment nor `NAME=value` (a quoted value over several lines) is
    Unparseable: only what setup can read back for certain is edited."""

    def __init__(self, path: Path, raw: bytes | None) -> None:
        self._path = path
        try:
            text = (raw or b"").decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Unparseable(f"{path} is not a valid .env file ({exc})") from None
        self._lines = text.splitlines(keepends=True)
        self._values: dict[str, str] = {}
        for number, line in enumerate(self._lines, 1):
            name, value = _parsed(line)
            if name is None and line.strip() and not line.lstrip().startswith("#"):
                raise Unparseable(f"{path} is not a valid .env file (line {number} is not NAME=value)")
            if name is not None:
                self._values[name] = value
        self._newline = "\r\n" if any(line.endswith("\r\n") for line in self._lines) else "\n"

    def get(self, key: Key) -> Any:
        if not key:
            return dict(self._values)
        return self._values.get(key[0], MISSING) if len(key) == 1 else MISSING

    def set(self, key: Key, value: Any) -> None:
        (name,) = key
        text = str(value)
        line = f"{name}={_quoted(self._path, name, text)}"
        found = [i for i, old in enumerate(self._lines) if _parsed(old)[0] == name]
        if found:
            # The last assignment is the one read; an `export ` prefix and the line's ending stay.
            old = self._lines[found[-1]]
            match = _ASSIGNMENT.match(old.rstrip("\r\n"))
            prefix = match.group(1) if match else ""
            self._lines[found[-1]] = prefix + line + old[len(old.rstrip("\r\n")):]
        else:
            if self._lines and not self._lines[-1].endswith("\n"):
                self._lines[-1] += self._newline
            self._lines.append(line + self._newline)
        self._values[name] = text

    def delete(self, key: Key) -> None:
        if len(key) != 1:
            return
        self._lines = [line for line in self._lines if _parsed(line)[0] != key[0]]
        self._values.pop(key[0], None)

    def dump(self) -> bytes:
        return "".join(self._lines).encode("utf-8")


def _parsed(line: str) -> tuple[str | None, str]:
    """(name, value) of an assignment line, or (None, "") for anything else."""
    match = _ASSIGNMENT.match(line.rstrip("\r\n"))
    if match is None:
        return None, ""
    value = match.group(4)
    quoted = _QUOTED.match(value)
    if quoted is not None:
        return match.group(2), quoted.group(2)
    if value[:1] in ("'", '"', "`"):
        return None, ""  # an opening quote closed on a later line: not read
    return match.group(2), re.sub(r"\s+#.*$", "", value).strip()


def _quoted(path: Path, name: str, value: str) -> str:
    """`value` in quotes that keep it as it is: double quotes, or single ones when it holds `"` or `\\`."""
    if not any(c in value for c in '"\\\n\r'):
        return f'"{value}"'
    if not any(c in value for c in "'\n\r"):
        return f"'{value}'"
    raise Unparseable(f"{path}: {name} would hold quotes and line breaks setup cannot write")
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
    """The file's document; Unparseable when it is not valid `kind` ("json", "toml" or "env")."""
    if kind == "env":
        return EnvDocument(path, raw)
    return JsonDocument(path, raw) if kind == "json" else TomlDocument(path, raw)
