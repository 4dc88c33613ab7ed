"""Facts a sentence states about its speaker or a named person, as typed relationships.

Patterns read a sentence whose contractions are expanded ("I'm" -> "I am"). A fact whose
subject is `None` belongs to the speaker: the user, or the named speaker of a transcript line;
with a `subject_role`, to the speaker's unnamed sister, manager, ...
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from proxy.memory.extraction.clauses import clause_sentences, conjoined_sentences
from proxy.memory.extraction.lexicon import EVENT_HEADS, MONTHS_AND_DAYS, STARTERS, TECH
from proxy.extracted import canonical_name
from proxy.memory.extraction.names import NAME, is_plausible, name_type
from proxy.memory.extraction.roles import PLURAL, PLURALS, SINGULAR, SPECIES, SPECIES_PLURAL, role_of


@dataclass(frozen=True)
class Fact:
    """One relationship: subject (None for the speaker), type, object name and object type."""

    subject: str | None
    type: str
    object: str
    object_type: str
    note: str = ""  # the species of a pet, carried into its description
    # set when the subject is someone the speaker names only by role ("my sister"); subject is None
    subject_role: str = ""


_ADV = (
    r"(?:\s+(?:now|currently|still|recently|just|also|actually|finally|already|officially|soon|"
    r"happily|proudly|previously|formerly|once|really|both|all))*"
)
_JOB = (
    r"(?i:engineer|developer|manager|designer|analyst|scientist|teacher|nurse|lawyer|consultant|intern|"
    r"director|lead|researcher|professor|architect|accountant|administrator|founder|co-founder|"
    r"programmer|writer|editor|chef|barista|technician|specialist|officer|associate|executive|"
    r"recruiter|coordinator|assistant|cto|ceo|cfo|vp|sre|pm|owner|partner|doctor|physician|surgeon|"
    r"pharmacist|librarian|mechanic|electrician|pilot|cashier|clerk|tutor|lecturer|postdoc|chemist|"
    r"biologist|physicist|economist|journalist|photographer|artist|musician|veterinarian|vet|paramedic|"
    r"firefighter|carpenter|plumber|scientist|statistician|mathematician|therapist|counselor|"
    r"translator|marketer|salesperson|representative|agent|buyer|planner|strategist|nanny|caregiver)"
)
_MODS = r"(?P<mods>(?:[a-z]+\s+){0,2}?)"  # "my older sister", "our golden retriever"
_GONE = r"(?P<gone>ex-)?"
_GONE_WORDS = frozenset("ex late former previous old dead".split())
_MY = r"\b(?:[Mm]y|[Oo]ur)\s+"
_NAMED = r"(?:the\s+|an?\s+(?:[\w-]+\s+){1,3}?(?:called|named)\s+)?"  # "a fintech called Monzo"
_NAME_LIST = rf"{NAME}(?:(?:,\s+|,?\s+and\s+){NAME}){{0,7}}"


def _first_person(verbs: str, *, we: bool = False) -> re.Pattern[str]:
    subject = r"(?:I|[Ww]e)" if we else "I"
    return re.compile(rf"(?<![\w'])(?P<subj>{subject}){_ADV}\s+(?:{verbs})\s+{_NAMED}(?P<obj>{NAME})")


def _third_person(verbs: str) -> re.Pattern[str]:
    subject = rf"(?:(?P<subj>{NAME})|{_MY}{_MODS}(?P<role>{SINGULAR}))"  # "Tom", or "my sister"
    return re.compile(rf"{subject},?{_ADV}\s+(?:{verbs})\s+{_NAMED}(?P<obj>{NAME})")


_HAS_JOB = rf"(?:an?|the)\s+(?:[\w-]+\s+){{0,3}}?{_JOB}\s+(?:at|for|with|of)"
_SPAN = r"\s+\S+(?:\s+\S+)?\s+(?:since|for)\b"  # "Acme since 2020", "Acme Corp for years"


# (relationship, object type, first-person verbs, third-person verbs, whether "we" counts)
_FACTS: tuple[tuple[str, str, str, str | None, bool], ...] = (
    (
        "WORKS_AT",
        "organization",
        r"work\s+(?:at|for)|am\s+working\s+(?:at|for)|have\s+been\s+working\s+(?:at|for)|joined|"
        r"am\s+employed\s+(?:at|by)|got\s+a\s+(?:new\s+)?job\s+(?:at|with)|"
        r"started\s+(?:a\s+new\s+job\s+|working\s+)?at|start\s+(?:working\s+)?at|am\s+interning\s+at|"
        r"(?:teach|lecture|intern)\s+at|"
        r"(?:found|landed|got|took|accepted)\s+a\s+(?:new\s+)?(?:job|role|position)\s+(?:at|with)|"
        rf"(?:am|work\s+as)\s+{_HAS_JOB}",
        r"works\s+(?:at|for)|is\s+working\s+(?:at|for)|joined|is\s+employed\s+(?:at|by)|"
        rf"has\s+been\s+working\s+(?:at|for)|(?:is|works\s+as)\s+{_HAS_JOB}",
        False,
    ),
    ("WORKED_AT", "organization", r"used\s+to\s+work\s+(?:at|for)|worked\s+(?:at|for)", r"worked\s+(?:at|for)", False),
    # present perfect with a span of time still holds: "I have worked for Shopify since 2020"
    ("WORKS_AT", "organization", rf"have\s+worked\s+(?:at|for)(?={_SPAN})", None, False),
    ("WORKED_AT", "organization", rf"have\s+worked\s+(?:at|for)(?!{_SPAN})", None, False),
    (
        "LIVES_IN",
        "place",
        r"live\s+in|am\s+living\s+in|are\s+living\s+in|have\s+(?:been\s+living|lived)\s+in|"
        r"moved\s+(?:back\s+)?to|relocated\s+to|(?:am|are)\s+based\s+(?:in|out\s+of)|reside\s+in|"
        r"am\s+an?\s+(?:[\w-]+\s+){1,3}?based\s+in",
        r"lives\s+in|is\s+living\s+in|moved\s+to|is\s+based\s+in",
        True,
    ),
    ("LIVED_IN", "place", r"used\s+to\s+live\s+in|lived\s+in", r"lived\s+in|used\s+to\s+live\s+in", True),
    (
        "FROM",
        "place",
        r"am\s+(?:originally\s+)?from|come\s+from|grew\s+up\s+in|was\s+born\s+(?:and\s+raised\s+)?in",
        r"is\s+(?:originally\s+)?from|comes\s+from|grew\s+up\s+in|was\s+born\s+in",
        False,
    ),
    (
        "STUDIES_AT",
        "organization",
        r"study\s+at|am\s+studying\s+at|am\s+enrolled\s+at|attend|go\s+to\s+school\s+at|"
        r"am\s+an?\s+(?:[\w-]+\s+){0,2}?(?:student|undergrad|undergraduate|freshman|sophomore)\s+at",
        r"studies\s+at|is\s+studying\s+at|attends",
        False,
    ),
    ("STUDIED_AT", "organization", r"studied\s+at|graduated\s+from", r"studied\s+at|graduated\s+from", False),
    (
        "VOLUNTEERS_AT",
        "organization",
        r"volunteer\s+(?:at|for|with)|am\s+volunteering\s+(?:at|for|with)",
        r"volunteers\s+(?:at|for|with)",
        False,
    ),
    ("HAS_SPOUSE", "person", r"am\s+(?:happily\s+)?married\s+to", None, False),
    ("HAS_PARTNER", "person", r"am\s+(?:dating|engaged\s+to|seeing)", None, False),
    (
        "USES",
        "product",
        rf"use|am\s+using|(?:switched|migrated)\s+(?:over\s+)?(?:from\s+{NAME}\s+)?to",
        None,
        False,
    ),
)
_PATTERNS = tuple(
    (kind, target, _first_person(fp, we=we), _third_person(tp) if tp else None)
    for kind, target, fp, tp, we in _FACTS
)
# "Tom and Ana live in Oslo", "Tom, Ana and I moved to Berlin": people named together at
# the head of a sentence each get its fact. Only at the head: in "I visited Tom and Ana
# moved to Berlin", Tom is who was visited.
_HEAD = r"(?:^|[.;:!?]\s+)"
_NAMES_AND = rf"(?P<names>{NAME}(?:,\s+{NAME})*),?\s+and\s+"
_NAMES_BEFORE = re.compile(rf"{_HEAD}{_NAMES_AND}$")
_PLURAL = tuple(
    (kind, target, re.compile(rf"{_HEAD}{_NAMES_AND}(?P<last>{NAME}){_ADV}\s+(?:{fp})\s+{_NAMED}(?P<obj>{NAME})"))
    for kind, target, fp, _, _ in _FACTS
)
# Verbs too loose to state a job unless the object's own words say organisation: "I've been
# at Google for years" is a job, "I've been at the airport for hours" is not.
_ORG_ONLY = _first_person(r"have\s+been\s+(?:at|with)|am\s+(?:at|with)")
_POSSESSIVE_FACTS: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    (
        "WORKS_AT",
        "organization",
        re.compile(
            rf"{_MY}(?:new\s+|current\s+|first\s+)?(?:job|role|position|internship)\s+(?:is\s+)?(?:at|with)\s+"
            rf"{_NAMED}(?P<obj>{NAME})"
        ),
    ),
    ("LIVES_IN", "place", re.compile(rf"\b(?:[Mm]y|[Oo]ur)\s+home\s+is\s+in\s+(?P<obj>{NAME})")),
    ("LIVES_IN", "place", re.compile(rf"\b[Hh]ome\s+for\s+(?:me|us)\s+is\s+(?:in\s+)?(?P<obj>{NAME})")),
    ("LIVES_IN", "place", re.compile(rf"(?<![\w'])(?:I|[Ww]e)\s+call\s+(?P<obj>{NAME})\s+home\b")),
    (
        "HAS_SPOUSE",
        "person",
        re.compile(rf"(?P<obj>{NAME})\s+and\s+I\s+(?:have\s+been|are|got|just\s+got)\s+(?:happily\s+)?married\b"),
    ),
    (
        "HAS_PARTNER",
        "person",
        re.compile(rf"(?P<obj>{NAME})\s+and\s+I\s+(?:have\s+been|are|got|just\s+got)\s+(?:dating|engaged)\b"),
    ),
)
_PLACES_ONLY = frozenset({"LIVES_IN", "LIVED_IN", "FROM"})
# "I quit my job at Acme" ends the job the possessive would otherwise state
_ENDED = re.compile(r"\b(?:quit|quitting|left|leaving|leave|lost|losing|lose|hated|miss|missed)\s*$")

_ROLE_IS = re.compile(
    rf"{_MY}{_MODS}{_GONE}(?P<role>{SINGULAR})(?:'s\s+name\s+is|\s+is\s+(?:called|named)|\s+is)\s+"
    rf"(?P<obj>{NAME})"
)
# "My cats are called Biscuit and Mochi"; without "called" or "named" a plural says what they
# are like ("my kids are Americans"), not who they are.
_ROLES_ARE = re.compile(rf"{_MY}{_MODS}{_GONE}(?P<role>{PLURAL})\s+are\s+(?:called|named)\s+(?P<obj>{_NAME_LIST})")
_ROLE_APPOSITION = re.compile(rf"{_MY}{_MODS}{_GONE}(?P<role>{PLURAL}|{SINGULAR}),?\s+(?P<obj>{_NAME_LIST})")
_ROLE_TAIL = rf"(?:[Mm]y|[Oo]ur)\s+{_MODS}{_GONE}(?P<role>{PLURAL}|{SINGULAR})(?![\w'-])"
_IS_ROLE = re.compile(rf"(?P<obj>{_NAME_LIST})\s+(?:is|are)\s+{_ROLE_TAIL}")
# "Helen, my aunt, is visiting" but not "Hi Karen, my manager asked ..."
_COMMA_ROLE = re.compile(rf"(?P<obj>{_NAME_LIST}),\s+{_ROLE_TAIL}(?=\s*(?:[,.;:!)]|$))")
_PET_NAMED = re.compile(
    rf"(?<![\w'])(?:I|[Ww]e){_ADV}\s+(?:have|own|got|adopted|rescued|bought|have\s+got|have\s+adopted)\s+"
    rf"(?:a|an|one|two|three|four)\s+{_MODS}{_GONE}(?P<role>{SPECIES_PLURAL}|{SPECIES})"
    rf"(?:,\s*|\s+(?:called|named)\s+)(?P<obj>{_NAME_LIST})"
)
_ATTENDED = re.compile(
    rf"(?<![\w'])I{_ADV}\s+(?:went\s+to|attended|go\s+to|joined|took|am\s+taking|signed\s+up\s+for|"
    r"enrolled\s+in|took\s+(?:my|our|the)\s+[a-z]+\s+to)\s+"
    rf"(?:an?|the|my|our|this|that)\s+(?P<obj>(?:[\w'-]+\s+){{1,3}}?(?:{'|'.join(sorted(EVENT_HEADS))}))\b"
)
_LIST_SPLIT = re.compile(r",\s+(?:and\s+)?|\s+and\s+")


def clean_name(name: str) -> str:
    """The name up to the first month or day word, without opening filler or a possessive."""
    words = name.split()
    while len(words) > 1 and canonical_name(words[0]) in STARTERS:
        words.pop(0)
    kept = []
    for word in words:
        if canonical_name(word) in MONTHS_AND_DAYS:
            break
        kept.append(word)
    return re.sub(r"'s$", "", " ".join(kept))


_HEDGE = re.compile(r"\b(?:if|unless|whether|suppose|imagine|wish|wonder|should|would|could|might)\b")
# Someone else's words: "My boss said: I live in Berlin", "she told me I work at ...".
_REPORTED = re.compile(r"\b(?!I\b)\w+\s+(?:said|says|told|tells|wrote|writes|claimed|claims)\b")
_DENIED = re.compile(r"\b(?:not|isn't|wasn't)\s+true\b|\bfalse\s+that\b|\bno\s+longer\s+true\b")


# An opening single quote follows a space or the start, a closing one ends a word; an
# apostrophe inside a word ("boss's") is neither.
_OPEN_QUOTE = re.compile(r"(?:^|(?<=\s))'(?=[A-Za-z])")
_CLOSE_QUOTE = re.compile(r"(?<=[\w.,!?])'(?=\s|$|[,.!?;:])")


def hedged(text: str, start: int) -> bool:
    """The sentence does not state the fact as the speaker's own: a condition or a wish ("if I
    moved to ...", "I might move to ..."), or words not the speaker's own (`not_own_words`)."""
    before = text[:start]
    return _HEDGE.search(re.split(r"[,;:]", before)[-1].lower()) is not None or not_own_words(text, start)


