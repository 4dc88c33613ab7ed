"""The identifier trigger: concrete values the user names that the transcript doesn't show.

Aider's repo-map idea: URLs, hostnames, paths, snake/SCREAMING_SNAKE, camelCase, long
kebab-case, alphanumeric codes and hex in the user message are values a memory may hold;
a retrieved memory that holds one the model cannot already see goes to the front of its
source. False positives are cheap — they only reorder hits a source already found.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from urllib.parse import urlsplit

from proxy.models import Hit
from proxy.terms import STOP_WORDS

TRIGGER_REASON = "identifier trigger"
MIN_CODE_CHARS = 5
_TRAILING = ".,;:!?)]}>'\"`"

_URL = re.compile(r"\b(?:https?|wss?|ftp|file)://[^\s<>\"'`]+", re.IGNORECASE)
_EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
# The last label is lower-case letters first, two or more: `config.yaml`, `acme.io`, but not
# `e.g.`, `3.11`, `U.S.` or `Mr.Smith`.
_HOST = re.compile(
    r"(?<![\w@.-])(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[a-z][a-z0-9-]*[a-z0-9](?![\w-])"
)
_ABSOLUTE_PATH = re.compile(r"(?<![\w/.~:-])(?:/[\w.@+-]+){2,}/?")
_RELATIVE_PATH = re.compile(r"(?<![\w/.~-])(?:~|\.{1,2})(?:/[\w.@+-]+)+/?")
_BARE_PATH = re.compile(r"(?<![\w/.~@+-])[\w.@+-]+(?:/[\w.@+-]+)+/?")
_WINDOWS_PATH = re.compile(r"\b[A-Za-z]:\\[^\s\\/:*?\"<>|]+(?:\\[^\s\\/:*?\"<>|]+)*\\?")
_SNAKE = re.compile(r"(?<![\w-])[A-Za-z0-9]+(?:_[A-Za-z0-9]+)+(?![\w-])")
_WORD = re.compile(r"(?<![\w-])[A-Za-z][A-Za-z0-9]*(?![\w-])")
_KEBAB = re.compile(r"(?<![\w-])[A-Za-z0-9]+(?:-[A-Za-z0-9]+){2,}(?![\w-])")
_CODE = re.compile(r"(?<![\w-])[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*(?![\w-])")
_HEX = re.compile(r"(?<![\w-])(?:0x)?[0-9a-fA-F]{8,}(?![\w-])")

_INNER_CAPITAL = re.compile(r"[a-z][A-Z]|[A-Z]{2}[a-z]{2}")  # getUser, iPhone, HTTPServer; not URLs
_NUMBER_WITH_UNIT = re.compile(r"\d+[A-Za-z]{1,3}")  # 1990s, 100th, 1080p, 500mb


def _bare_path(token: str) -> bool:
    # `src/app.py` or `a/b/c`, but not `and/or`, `km/h` or `24/7`.
    last = token.rstrip("/").rsplit("/", 1)[-1]
    return token.count("/") >= 2 or re.search(r"\.[A-Za-z]\w*$", last) is not None


def _has_letter(token: str) -> bool:
    return any(c.isalpha() for c in token)


def _kebab(token: str) -> bool:
    # `my-cool-app`, `internal-hbr-2291`; not `up-to-date`, `state-of-the-art`, `2024-01-15`.
    middle = token.lower().split("-")[1:-1]
    return _has_letter(token) and not all(part in STOP_WORDS for part in middle)


def _code(token: str) -> bool:
    return (
        len(token) >= MIN_CODE_CHARS
        and _has_letter(token)
        and any(c.isdigit() for c in token)
        and not _NUMBER_WITH_UNIT.fullmatch(token)
    )


def _holds(literal: str) -> Callable[[str], bool]:
    return lambda text: literal in text


_DIGIT = re.compile(r"[0-9]")
_HEX_RUN = re.compile(r"[0-9a-fA-F]{8}")

_Accept = Callable[[str], bool]
# Each pattern with what a token it accepts must hold, and what a text must hold for the
# pattern to find such a token at all: most texts name no identifier, and the twelve scans
# of every text cost ~45 us a query where these tests cost a few.
_MATCHERS: tuple[tuple[re.Pattern[str], _Accept | None, _Accept], ...] = (
    (_URL, None, _holds("://")),
    (_EMAIL, None, _holds("@")),
    (_HOST, None, _holds(".")),
    (_ABSOLUTE_PATH, None, _holds("/")),
    (_RELATIVE_PATH, None, _holds("/")),
    (_BARE_PATH, _bare_path, _holds("/")),
    (_WINDOWS_PATH, None, _holds(":\\")),
    (_SNAKE, _has_letter, _holds("_")),
    (_WORD, lambda token: _INNER_CAPITAL.search(token) is not None, lambda text: _INNER_CAPITAL.search(text) is not None),
    (_KEBAB, _kebab, _holds("-")),
    (_CODE, _code, lambda text: _DIGIT.search(text) is not None),
    (_HEX, None, lambda text: _HEX_RUN.search(text) is not None),
)


def identifiers(text: str) -> list[str]:
    """Identifier-like values in the text, in order of appearance, each once."""
    found: list[str] = []
    for value in _longest_spans(text):
        found.append(value)
        if _URL.fullmatch(value) and "." in (host := _host(value)):
            found.append(host)  # a memory is likelier to hold the host than the whole URL
    return list(dict.fromkeys(found))


def _host(url: str) -> str:
    try:
        return urlsplit(url).hostname or ""
    except ValueError:  # a malformed IPv6 literal: `http://[abc`
        return ""


def _longest_spans(text: str) -> list[str]:
    """Matches of every pattern, the longest winning where they overlap."""
    spans: list[tuple[int, int]] = []
    for pattern, accept, may_match in _MATCHERS:
        if not may_match(text):
            continue
        for match in pattern.finditer(text):
            value = match.group().rstrip(_TRAILING)
            if value and (accept is None or accept(value)):
                spans.append((match.start(), match.start() + len(value)))
    values, end = [], 0
    for start, stop in sorted(spans, key=lambda span: (span[0], -span[1])):
        if start >= end:
            values.append(text[start:stop])
            end = stop
    return values


def unseen_identifiers(user_text: str, transcript_texts: Iterable[str]) -> list[str]:
    """The user message's identifiers that no earlier message of the request contains."""
    found = identifiers(user_text)
    if not found:
        return []  # the common case: the transcript need not be read at all
    visible = "\n".join(transcript_texts).casefold()
    return [value for value in found if value.casefold() not in visible]


def promote(hits: Sequence[Hit], identifiers: Sequence[str]) -> list[Hit]:
    """Hits holding one of the identifiers first, each group keeping its order."""
    wanted = [(value, value.casefold()) for value in identifiers if value]
    front: list[Hit] = []
    rest: list[Hit] = []
    for hit in hits:
        content = hit.content.casefold()
        value = next((value for value, folded in wanted if folded in content), None)
        if value is None:
            rest.append(hit)
        else:
            front.append(replace(hit, reason=TRIGGER_REASON, parts={**hit.parts, "identifier": value}))
    return front + rest
