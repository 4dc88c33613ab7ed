"""The terms a question is searched by, and the keyword retry for when they find nothing (docs/retrieval.md).

A question such as "where do I work?" rarely matches stored text as a whole, so
`conversation` and `long-term` retry with its longest significant words, each as typed and
in Title Case, and rank what comes back by how many of the query's words it shares. Every
search leaves out the words that only shape a question ("likely", "remind me").
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from proxy.terms import STOP_WORDS, query_terms, terms

# Words that shape a question rather than name what it asks about ("would she likely ...",
# "remind me of ...", "how many ..."): a memory holding them is no closer to the answer. Matched as whole
# words, before stemming ("likely" stems to "like", which does name what is asked).
_QUESTION_WORDS = re.compile(
    r"\b(?:likely|unlikely|might|maybe|perhaps|probably|possibly|kind|sort|type|think|remember|remind"
    r"|recall|tell|know|how\s+(?:many|much))\b", re.IGNORECASE)
MAX_RETRY_WORDS = 4
MIN_WORD_CHARS = 3

_EDGES = re.compile(r"^[\W_]+|[\W_]+$")
# Possessives and contractions: Alice's → Alice, isn't → is, we'll → we.
_CLITIC = re.compile(r"(?:n['’]t|['’](?:s|t|m|re|ve|ll|d))$", re.IGNORECASE)


def _word(token: str) -> str:
    """A whitespace-separated token without edge punctuation, possessive or contraction."""
    return _EDGES.sub("", _CLITIC.sub("", _EDGES.sub("", token)))


def retry_terms(query: str) -> list[str]:
    """Up to four longest significant words, as typed, longest first, ties by first appearance."""
    unique: dict[str, str] = {}
    for token in query.split():
        word = _word(token)
        if len(word) >= MIN_WORD_CHARS and word.lower() not in STOP_WORDS:
            unique.setdefault(word.casefold(), word)
    return sorted(unique.values(), key=lambda word: -len(word))[:MAX_RETRY_WORDS]


def variants(word: str) -> list[str]:
    """The word as typed and in Title Case (first letter upper, the rest lower), each once."""
    return list(dict.fromkeys([word, word[:1].upper() + word[1:].lower()]))


def rank_by_shared_words(candidates: Iterable[tuple[str, str]], query: str) -> list[str]:
    """Candidate ids, each once, most query words shared first, ties in the order given."""
    wanted = set(query_terms(query))
    shared: dict[str, int] = {}
    for candidate_id, text in candidates:
        if candidate_id not in shared:
            shared[candidate_id] = len(wanted.intersection(terms(text)))
    return sorted(shared, key=lambda candidate_id: -shared[candidate_id])


def question_terms(text: str) -> list[str]:
    """The query's terms without the words that only shape the question; all of them when
    nothing else is left ("what do you remember?")."""
    return query_terms(_QUESTION_WORDS.sub(" ", text)) or query_terms(text)