def not_own_words(text: str, start: int) -> bool:
    """The words at `start` are quoted, someone else's reported words, or denied ("it's not
    true that I ...")."""
    before = text[:start]
    if before.count('"') % 2 == 1 or before.count("\u201c") > before.count("\u201d"):
        return True  # inside quotation marks
    opened = sum(1 for m in _OPEN_QUOTE.finditer(text) if m.start() < start)
    if opened > sum(1 for m in _CLOSE_QUOTE.finditer(text) if m.start() < start):
        return True  # inside single quotation marks
    return _REPORTED.search(before) is not None or _DENIED.search(before.lower()) is not None


def facts(text: str) -> Iterator[Fact]:
    """Every relationship the sentence states, its relative clauses read apart."""
    main, *clauses = clause_sentences(text)
    yield from _clause_facts(main, main=True)
    for clause in clauses:
        yield from _clause_facts(clause, main=False)
    for at, predicate in conjoined_sentences(main):
        if not hedged(main, at):  # "If I move to Rome and work at Acme ..."
            yield from _clause_facts(predicate, main=False)


def _clause_facts(text: str, *, main: bool) -> Iterator[Fact]:
    yield from _verb_facts(text, main=main)
    yield from _role_facts(text)
    for kind, target, pattern in _POSSESSIVE_FACTS:
        for match in pattern.finditer(text):
            obj = clean_name(match.group("obj"))
            if is_plausible(obj, acronym=True) and not _ENDED.search(text[: match.start()]):
                yield Fact(None, kind, obj, target)
    for match in _ORG_ONLY.finditer(text):
        obj = clean_name(match.group("obj"))
        if name_type(obj) == "organization" and not hedged(text, match.start()):
            yield Fact(None, "WORKS_AT", obj, "organization")
    for match in _ATTENDED.finditer(text):
        if not hedged(text, match.start()):
            yield Fact(None, "ATTENDED", match.group("obj"), "event")


