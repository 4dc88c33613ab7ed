"""An agent's settings file as a document of nested tables: read, set and remove a key by its
path, and write it back keeping everything else (JSON: every member setup does not set, as
text; TOML: comments and formatting, through tomlkit; a `.env` file: every line setup does
not set). JSON and TOML are read back before they are written and must read as planned."""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path
from typing import Any, Protocol

import tomlkit
import tomlkit.exceptions
from tomlkit.items import Comment, InlineTable, Item, Table

from proxy.agent_setup.json_text import InvalidJson, JsonText

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
    """A JSON object file, edited as text (json_text.py): the members setup does not set stay
    byte for byte. With `comments`, `//` and `/* */` comments are allowed and kept (the file of
    an agent that reads them)."""

    def __init__(self, path: Path, raw: bytes | None, *, comments: bool = False) -> None:
        self._path = path
        try:
            if raw is None or not raw.strip():
                self._json = JsonText("{}\n", comments=comments, indent="  ")
            else:
                text = raw.decode("utf-8")
                self._json = JsonText(text, comments=comments, indent=_indentation(text))
        except (UnicodeDecodeError, InvalidJson) as exc:
            raise Unparseable(f"{path} is not valid JSON ({exc})") from None
        self._expected = _Expected(self._json.root)

    def get(self, key: Key) -> Any:
        return _get(self._json.root, key)

    def set(self, key: Key, value: Any) -> None:
        obj, member, depth = self._json.member(key)
        below = key[depth + 1:]
        try:
            if member is None:
                self._json.insert(obj, key[depth], _nested(below, value))
            elif not below or member.value.members is None and _get(self._json.root, key[:depth + 1]) is None:
                self._json.replace(obj, member.value, _nested(below, value))  # a null on the path becomes the object
            else:
                raise _not_a_table(self._path, key[:depth + 1], "an object")
        except InvalidJson as exc:
            raise Unparseable(f"{self._path}: cannot write {'.'.join(key)} ({exc})") from None
        self._expected.set(key, value)

    def delete(self, key: Key) -> None:
        obj, member, depth = self._json.member(key)
        while member is not None and depth == len(key) - 1:  # each of a duplicated key's members
            self._json.remove(obj, member)
            obj, member, depth = self._json.member(key)
        self._expected.delete(key)

    def dump(self) -> bytes:
        self._expected.check(self._path, self._json.root)
        return self._json.text.encode("utf-8")


class TomlDocument:
    """A TOML file edited through tomlkit: comments, order and formatting of the rest stay.

    A table setup adds goes at the end of the file under its own `[a.b]` header, never into
    the middle of the file, where tomlkit cannot place it when the table above it is written
    with dotted keys (`model_providers.other.name = ...`); inside an inline table it is inline."""

    def __init__(self, path: Path, raw: bytes | None) -> None:
        self._path = path
        try:
            text = raw.decode("utf-8") if raw else ""
            self._doc = tomlkit.parse(text)
            self._expected = _Expected(tomllib.loads(text))
        except (UnicodeDecodeError, tomlkit.exceptions.TOMLKitError, tomllib.TOMLDecodeError) as exc:
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
        depth = 0
        for depth, part in enumerate(key[:-1]):
            child = node.get(part)
            if child is not None and not isinstance(child, dict):
                raise _not_a_table(self._path, key[:depth + 1], "a table")
            if child is None:
                break
            node = child
        else:
            depth = len(key) - 1
        inline = isinstance(node, InlineTable)
        if isinstance(value, dict) and not inline and len(key) <= _SECTION_DEPTH:
            # A provider or a server is written whole, as its own table (a stdio server's
            # `command` must not stay beside setup's `url`).
            if depth == len(key) - 1 and key[-1] in node:
                del node[key[-1]]
            self._append_table(key, value)
        elif depth < len(key) - 1 and not inline:
            self._append_table(key[:-1], {key[-1]: value})
        else:
            node[key[depth]] = _toml_value(_nested(key[depth + 1:], value))
        self._expected.set(key, value)

    def _append_table(self, key: Key, values: dict[str, Any]) -> None:
        """`[key]` with `values` at the end of the file (the tables above it are implied)."""
        body = tomlkit.document()
        for name, value in values.items():
            body[name] = _toml_value(value)
        header = ".".join(tomlkit.items.SingleKey(part).as_string() for part in key)
        text = tomlkit.dumps(self._doc)
        text += "\n" if text and not text.endswith("\n") else ""
        text += "\n" if text.strip() else ""
        self._doc = tomlkit.parse(f"{text}[{header}]\n{tomlkit.dumps(body)}")

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
        self._expected.delete(key)

    def dump(self) -> bytes:
        text = tomlkit.dumps(self._doc)
        try:
            written: dict[str, Any] | None = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            written = None
        self._expected.check(self._path, written)
        return text.encode("utf-8")


# Codex's tables of settings (`[model_providers.x]`, `[mcp_servers.x]`) are written as tables; the
# maps inside them (`http_headers`, `env`) as inline tables, as Codex's documentation writes them.
_SECTION_DEPTH = 2


def _toml_value(value: Any) -> Any:
    """`value` for tomlkit, a dict as an inline table."""
    if not isinstance(value, dict):
        return value
    inline = tomlkit.inline_table()
    for name, item in value.items():
        inline[name] = _toml_value(item)
    return inline


def _nested(key: Key, value: Any) -> Any:
    """`value` under the tables `key` names (`value` itself for an empty key)."""
    for part in reversed(key):
        value = {part: value}
    return value


def _get(root: Any, key: Key) -> Any:
    node = root
    for part in key:
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


class _Expected:
    """What the file must read as once written: its value as parsed, with setup's keys set and
    removed. Before a file is written, it is parsed again and compared with this, so an edit the
    file's format library placed wrong is refused instead of written."""

    def __init__(self, root: dict[str, Any]) -> None:
        self._root = copy.deepcopy(root)
        self._keys: list[Key] = []

    def set(self, key: Key, value: Any) -> None:
        node = self._root
        for part in key[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}  # a JSON null on the path becomes the object (set refuses other values)
            node = child
        node[key[-1]] = copy.deepcopy(value)
        self._keys.append(key)

    def delete(self, key: Key) -> None:
        parent = _get(self._root, key[:-1])
        if isinstance(parent, dict):
            parent.pop(key[-1], None)
        self._keys.append(key)

    def check(self, path: Path, written: dict[str, Any] | None) -> None:
        """Unparseable unless `written` (the new text parsed; None: it does not parse) is what was planned."""
        if written != self._root:
            keys = ", ".join(dict.fromkeys(".".join(key) for key in self._keys))
            raise Unparseable(f"{path}: setup cannot write {keys} here without changing other settings (the file "
                              "is laid out in a way setup does not edit); set them by hand")


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


def _indentation(text: str) -> str | None:
    """One level of the file's indentation (its first indented line's), or None for JSON on one line."""
    found = re.search(r"^([ \t]+)\S", text, re.M)
    return found.group(1) if found is not None else None


def document(kind: str, path: Path, raw: bytes | None) -> Document:
    """The file's document; Unparseable when it is not valid `kind`: "json", "jsonc" (JSON with
    comments, kept), "toml" or "env"."""
    if kind == "env":
        return EnvDocument(path, raw)
    if kind in ("json", "jsonc"):
        return JsonDocument(path, raw, comments=kind == "jsonc")
    return TomlDocument(path, raw)
