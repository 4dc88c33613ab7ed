"""A JSON object file edited as text: setting or removing a member rewrites that member only, so
everything else (indentation, key order, number literals as written, comments where the agent
reads them) stays byte for byte.

With `comments`, `//` and `/* */` comments are read as whitespace, as strip-json-comments (which
Gemini CLI reads its settings.json through) does; without, the file is plain JSON. `NaN` and
`Infinity` are no JSON (JSON.parse refuses them) and are refused here too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

# A string or a comment, matched together so that `//` inside a string is not read as a comment.
_STRING_OR_COMMENT = re.compile(r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"|//[^\n]*|/\*.*?\*/', re.S)
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_SCALAR = re.compile(r"[^\s,\]}]+")
_SPACE = re.compile(r"[ \t\r\n]*")
_INDENT = re.compile(r"[ \t]*")


class InvalidJson(ValueError):
    """The text is not a JSON object (comments allowed when they are)."""


@dataclass(frozen=True)
class Span:
    """Where a value is in the text, [start, end), and an object's members in order."""

    start: int
    end: int
    members: tuple[Member, ...] | None = None  # None: not an object


@dataclass(frozen=True)
class Member:
    name: str
    start: int  # the key's opening quote
    value: Span


class JsonText:
    """A JSON object's text and its value; `replace`, `insert` and `remove` edit the text, and
    the value and the spans are read again after each edit."""

    def __init__(self, text: str, *, comments: bool, indent: str | None) -> None:
        self.text = text
        self._comments = comments
        self._indent = indent  # one level of the file's indentation; None: written on one line
        self.root: dict[str, Any] = {}
        self._plain = text
        self._span = Span(0, 0)
        self._parse()

    def _parse(self) -> None:
        plain = _STRING_OR_COMMENT.sub(_blank_comment, self.text) if self._comments else self.text
        try:
            root = json.loads(plain, parse_constant=_no_constant)
            if not isinstance(root, dict):
                raise InvalidJson(f"it must hold a JSON object, it holds {type(root).__name__}")
            span = _span(plain, _skip(plain, 0))
        except RecursionError:
            raise InvalidJson("it nests too deeply") from None
        except InvalidJson:
            raise
        except ValueError as exc:
            raise InvalidJson(str(exc)) from None
        self.root, self._span, self._plain = root, span, plain

    def member(self, key: tuple[str, ...]) -> tuple[Span, Member | None, int]:
        """Along `key`'s path: the deepest object the text holds, its member named by `key[depth]`
        (None: it has none), and `depth`. The member is `key`'s own when `depth` is the last index,
        else a value that is no object."""
        span = self._span
        for depth, part in enumerate(key):
            assert span.members is not None
            found = [m for m in span.members if m.name == part]
            if not found:
                return span, None, depth
            if depth == len(key) - 1 or found[-1].value.members is None:
                return span, found[-1], depth  # the last of duplicates is the one JSON readers keep
            span = found[-1].value
        raise AssertionError("an empty key")

    def replace(self, obj: Span, value_span: Span, value: Any) -> None:
        """Put `value` where `value_span`, a value of the object `obj`, is (on one line when `obj` is)."""
        one_line = self._indent is None or "\n" not in self._plain[obj.start:obj.end]
        prefix = self._line_indent(value_span.start)
        self._splice([(value_span.start, value_span.end, self._encoded(value, prefix, one_line))])

    def insert(self, obj: Span, name: str, value: Any) -> None:
        """Add the member `name` at the end of the object `obj`."""
        assert obj.members is not None
        close = obj.end - 1
        unit = self._indent or ""
        if obj.members:
            last = obj.members[-1].value.end
            if "\n" not in self._plain[obj.start:obj.end]:
                self._splice([(last, last, ", " + self._member(name, value, "", True))])
                return
            prefix = self._line_indent(obj.members[-1].start)
            line_end = self._plain.find("\n", last)
            if line_end != -1 and not self._plain[last:line_end].strip():
                # After a comment that ends the last member's line, not before it.
                added = "\n" + prefix + self._member(name, value, prefix)
                self._splice([(last, last, ","), (line_end, line_end, added)])
            else:
                self._splice([(last, last, ",\n" + prefix + self._member(name, value, prefix))])
            return
        inside = self._plain[obj.start + 1:close]
        outer = self._line_indent(obj.start)
        if "\n" in inside:
            at = obj.start + 1 + inside.rfind("\n")
            self._splice([(at, at, "\n" + outer + unit + self._member(name, value, outer + unit))])
        elif self._indent is None:
            self._splice([(close, close, self._member(name, value, "", True))])
        else:
            text = "\n" + outer + unit + self._member(name, value, outer + unit) + "\n" + outer
            self._splice([(close, close, text)])

    def remove(self, obj: Span, member: Member) -> None:
        """Take `member` out of the object `obj`, with its line when it has one to itself."""
        assert obj.members is not None
        plain = self._plain
        start, end = member.start, member.value.end
        if len(obj.members) == 1 and not (plain[obj.start + 1:start] + plain[end:obj.end - 1]).strip(", \t\r\n"):
            self._splice([(obj.start + 1, obj.end - 1, "")])  # nothing else inside: `{}`
            return
        cuts: list[tuple[int, int, str]] = []
        after = _skip(plain, end)
        index = obj.members.index(member)
        if plain[after] == ",":
            end = after + 1
        elif index > 0:
            # The last member: the comma after the one before it goes too.
            comma = _skip(plain, obj.members[index - 1].value.end)
            if not plain[comma + 1:start].strip(" \t"):
                start = comma  # on one line with it
            else:
                cuts.append((comma, comma + 1, ""))
        line_start = plain.rfind("\n", 0, start) + 1
        line_end = plain.find("\n", end)
        if not plain[line_start:start].strip() and line_end != -1 and not plain[end:line_end].strip():
            cuts.append((line_start, line_end + 1, ""))  # its line to itself: the line goes
        else:
            cuts.append((start, _skip(plain, end) if plain[end:end + 1] == " " else end, ""))
        self._splice(cuts)

    def _member(self, name: str, value: Any, prefix: str, one_line: bool = False) -> str:
        return json.dumps(name, ensure_ascii=False) + ": " + self._encoded(value, prefix, one_line)

    def _encoded(self, value: Any, prefix: str, one_line: bool) -> str:
        try:
            text = json.dumps(value, indent=None if one_line else self._indent, ensure_ascii=False,
                              allow_nan=False)
        except ValueError:
            raise InvalidJson(f"{value!r} holds a number JSON cannot write") from None
        return text.replace("\n", "\n" + prefix)

    def _line_indent(self, at: int) -> str:
        line_start = self.text.rfind("\n", 0, at) + 1
        return _INDENT.match(self.text, line_start).group()  # type: ignore[union-attr]

    def _splice(self, cuts: list[tuple[int, int, str]]) -> None:
        """Replace each [start, end) with its text (the offsets are the text's before any cut; of two
        insertions at one offset, the one listed first comes first)."""
        text = self.text
        for _, (start, end, new) in sorted(enumerate(cuts), key=lambda cut: (cut[1][0], cut[0]), reverse=True):
            text = text[:start] + new + text[end:]
        self.text = text
        self._parse()