# A name right after a preposition, or after a commaless relative clause's verb, is that
# phrase's object, not the sentence's subject: "my friend who works at Google lives in
# Paris" says nothing of where Google lives, nor "the company that hired Tom is based in
# Berlin" of Tom. (A clause read apart puts its subject before its verb on purpose: "I met
# Tom, who works at Acme" is read as "I met Tom works at Acme"; the check is for the main
# sentence only.)
_OBJECT_BEFORE = re.compile(r"(?:\b(?:at|for|in|into|to|by|with|from|of|on|near|about|than)"
                            r"|\b(?:that|who|whom|which)\s+[a-z]+)\s+$")


# Every pattern above holds its verbs between spaces: a sentence with none of them states
# none of these facts, and one search tells (most sentences are skipped at this cost).
_ANY_VERB = re.compile(rf"\s(?:{'|'.join(verbs for _, _, fp, tp, _ in _FACTS for verbs in (fp, tp) if verbs)})\s")


def _verb_facts(text: str, *, main: bool) -> Iterator[Fact]:
    if not _ANY_VERB.search(text):
        return
    for kind, target, first, third in _PATTERNS:
        for pattern in (first, third):
            for match in pattern.finditer(text) if pattern else ():
                fact = _verb_fact(kind, target, match, third_person=pattern is third)
                if fact and main and fact.subject is not None and _OBJECT_BEFORE.search(text, 0, match.start()):
                    continue
                if fact and not hedged(text, match.start()):
                    yield fact
                    if main and not fact.subject_role:  # "Tom and I live in Oslo": Tom too
                        yield from _named_with(fact, _NAMES_BEFORE.search(text, 0, match.start()))
    if main:
        for kind, target, pattern in _PLURAL:
            for match in pattern.finditer(text):
                obj, last = _stated_object(kind, match), clean_name(match.group("last"))
                if obj is not None and is_plausible(last) and not hedged(text, match.start("names")):
                    fact = Fact(last, kind, obj, target)
                    yield fact
                    yield from _named_with(fact, match)


