"""Relative clauses read as sentences of their own, so each fact keeps its subject.

"My sister, who lives in Paris, works at Google" is read as "My sister lives in Paris"
and "My sister works at Google". Read whole, "Paris, works at Google" looks like a
sentence whose subject is Paris. ", which" opens one the same way ("My car, which is
blue, is parked in Oslo"), and ", whose" one about what the subject has: "My brother Sam,
whose wife is a doctor, lives in Lisbon" is read as "My brother Sam's wife is a doctor"
and "My brother Sam lives in Lisbon".
"""

from __future__ import annotations

import itertools
import re

from proxy.memory.extraction.names import NAME
from proxy.memory.extraction.roles import SINGULAR

# The clause runs to the comma before the main verb. A comma before a capitalised word
# stays inside it ("who lives in Paris, France, works at ..."); a clause left open runs to
# the end ("I met Tom, who works at Acme."). A `;` or `:` inside, or a comma before
# anything else, means it is not such a clause. Scanned comma by comma, not by one regex:
# a pattern of this shape backtracks over every split of a long run of spaces (2 s for an
# 8,000-character message, with the event loop stalled).
_OPENER = re.compile(r",\s+(who|which|whose)\s+")
_STOP = re.compile(r"[,;:]")
_SPACE_AFTER = re.compile(r"\s+")
MAX_CLAUSES = 4  # per sentence; more is a list, not a description of one subject


def clause_sentences(sentence: str) -> list[str]:
    """The sentence with each relative clause cut out, then each clause joined to its subject."""
    clauses: list[str] = []
    while len(clauses) < MAX_CLAUSES and (found := _first_clause(sentence)):
        start, possessive, clause, end = found
        head = sentence[:start]
        clauses.append(f"{head}'s {clause}" if possessive else f"{head} {clause}")
        sentence = f"{head} {sentence[end:]}".rstrip()
    return [sentence, *clauses]


def _first_clause(sentence: str) -> tuple[int, bool, str, int] | None:
    """Where the first relative clause starts, whether it says what the subject has
    (`whose`), its text, and where the sentence goes on."""
    for opener in _OPENER.finditer(sentence):
        if (ends := _clause_end(sentence, opener.end())) is not None:
            return opener.start(), opener.group(1) == "whose", sentence[opener.end():ends[0]], ends[1]
    return None


def _clause_end(sentence: str, start: int) -> tuple[int, int] | None:
    """The clause's end and the main sentence's restart, or None when none closes it."""
    if start >= len(sentence) or sentence[start] in ",;:":
        return None
    at = start
    while (stop := _STOP.search(sentence, at)) is not None:
        after = _SPACE_AFTER.match(sentence, stop.end()) if stop.group() == "," else None
        if after is None or after.end() >= len(sentence):
            return None
        following = sentence[after.end()]
        if "a" <= following <= "z":
            return stop.start(), after.end()  # the comma before the main verb
        if not "A" <= following <= "Z":
            return None
        at = after.end()  # "Paris, France": still the clause
    return len(sentence), len(sentence)


# "Tim is from Ireland and lives in Boston": a second predicate whose subject is left
# out is read with the sentence's own subject, when the sentence opens with one (I, we,
# a name, or my + role). Verb agreement does the rest: "I think Tom moved to Rome and
# works at Acme" gives "I works at Acme", which no rule reads.
_LEAD_SUBJECT = re.compile(
    rf"\s*(?P<subject>I|We|[Mm]y\s+(?:[a-z]+\s+){{0,2}}?(?:{SINGULAR})(?:\s+{NAME})?|{NAME})\s+")
_POSSESSIVE = re.compile(r"['’]s$")  # "Tom's wife works at Acme and ...": not Tom
_CONJOINED = re.compile(r",?\s+(?:and|but)\s+(?=[a-z])")
MAX_CONJOINED = 4


# Words whose reach may take in the next predicate too: "I don't live in Rome and work at
# Acme", "I used to ... and ...", "I want to move to Rome and work at Acme".
_REACHING = re.compile(
    r"n't\b|'(?:ll|d)\b|\b(?:not|never|no\s+longer|used\s+to|wants?|wanted|wish(?:es|ed)?|hop(?:e|es|ed|ing)|"
    r"plan(?:s|ned|ning)?|going\s+to|will|would|can|cannot|could|might|may|should|must|love\s+to|like\s+to|"
    r"thinking|considering|dream(?:s|ed)?)\b",
    re.IGNORECASE,
)


def conjoined_sentences(sentence: str) -> list[tuple[int, str]]:
    """Each predicate after `and`/`but` that has no subject of its own, given the sentence's,
    with where it starts in the sentence; none after a word that may reach over it."""
    lead = _LEAD_SUBJECT.match(sentence)
    if lead is None or _POSSESSIVE.search(lead.group("subject")):
        return []
    subject = lead.group("subject")
    found = []
    for joint in itertools.islice(_CONJOINED.finditer(sentence, lead.end()), MAX_CONJOINED):
        if _REACHING.search(sentence, lead.end(), joint.start()):
            break
        found.append((joint.end(), f"{subject} {sentence[joint.end():]}"))
    return found
