"""`extraction.mode: rules` — deterministic patterns, no model call.

Per sentence: identifiers, first-person and named-subject facts, preferences, then the
remaining capitalised names. Descriptions carry the sentence that stated the fact, so a
lexical search for any of its words finds the entity.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from proxy.memory.extraction.identifiers import identifier_spans
from proxy.extracted import (
    SINGLE_VALUED,
    USER_NODE,
    ExtractedEntity,
    ExtractedRelation,
    Extraction,
    canonical_name,
)
from proxy.memory.extraction.names import find_names
from proxy.memory.extraction.preferences import preference_facts
from proxy.memory.extraction.relations import Fact, facts, user_alias, user_name
from proxy.memory.extraction.roles import NOTE_END

__all__ = ["SINGLE_VALUED", "USER_NODE", "canonical_name", "extract"]

MAX_DESCRIPTION_CHARS = 160
# Patterns cost up to quadratic time in the length of what they read; a pasted log or a
# run-on line is read in pieces of this size, cut at spaces.
MAX_SENTENCE_CHARS = 600
_FACT, _IDENTIFIER, _NAME = 3, 2, 1  # which source wins when two describe one entity
_CONFIDENCE = {_FACT: 0.8, _IDENTIFIER: 0.9, _NAME: 0.6}

_REDACTED = re.compile(r"\[REDACTED:[a-z_]+\]")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])[\"')\]]*\s+|\s*\n\s*")
_ABBREVIATION = re.compile(r"(?:\b(?:Dr|Mr|Mrs|Ms|Mx|Prof|St|Jr|Sr|vs|Mt|No|approx)|\b[a-z]\.[a-z])\.$", re.IGNORECASE)
_CONTRACTIONS = (  # each with an apostrophe: a sentence without one is left as it is
    (re.compile(r"\b(I|[Ww]e|[Yy]ou|[Tt]hey)'re\b"), r"\1 are"),
    (re.compile(r"\bI'm\b"), "I am"),
    (re.compile(r"\b(I|[Ww]e|[Yy]ou|[Tt]hey)'ve\b"), r"\1 have"),
    (re.compile(r"\b(I|[Ww]e|[Yy]ou|[Tt]hey)'d\b"), r"\1 would"),
    (re.compile(r"\b(I|[Ww]e|[Yy]ou|[Tt]hey)'ll\b"), r"\1 will"),
    (re.compile(r"\b([Cc])an't\b"), r"\1annot"),
    (re.compile(r"\b([Ww])on't\b"), r"\1ill not"),
    (re.compile(r"\b(\w+)n't\b"), r"\1 not"),
)
# intensifiers between an auxiliary and its verb: "I am really into", "I have honestly never"
_INTENSIFIERS = re.compile(r"\s+(?:really|truly|totally|absolutely|honestly|actually|genuinely|seriously|definitely)\b")


def extract(text: str, *, speaker: str | None = None) -> Extraction:
    """Entities, relationships and the user's stated name found in one message."""
    text = text.replace("\u2019", "'").replace("\u2018", "'")
    if speaker and text.lower().startswith(f"{speaker.lower()}:"):
        text = text[len(speaker) + 1 :]
    found = _Found(speaker)
    for sentence in sentences(text):
        found.read(sentence)
    return found.result()


def sentences(text: str) -> list[str]:
    """The text cut at sentence ends and line breaks, not after `Dr.` or `e.g.`."""
    out: list[str] = []
    start = 0
    for match in _SENTENCE_BREAK.finditer(text):
        tail = text[max(start, match.start() - 12) : match.start()]
        if _ABBREVIATION.search(tail) and "\n" not in match.group():
            continue
        out.append(text[start : match.start()].strip())
        start = match.end()
    out.append(text[start:].strip())
    return [piece for sentence in out if sentence for piece in _pieces(sentence)]