def _named_with(fact: Fact, names: re.Match[str] | None) -> Iterator[Fact]:
    """The fact for each of the names said together with its subject."""
    for name in map(clean_name, _LIST_SPLIT.split(names.group("names")) if names else ()):
        if is_plausible(name):
            yield Fact(name, fact.type, fact.object, fact.object_type)


def _verb_fact(kind: str, target: str, match: re.Match[str], *, third_person: bool) -> Fact | None:
    obj = _stated_object(kind, match)
    named = third_person and match.group("subj") is not None
    role = _subject_role(match) if third_person and not named else ""
    subject = clean_name(match.group("subj")) if named else None
    if role and (apposed := _apposed_name(match)):
        named, role, subject = True, "", apposed  # "Sarah, my sister, works at Apple": Sarah does
    if obj is None or (named and not is_plausible(subject or "")):
        return None
    if third_person and not named and not role:
        return None  # "my company is based in ...", "my late husband lived in ...": no node to hold it
    return Fact(subject, kind, obj, target, subject_role=role)


def _stated_object(kind: str, match: re.Match[str]) -> str | None:
    """The object a verb pattern's match names, or None when it is not what the fact needs."""
    if match.group("obj").endswith("'s"):
        return None  # "I work at Alice's bakery" is not a job at Alice
    obj = clean_name(match.group("obj"))
    if not is_plausible(obj, acronym=True):
        return None
    if kind in _PLACES_ONLY and canonical_name(obj) in TECH:
        return None  # "moved to Postgres" is a migration, not a move
    if "joined" in match.group() and re.match(r"\s+(?:for|on)\b", match.string[match.end() :]):
        return None  # "joined Alice for lunch"
    return obj


