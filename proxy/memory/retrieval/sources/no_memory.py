"""Messages that carry no memory: an assistant's non-answer, a user's bare question.

"I'm sorry, I don't know your daughter's name" shares every word with the next question
about her and says nothing: it is never a memory. The question the user asked before says
nothing either, but what answered it may: it is a weak match, filling only the slots no
fact takes. And when every word of it is in the question asked now, it is the same
question again: not a memory at all, and its answer, found by the words it answered
(each message is indexed with the two before it), takes the line.
"""

from __future__ import annotations

import re
from functools import lru_cache

from proxy.memory.retrieval.keywords import question_terms

# An assistant saying it does not know, or was not told.
_NON_ANSWER = re.compile(
    r"\b(?:i\s+(?:do\s+not|don['’]t|cannot|can['’]t|could\s+not|couldn['’]t)\s+"
    r"(?:know|recall|remember|find|see|tell|access)"
    r"|i\s+(?:have\s+no|don['’]t\s+have|do\s+not\s+have)\s+(?:\w+\s+){0,2}"
    r"(?:information|record|memory|memories|idea|access|way\s+of\s+knowing)"
    r"|i['’]m\s+not\s+sure|i\s+am\s+not\s+sure"
    r"|you\s+(?:haven['’]t|have\s+not|never|didn['’]t|did\s+not)\s+(?:\w+\s+){0,2}(?:told|mentioned|said|shared)"
    r"|i\s+(?:was|wasn['’]t|have\s+not\s+been|haven['’]t\s+been)\s+(?:never\s+)?told)\b",
    re.IGNORECASE,
)
# A non-answer is short: a long reply that says "I'm not sure" once may still hold facts.
NON_ANSWER_MAX_CHARS = 300
BARE_QUESTION_MAX_CHARS = 200
_SENTENCE_END = re.compile(r"[.!?]+(?:\s+|$)")
# How a question starts when it is typed without its "?": a question word then a verb asked
# before its subject ("what are my cats called", "how many", "what's"), or that verb then its
# subject ("do you know", "is my flight"). A statement starting with such a word is no
# question: "when I was six I broke my arm", "can't sleep tonight".
_AUX = r"(?:is|are|was|were|am|do|does|did|can|could|will|would|should|shall|may|might|must|have|has|had)"
_SUBJECT = r"(?:i|you|we|they|he|she|it|my|your|our|their|his|her|its|the|there|this|that|these|those|a|an)"
_ASKS = re.compile(
    rf"(?:(?:what|who|whom|whose|where|when|why|how|which)(?:\s+{_AUX}\b|['’]s\b|\s+(?:many|much|long|often|old|far)\b)"
    rf"|{_AUX}(?:n['’]t)?\s+{_SUBJECT}\b)",
    re.IGNORECASE)


def carries_memory(role: str, text: str) -> bool:
    """False for an assistant's short non-answer and for a user's message that only asks."""
    if role == "assistant":
        return not non_answer(text)
    if role == "user":
        return _bare_question(text.strip()) is None
    return True


def asked_again(text: str, asked: frozenset[str]) -> bool:
    """True for a bare question whose every term is one of `asked`, the terms of the question
    asked now: it says nothing the request does not."""
    terms = _bare_question(text.strip())
    return terms is not None and bool(terms) and terms <= asked  # "why?" alone is no question asked again


def non_answer(text: str) -> bool:
    """True for a short reply saying it does not know or was not told."""
    text = text.strip()
    return len(text) <= NON_ANSWER_MAX_CHARS and _says_not_known(text)


# The same stored messages are candidates turn after turn, and each is asked about by several
# sources and steps of one recall: a short text's reading is cached (a long one is never
# either kind, and would stay alive in the cache).
def _bare_question(text: str) -> frozenset[str] | None:
    """The terms of a text that only asks (a bare question), None for any other text."""
    return _bare_question_terms(text) if len(text) <= BARE_QUESTION_MAX_CHARS else None


@lru_cache(maxsize=4096)
def _bare_question_terms(text: str) -> frozenset[str] | None:
    return frozenset(question_terms(text)) if _only_asks(text) else None


@lru_cache(maxsize=4096)
def _says_not_known(text: str) -> bool:
    return _NON_ANSWER.search(text) is not None


def _only_asks(text: str) -> bool:
    """Every sentence of the text is a question; the last may lack its "?" when it starts as one."""
    ends = list(_SENTENCE_END.finditer(text))
    if not all("?" in end.group() for end in ends):
        return False
    last = text[ends[-1].end():] if ends else text
    return _ASKS.match(last) is not None if last else bool(ends)
