"""Capitalised names in a sentence, cleaned of sentence-initial words and typed by context."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from proxy.memory.extraction.lexicon import (
    DEMONYMS,
    ENTITY_TYPES,
    EVENT_HEADS,
    FROM_CUES,
    MONTHS_AND_DAYS,
    MOTION_VERBS,
    OF_HEADS,
    ORG_HEADS,
    ORG_SUFFIXES,
    PLACE_PREPOSITIONS,
    PLACE_SUFFIXES,
    PRODUCT_VERBS,
    STARTERS,
    SUBJECT_CUES,
    TECH,
    TECH_ORGS,
)
from proxy.extracted import canonical_name

_TITLE = r"(?:Dr|Mr|Mrs|Ms|Mx|Prof|Sir|Dame|St|Saint)\.?\s+"
# Two characters at least, so `I` and `A` never start a name; `I'm` is not one either.
_WORD = r"(?<![\w'&-])(?!I')(?:[A-Z][A-Za-z0-9'&-]*[A-Za-z0-9]|[a-z]+[A-Z][A-Za-z0-9]*)"
_LINK = r"(?:[ \t]+(?:of|de|del|da|van|von|der|den|du|la|le|&)[ \t]+|[ \t]+)"
# Bounded so a long capitalised run costs linear time, not quadratic: no name has ten words.
MAX_NAME_WORDS = 8
NAME = rf"(?:{_TITLE})?{_WORD}(?:{_LINK}{_WORD}){{0,{MAX_NAME_WORDS - 1}}}"
_NAME = re.compile(NAME)
_TOKEN = re.compile(r"\S+")
_LOWER_WORDS = re.compile(r"[a-z']+")
_INNER_CAPITAL = re.compile(r"[a-z][A-Z]|\d")
_WORK_CONTEXT = re.compile(
    r"\b(?:work(?:s|ed|ing)?\s+(?:at|for)|job\s+(?:at|with)|employed\s+(?:at|by)|joined|"
    r"intern(?:ing|ed)?\s+at|(?:engineer|developer|manager|designer|analyst|nurse|teacher)\s+at)\s+(?:the\s+)?$"
)
_ROLE_WORDS = frozenset(
    """user assistant manager boss wife husband partner dentist doctor cat dog pet sister brother
    friend mom dad mother father son daughter team company""".split()
)
_LINKS = frozenset("of de del da van von der den du la le &".split())
_SUBJECT_AFTER = re.compile(r"\s+and\s+(?:I|me|my)\b|,\s+(?:my|our|his|her|their)\s|\s+([a-z]+)\b")


@dataclass(frozen=True)
class Name:
    """A cleaned name and the type its own words or its context suggest."""

    text: str
    type: str


def _is_common(token: str) -> bool:
    low = canonical_name(token)
    return low in STARTERS or (len(low) > 4 and low.endswith(("ing", "ed", "ly")))


Token = tuple[str, int]  # text and where it starts in the sentence


def _segments(tokens: list[Token]) -> Iterator[list[Token]]:
    """Runs of tokens between months, days and demonyms, without dangling links."""
    run: list[Token] = []
    for token in [*tokens, ("", -1)]:
        low = canonical_name(token[0])
        joins = low != "of" or (bool(run) and canonical_name(run[-1][0]) in OF_HEADS)
        if low and low not in MONTHS_AND_DAYS | DEMONYMS and joins:
            run.append(token)
            continue
        while run and run[-1][0].lower() in _LINKS:
            run.pop()
        if run:
            yield run
        run = []


def _shouted(tokens: list[str]) -> bool:
    return all(token.isupper() for token in tokens) and canonical_name(" ".join(tokens)) not in TECH


def is_plausible(name: str, *, acronym: bool = False) -> bool:
    """Not empty, not a common word, not a type or role on its own, not a build file.

    An all-capitals name is an acronym only where a pattern vouches for it ("I work at IBM");
    elsewhere it is more often shouting or jargon (API, TCP).
    """
    low = canonical_name(name)
    tokens = name.split()
    return bool(tokens) and not (
        low in STARTERS
        or low in ENTITY_TYPES
        or low in _ROLE_WORDS
        or low in DEMONYMS
        or low in MONTHS_AND_DAYS
        or (_shouted(tokens) and not acronym)
        or (len(tokens) == 1 and low.endswith("file") and low != "file")
    )


def name_type(name: str) -> str | None:
    """The type a name's own words give it — `Acme Labs`, `Golden Gate Park` — if any."""
    low = canonical_name(name)
    words = low.split() or [""]
    if words[-1] in ORG_SUFFIXES or words[0] in ORG_HEADS or low in TECH_ORGS:
        return "organization"
    if low in TECH or any(word in TECH for word in words):
        return "product"
    if words[-1] in PLACE_SUFFIXES:
        return "place"
    return None