def _blank_comment(match: re.Match[str]) -> str:
    found = match.group()
    return found if found.startswith('"') else re.sub(r"[^\n]", " ", found)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no JSON number")


def _span(plain: str, at: int) -> Span:
    """The value starting at `at`, in text json.loads has read (so its syntax is known good)."""
    start, first = at, plain[at]
    if first == "{":
        members: list[Member] = []
        at = _skip(plain, at + 1)
        while plain[at] != "}":
            key = _STRING.match(plain, at)
            assert key is not None
            value = _span(plain, _skip(plain, _skip(plain, key.end()) + 1))
            members.append(Member(json.loads(key.group()), at, value))
            at = _skip(plain, value.end)
            at = _skip(plain, at + 1) if plain[at] == "," else at
        return Span(start, at + 1, tuple(members))
    if first == "[":
        at = _skip(plain, at + 1)
        while plain[at] != "]":
            at = _skip(plain, _span(plain, at).end)
            at = _skip(plain, at + 1) if plain[at] == "," else at
        return Span(start, at + 1)
    token = (_STRING if first == '"' else _SCALAR).match(plain, at)
    assert token is not None
    return Span(start, token.end())


def _skip(plain: str, at: int) -> int:
    return _SPACE.match(plain, at).end()  # type: ignore[union-attr]
