"""Concrete values a user states — URLs, hosts, paths, constants, ticket codes — as spans."""

from __future__ import annotations

import re

_TRAILING = ".,;:!?)]}>'\"`"

# Earlier patterns win where spans overlap: a URL's host and path are not separate values.
# Each with what a sentence must hold for it to match, found at a fraction of the pattern's
# cost: most sentences hold no identifier, and sixteen searches of each cost more than the
# rules' other work on it.
_PATTERNS: tuple[tuple[re.Pattern[str], re.Pattern[str]], ...] = tuple(
    (re.compile(needs), pattern) for needs, pattern in (
        ("://", re.compile(r"(?<![a-z0-9+.-])[a-z][a-z0-9+.-]*://[^\s<>\"'`]+", re.IGNORECASE)),
        ("@", re.compile(r"(?<![\w.+-])[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")),
        ("/", re.compile(r"(?<![\w/.~-])(?:~|\.{1,2})(?:/[\w.@+-]+)+/?")),
        ("/", re.compile(r"(?<![\w/.~:-])(?:/[\w.@+-]+){2,}/?")),
        # relative paths: `src/app.py`, `docs/api/v2`; not `and/or`, `km/h`, `24/7`
        ("/", re.compile(r"(?<![\w/.~:@-])[A-Za-z_][\w.-]*(?:/[\w.@+-]+)*/[\w@+-][\w.@+-]*\.[A-Za-z]\w*(?![\w/])")),
        ("/", re.compile(r"(?<![\w/.~:@-])[A-Za-z_][\w.-]*(?:/[\w.@+-]+){2,}/?")),
        (r"\\", re.compile(r"\b[A-Za-z]:\\[^\s\\:*?\"<>|]+(?:\\[^\s\\:*?\"<>|]+)*")),
        (r"\.", re.compile(r"(?<![\d.])\d{1,3}(?:\.\d{1,3}){3}(?::\d{2,5})?(?!\.?\d)")),
        # every label lower case and the last one starting with a letter: not `e.g.`, `3.11`, `Node.js`
        (r"\.", re.compile(
            r"(?<![\w@./-])(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+[a-z][a-z0-9-]*[a-z0-9](?::\d{2,5})?"
            r"(?:/[\w.~%+-]+)*/?(?![\w-])"
        )),
        ("_", re.compile(r"(?<![\w-])[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+(?![\w-])")),
        ("_", re.compile(r"(?<![\w-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?![\w-])")),
        ("[a-z][A-Z]", re.compile(r"(?<![\w-])[a-z]{2,}(?:[A-Z][a-z0-9]+)+(?![\w-])")),
        ("-", re.compile(r"(?<![\w-])[A-Z]{2,10}-\d{2,}(?![\w-])")),
        (r"\d", re.compile(r"(?<![\w-])(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{5,}(?![\w-])")),
        (r"\d", re.compile(r"(?<![\w-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,64}(?![\w-])")),
        # kebab-case with a digit: `internal-hbr-2291`, `api-v2-canary`; not `state-of-the-art`
        ("-", re.compile(r"(?<![\w-])(?=[a-z0-9-]*\d)[a-z0-9]+(?:-[a-z0-9]+){2,}(?![\w-])")),
    )
)


def identifier_spans(sentence: str) -> list[tuple[int, int]]:
    """(start, end) of each identifier in the sentence, in order, never overlapping."""
    spans: list[tuple[int, int]] = []
    for needs, pattern in _PATTERNS:
        for match in pattern.finditer(sentence) if needs.search(sentence) else ():
            start, end = match.start(), match.start() + len(match.group().rstrip(_TRAILING))
            if end > start and not any(start < e and s < end for s, e in spans):
                spans.append((start, end))
    return sorted(spans)