# A sentence that opens with a place or time phrase: the name in it is not the one the
# next words set off ("In Paris, my sister ..."); "I work with Tom, my manager" is.
_PREPOSITION = r"(?i:in|at|from|on|near|to|for|by|with|after|before|since|during)\s+"
_PREPOSITION_WORD = re.compile(_PREPOSITION)
_OPENING_PHRASE = re.compile(rf"(?:^|[.;:!?]\s+){_PREPOSITION}$")


def _in_opening_phrase(text: str, name_start: int) -> bool:
    """True when the name at `name_start` is the object of a preposition that opens the
    sentence; the name's own match may have taken the preposition in ("In Paris")."""
    taken = _PREPOSITION_WORD.match(text, name_start)
    return _OPENING_PHRASE.search(text, 0, taken.end() if taken else name_start) is not None


_BEFORE_APPOSITION = re.compile(rf"(?<![\w'])(?P<name>{NAME}),\s+$")


def _apposed_name(match: re.Match[str]) -> str | None:
    """The name a role subject is set off beside ("Sarah, my sister, works ..."); None when
    the role is not between commas ("Tom, my sister works ..." speaks to Tom)."""
    if not match.string.startswith(",", match.end("role")):
        return None
    found = _BEFORE_APPOSITION.search(match.string, 0, match.start())
    if found is None or _in_opening_phrase(match.string, found.start("name")):
        return None  # "In Paris, my sister, a doctor, ...": Paris is where, not who
    name = clean_name(found.group("name"))
    return name if is_plausible(name) else None


