"""Stated preferences: "I prefer X", "I always use X", "I never use X", "I love X", "I hate X"."""

from __future__ import annotations

import re
from collections.abc import Iterator

from proxy.memory.extraction.relations import Fact, hedged

_ADV = r"(?:\s+(?:really|also|still|just|actually|honestly|absolutely|totally|kind\s+of|genuinely|truly))*"
_VERBS: tuple[tuple[str, str], ...] = (
    (
        "PREFERS",
        r"prefer|would\s+rather(?:\s+use)?|(?:always|usually|mostly|only|generally|typically|normally)\s+"
        r"(?:use|go\s+with)",
    ),
    (
        "AVOIDS",
        r"never\s+use|do\s+not\s+use|(?:try\s+to\s+)?avoid|stay\s+away\s+from|am\s+allergic\s+to|"
        r"cannot\s+eat|do\s+not\s+eat|never\s+eat",
    ),
    (
        "LIKES",
        r"like|love|enjoy|adore|am\s+(?:a\s+)?(?:big\s+|huge\s+)?fan\s+of|am\s+into|cannot\s+live\s+without",
    ),
    ("DISLIKES", r"hate|dislike|cannot\s+stand|do\s+not\s+(?:like|enjoy)|loathe|detest|am\s+not\s+a\s+fan\s+of"),
)
_PATTERNS = tuple(
    (kind, re.compile(rf"(?<![\w'])I{_ADV}\s+(?:{verbs})\s+(?P<rest>[^.!?;]+)")) for kind, verbs in _VERBS
)
_FAVOURITE = re.compile(
    r"\b(?:[Mm]y|[Oo]ur)\s+(?:(?:all-time\s+)?favou?rite|go-to|preferred)\s+[a-z][a-z ]{0,30}?\s+is\s+"
    r"(?P<rest>[^.!?;]+)|\b(?:[Mm]y|[Oo]ur)\s+[a-z][a-z ]{0,30}?\s+of\s+choice\s+is\s+(?P<rest2>[^.!?;]+)"
)
_FAVOURITE_IS = re.compile(
    r"^(?P<rest>[^,.;!?]+?)\s+(?:is|are)\s+(?:[Mm]y|[Oo]ur)\s+(?:all-time\s+)?(?:favou?rite|go-to)\b"
)
# "Spaces, not tabs, are what I prefer."
_FRONTED = re.compile(
    r"^(?P<rest>[^,.;!?]+?)(?:,[^.;!?]*?)?\s+(?:is|are)\s+what\s+I\s+(?P<verb>prefer|like|love|use)\b"
)
# Said to the assistant: "never suggest MongoDB to me", "stop recommending Java".
_NEVER_SUGGEST = re.compile(
    r"\b(?:[Nn]ever|[Dd]o\s+not\s+(?:ever\s+)?|[Ss]top)\s*(?:suggest|recommend)(?:ing)?\s+(?P<rest>[^.!?;]+)"
)

_LEAD = re.compile(r"(?:to\s+use|using|to\s+work\s+with|working\s+with|to)\s+")
_DETERMINERS = frozenset("a an the some".split())
_WORD = re.compile(r"[\w+#][\w+#.'-]*[\w+#]|[\w+#]|,")
_REJECT_FIRST = frozenset(
    """it that this these those them him her you your my our his their its how what when where why
    who which if so being doing anything everything something nothing one ones all both any
    think say know ask see mention point add note clarify confirm hear learn have be get""".split()
)
_STOP = frozenset(
    """over than to for in on at when whenever while because since as but or so if with instead
    rather during unless though although which that who every each by from about after before
    anymore too very much lately nowadays now today daily again more most better best is are was
    were will would can could should do does did not no all either i we you they he she it""".split()
)
_OBJECT_PRONOUNS = frozenset({"it", "them", "him", "her", "me", "us"})
_META = frozenset("idea way plan suggestion answer approach solution sound look part point fact thought option".split())
MAX_WORDS = 4


def preference_facts(text: str) -> Iterator[Fact]:
    """PREFERS / AVOIDS / LIKES / DISLIKES facts, each to a preference named by its object."""
    for kind, pattern in _PATTERNS:
        for match in pattern.finditer(text):
            if not hedged(text, match.start()):
                yield from (Fact(None, kind, item, "preference") for item in objects(match.group("rest")))
    for match in _FAVOURITE.finditer(text):
        rest = match.group("rest") or match.group("rest2")
        yield from (Fact(None, "PREFERS", item, "preference") for item in objects(rest)[:1])
    for match in _FAVOURITE_IS.finditer(text):
        yield from (Fact(None, "PREFERS", item, "preference") for item in objects(match.group("rest"))[:1])
    for match in _FRONTED.finditer(text):
        kind = "LIKES" if match.group("verb") in ("like", "love") else "PREFERS"
        yield from (Fact(None, kind, item, "preference") for item in objects(match.group("rest")))
    for match in _NEVER_SUGGEST.finditer(text):
        yield from (Fact(None, "AVOIDS", item, "preference") for item in objects(match.group("rest")))


def _ends_phrase(following: list[str]) -> bool:
    """Whether the pronoun before `following` ends its phrase ("use it at work", "avoid it",
    "making it a better place"), rather than starting a clause ("the taste it adds")."""
    return not following or following[0].lower() in _STOP or following[0].lower() in _DETERMINERS


def objects(rest: str) -> list[str]:
    """The things a preference is about: "tabs over spaces" -> [tabs]; "hiking and camping" -> both."""
    rest = _LEAD.sub("", rest.strip(), count=1) if _LEAD.match(rest.strip()) else rest.strip()
    items: list[str] = []
    words: list[str] = []
    tokens = _WORD.findall(rest)
    for at, token in enumerate(tokens):
        low = token.lower()
        if not words and (low in _REJECT_FIRST or (not items and low in _STOP)):
            break
        if token == "," or low == "and":
            if not words:
                break
            items.append(" ".join(words))
            words = []
            continue
        if low in _STOP or len(words) == MAX_WORDS:
            if items and len(words) == 1 and low in _OBJECT_PRONOUNS and _ends_phrase(tokens[at + 1:at + 2]):
                words = []  # "I love Python and use it at work": a verb and its object, not a liking
            break
        if not words and low in _DETERMINERS:
            continue
        words.append(token)
    items.append(" ".join(words))
    return [item for item in items if item and item.lower() not in _META]
