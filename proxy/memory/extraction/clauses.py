"""Relative clauses read as sentences of their own, so each fact keeps its subject.

"My sister, who lives in Paris, works at Google" is read as "My sister lives in Paris"
and "My sister works at Google". Read whole, "Paris, works at Google" looks like a
sentence whose subject is Paris.
"""

from __future__ import annotations

import re

# The clause runs to the comma before the main verb. A comma before a capitalised word
# stays inside it ("who lives in Paris, France, works at ..."); a clause left open runs to
# the end ("I met Tom, who works at Acme.").
_RELATIVE = re.compile(r",\s+who\s+(?P<clause>[^,;:]+(?:,\s+[A-Z][^,;:]*)*?)(?:,\s+(?=[a-z])|\s*$)")
MAX_CLAUSES = 4  # per sentence; more is a list, not a description of one subject


def clause_sentences(sentence: str) -> list[str]:
    """The sentence with each relative clause cut out, then each clause joined to its subject."""
    clauses: list[str] = []
    while len(clauses) < MAX_CLAUSES and (match := _RELATIVE.search(sentence)):
        head = sentence[: match.start()]
        clauses.append(f"{head} {match.group('clause')}")
        sentence = f"{head} {sentence[match.end():]}".rstrip()
    return [sentence, *clauses]