def _subject_role(match: re.Match[str]) -> str:
    """The role word of an unnamed person ("my older sister" -> sister); "" for a pet or a
    former one ("my late husband"), whose facts the current one's node must not take."""
    if _GONE_WORDS & set(match.group("mods").split()):
        return ""
    _, kind, word = role_of(match.group("role"))
    return word if kind == "person" else ""


def _role_facts(text: str) -> Iterator[Fact]:
    for pattern in (_ROLE_IS, _ROLES_ARE, _ROLE_APPOSITION, _IS_ROLE, _COMMA_ROLE, _PET_NAMED):
        for match in pattern.finditer(text):
            if match.group("gone") or _GONE_WORDS & set(match.group("mods").split()):
                continue
            if pattern is _COMMA_ROLE and _in_opening_phrase(text, match.start("obj")):
                continue  # "In Paris, my sister ...": Paris is where, not who
            kind, target, role = role_of(match.group("role"))
            plural = match.group("role").lower() in PLURALS or pattern in (_IS_ROLE, _COMMA_ROLE)
            names = _LIST_SPLIT.split(match.group("obj")) if plural else [match.group("obj")]
            for name in map(clean_name, names):
                if is_plausible(name):
                    yield Fact(None, kind, name, target, role if kind == "HAS_PET" else "")


_USER_NAME = (
    re.compile(rf"\b(?:[Mm]y\s+name\s+is|[Nn]ame's)\s+(?P<obj>{NAME})"),
    re.compile(rf"(?<![\w'])I\s+am\s+(?P<obj>{NAME})(?=\s*(?:[,.!;)]|$|\s+and\b|\s+from\b|\s+here\b|\s+-))"),
    # "Hey, it's Marco" or "This is Marco here", not "This is Amazing!"
    re.compile(rf"^(?:[Hh]i|[Hh]ey|[Hh]ello)[,!]?\s+(?:it's|this\s+is)\s+(?P<obj>{NAME})(?=\s*(?:[,.!]|$|\s+here\b))"),
    re.compile(rf"^(?:[Ii]t's|[Tt]his\s+is)\s+(?P<obj>{NAME})\s+here\b"),
)
_USER_ALIAS = (re.compile(rf"\b[Cc]all\s+me\s+(?P<obj>{NAME})"),)


# "Don't call me Bob", "my name is not Bob": a name refused is no name.
_REFUSED = re.compile(r"(?:\b(?:don't|dont|do\s+not|never|not|stop)\s+)$", re.IGNORECASE)
# The one question that asks for a name: "Could you call me Ally?", not "Why did you call me Bob?"
_REQUEST = re.compile(r"\b(?:can|could|would|will)\s+you\s+(?:please\s+)?$", re.IGNORECASE)


def user_name(text: str) -> str | None:
    """The name the speaker gives for themselves ("my name is Alice"), if the sentence states one."""
    return _own_name(text, _USER_NAME)


def user_alias(text: str) -> str | None:
    """The name the speaker asks to be called by ("call me Ally"), if the sentence gives one."""
    return _own_name(text, _USER_ALIAS, asked=text.rstrip(" \"')").endswith("?"))


def _own_name(text: str, patterns: tuple[re.Pattern[str], ...], *, asked: bool = False) -> str | None:
    for pattern in patterns:
        for match in pattern.finditer(text):
            before = text[: match.start()]
            if _REFUSED.search(before) or re.match(r"\s*not\b", text[match.start("obj"):]):
                continue
            if not_own_words(text, match.start()) or (asked and not _REQUEST.search(before)):
                continue
            name = clean_name(match.group("obj"))
            if is_plausible(name) and canonical_name(name) not in TECH and name.istitle():
                return name
    return None