def _before_words(sentence: str, start: int) -> list[str]:
    return _LOWER_WORDS.findall(sentence[max(0, start - 60) : start].lower())[-4:]


def guess_type(name: str, sentence: str, start: int, previous: str | None = None) -> str:
    """person, organization, place or product, from the name's own words and what precedes it."""
    own = name_type(name)
    if own:
        return own
    before = _before_words(sentence, start)
    last = before[-1] if before else ""
    if _WORK_CONTEXT.search(sentence[max(0, start - 40) : start].lower()):
        return "organization"
    if _is_place_context(last, before) or (previous == "place" and sentence[:start].rstrip().endswith(",")):
        return "place"
    if last in PRODUCT_VERBS or _INNER_CAPITAL.search(name):
        return "product"
    return "person"


def _is_place_context(last: str, before: list[str]) -> bool:
    earlier = set(before[:-1])
    return (
        last in PLACE_PREPOSITIONS
        or last in ("visiting", "visited", "visit")
        or (last == "to" and bool(earlier & MOTION_VERBS))
        or (last == "from" and bool(earlier & FROM_CUES))
    )


def _sentence_initial(sentence: str, start: int) -> bool:
    return not sentence[:start].strip(" \t\"'([-*•>")


def _keeps_initial_word(name: str, sentence: str, end: int) -> bool:
    """A lone sentence-opening word is a name only when it is known or acts as a subject."""
    if canonical_name(name) in TECH:
        return True
    cue = _SUBJECT_AFTER.match(sentence, end)
    return cue is not None and (cue.group(1) is None or cue.group(1) in SUBJECT_CUES)


def find_names(sentence: str, blocked: list[tuple[int, int]]) -> Iterator[Name]:
    """Each plausible capitalised name of the sentence outside the blocked spans."""
    previous: str | None = None
    for match in _NAME.finditer(sentence):
        if any(match.start() < e and s < match.end() for s, e in blocked):
            continue
        for name in _clean(match, sentence, previous):
            previous = name.type
            yield name


def _clean(match: re.Match[str], sentence: str, previous: str | None) -> Iterator[Name]:
    tokens = [(m.group(), match.start() + m.start()) for m in _TOKEN.finditer(match.group())]
    initial = _sentence_initial(sentence, match.start())
    while initial and len(tokens) > 1 and _is_common(tokens[0][0]):
        tokens.pop(0)
        initial = False
    for segment in _segments(tokens):
        start, (last, last_start) = segment[0][1], segment[-1]
        text = re.sub(r"'s$", "", " ".join(token for token, _ in segment))
        end = last_start + len(last)
        lone_opener = initial and start == match.start() and len(segment) == 1 and not last.endswith("'s")
        if not is_plausible(text) or (lone_opener and not _keeps_initial_word(text, sentence, end)):
            continue
        if last.endswith("'s"):  # "Jenny's wedding", "Alice's laptop": an owner, not the thing owned
            yield Name(text, name_type(text) or "person")
        else:
            yield _with_event_head(text, sentence, start, end, previous)
        previous = None


def _with_event_head(text: str, sentence: str, start: int, end: int, previous: str | None) -> Name:
    """`the Pride parade`: a name followed by an event noun names the event."""
    head = re.match(r"[ \t]+([a-z]+)\b", sentence[end:])
    if head and head.group(1) in EVENT_HEADS:
        return Name(f"{text} {head.group(1)}", "event")
    return Name(text, guess_type(text, sentence, start, previous))