def _pieces(sentence: str) -> list[str]:
    pieces = []
    while len(sentence) > MAX_SENTENCE_CHARS:
        cut = sentence.rfind(" ", MAX_SENTENCE_CHARS // 2, MAX_SENTENCE_CHARS)
        cut = cut if cut > 0 else MAX_SENTENCE_CHARS
        pieces.append(sentence[:cut].strip())
        sentence = sentence[cut:].strip()
    return [*pieces, sentence] if sentence else pieces


def normalise(sentence: str) -> str:
    """`I'm` -> `I am`, `don't` -> `do not`, intensifiers dropped: one spelling of each verb."""
    if "'" in sentence:
        for pattern, replacement in _CONTRACTIONS:
            sentence = pattern.sub(replacement, sentence)
    return _INTENSIFIERS.sub("", sentence)


def describe(sentence: str, speaker: str | None = None) -> str:
    """The stated fact as an entity description: one line, attributed, at most 160 characters."""
    line = " ".join(sentence.split())
    if speaker:
        line = f"{speaker}: {line}"
    if len(line) <= MAX_DESCRIPTION_CHARS:
        return line
    return line[: MAX_DESCRIPTION_CHARS - 1].rsplit(" ", 1)[0] + "…"


class _Found:
    """What the sentences of one text yielded so far, merged by canonical name."""

    def __init__(self, speaker: str | None) -> None:
        self.speaker = speaker
        self.speaker_fact = ""  # the first sentence that stated something about the speaker
        self.entities: dict[str, tuple[int, ExtractedEntity]] = {}
        self.relationships: dict[tuple[str, str, str], ExtractedRelation] = {}
        self.user_name: str | None = None
        self.user_alias: str | None = None

    def read(self, sentence: str) -> None:
        """Add what one sentence states."""
        description = describe(sentence, self.speaker)
        normal = normalise(sentence)
        blocked = self._identifiers(sentence, description)
        if self.speaker is None:
            self.user_name = self.user_name or user_name(normal)
            self.user_alias = self.user_alias or user_alias(normal)
        stated = [] if sentence.rstrip(" \"')").endswith("?") else [*facts(normal), *preference_facts(normal)]
        self._facts(stated, description)
        objects = [canonical_name(fact.object) for fact in stated]
        for name in find_names(sentence, blocked):
            if not _inside(canonical_name(name.text), objects):
                self._entity(name.text, name.type, description, _NAME)

    def _identifiers(self, sentence: str, description: str) -> list[tuple[int, int]]:
        """Add the sentence's identifiers; return the spans names must not overlap."""
        blocked = [m.span() for m in _REDACTED.finditer(sentence)]
        for start, end in identifier_spans(sentence):
            if not any(start < e and s < end for s, e in blocked):
                self._entity(sentence[start:end], "identifier", description, _IDENTIFIER)
                blocked.append((start, end))
        return blocked

    def _facts(self, stated: Iterable[Fact], description: str) -> None:
        for fact in stated:
            subject = fact.subject or self.speaker or USER_NODE
            if fact.subject_role:
                subject = f"{self.speaker or 'the user'}'s {fact.subject_role}"
            if fact.subject or fact.subject_role:
                self._entity(subject, "person", description, _FACT)
            else:
                self.speaker_fact = self.speaker_fact or description
            note = f"{fact.note}{NOTE_END}{description}" if fact.note else description
            self._entity(fact.object, fact.object_type, note, _FACT)
            key = (canonical_name(subject), fact.type, canonical_name(fact.object))
            self.relationships.setdefault(key, ExtractedRelation(subject, fact.type, fact.object))

    def _entity(self, name: str, kind: str, description: str, rank: int) -> None:
        key = canonical_name(name)
        held = self.entities.get(key)
        if key and (held is None or held[0] < rank):
            self.entities[key] = (rank, ExtractedEntity(name, kind, description, _CONFIDENCE[rank]))

    def result(self) -> Extraction:
        """The merged extraction; the speaker's own name is a node only when a fact needs it."""
        own = {canonical_name(name) for name in (self.user_name, self.user_alias, self.speaker) if name}
        entities = [entity for key, (_, entity) in self.entities.items() if key not in own]
        if self.speaker and self.speaker_fact:
            entities.insert(0, ExtractedEntity(self.speaker, "person", self.speaker_fact, _CONFIDENCE[_FACT]))
        return Extraction(entities, list(self.relationships.values()), self.user_name, self.user_alias)


def _inside(name: str, objects: list[str]) -> bool:
    """A name within a longer fact object is part of it: "Studio Ghibli" in "Studio Ghibli films"."""
    return any(name != obj and f" {name} " in f" {obj} " for obj in objects)
