"""The rules extractor: exact output for the key patterns, and precision/recall on a corpus.

The corpus has three parts. `design` was written before the extractor; `held-out` and
`blind` were written later, each measured before any pattern was changed for it (held-out:
entities P 0.79 R 0.69, relationships P 1.00 R 0.41; blind: entities P 0.72 R 0.63,
relationships P 1.00 R 0.55). Rules were then generalised, never special-cased, so the
first-measurement figures are the honest estimate for unseen phrasing.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from proxy.memory.extraction import (
    SINGLE_VALUED,
    USER_NODE,
    ExtractedEntity,
    ExtractedRelation,
    Extraction,
    canonical_name,
    extract,
)
from proxy.memory.extraction.roles import NOTE_END, ROLES, named_kind
from proxy.memory.extraction.rules import describe, sentences
from proxy.memory.learning.extractors import RulesExtractor
from proxy.stores.export_records import OBJECT_DESCRIPTION_HEAD_CHARS

CORPUS = Path(__file__).parent / "data" / "extraction_corpus.jsonl"

# Just under what the extractor reaches on the whole corpus today, so a regression fails;
# raise them when it gets better.
FLOORS = {
    "entity precision": 0.95,
    "entity recall": 0.93,
    "relationship precision": 0.97,
    "relationship recall": 0.95,
}

Key = tuple[str, ...]


@dataclass(frozen=True)
class Row:
    """One corpus sentence with what a careful reader would extract from it."""

    text: str
    speaker: str | None
    entities: frozenset[Key]
    relationships: frozenset[Key]
    user_name: str | None
    user_alias: str | None
    set: str  # design: written with the rules; held-out, blind: written after, measured first


@dataclass
class Score:
    """True positives, false positives and false negatives, with the misses for the log."""

    tp: int = 0
    fp: int = 0
    fn: int = 0
    misses: list[str] = field(default_factory=list)

    def add(self, text: str, expected: frozenset[Key], got: frozenset[Key]) -> None:
        self.tp += len(expected & got)
        self.fp += len(got - expected)
        self.fn += len(expected - got)
        if expected != got:
            self.misses.append(f"{text!r}: missing {sorted(expected - got)} extra {sorted(got - expected)}")

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0

    def line(self, label: str) -> str:
        counts = f"(tp {self.tp}, fp {self.fp}, fn {self.fn})"
        return f"  {label:<28} precision {self.precision:.3f}  recall {self.recall:.3f}  {counts}"


def _entity_keys(pairs: list[tuple[str, str]]) -> frozenset[Key]:
    return frozenset((canonical_name(name), kind) for name, kind in pairs)


def _relation_keys(triples: list[tuple[str, str, str]]) -> frozenset[Key]:
    return frozenset((canonical_name(a), kind, canonical_name(b)) for a, kind, b in triples)


def _corpus() -> list[Row]:
    rows = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
    return [
        Row(
            text=row["text"],
            speaker=row.get("speaker"),
            entities=_entity_keys([(name, kind) for name, kind in row["entities"]]),
            relationships=_relation_keys([(a, kind, b) for a, kind, b in row["relationships"]]),
            user_name=row.get("user_name"),
            user_alias=row.get("user_alias"),
            set=row.get("set", "design"),
        )
        for row in rows
    ]


def _own_names(name: str | None, alias: str | None) -> frozenset[Key]:
    return frozenset(key for key in (("name", name), ("alias", alias)) if key[1])


def _score(rows: list[Row]) -> tuple[Score, Score, Score]:
    entities, relations, names = Score(), Score(), Score()
    for row in rows:
        got = extract(row.text, speaker=row.speaker)
        entities.add(row.text, row.entities, _entity_keys([(e.name, e.type) for e in got.entities]))
        relations.add(
            row.text, row.relationships, _relation_keys([(r.from_name, r.type, r.to_name) for r in got.relationships])
        )
        names.add(row.text, _own_names(row.user_name, row.user_alias), _own_names(got.user_name, got.user_alias))
    return entities, relations, names


def test_corpus_is_large_and_varied() -> None:
    rows = _corpus()
    assert len(rows) >= 90
    assert sum(1 for row in rows if not row.entities and not row.relationships) >= 10
    assert sum(1 for row in rows if row.speaker) >= 8


def test_corpus_precision_and_recall() -> None:
    rows = _corpus()
    entities, relations, names = _score(rows)
    print(f"\nrules extraction over {len(rows)} corpus sentences ({CORPUS.name}):")
    print(entities.line("entities"))
    print(relations.line("relationships"))
    print(names.line("user names"))
    for part in ("design", "held-out", "blind"):
        subset = [row for row in rows if row.set == part]
        part_entities, part_relations, _ = _score(subset)
        print(part_entities.line(f"{part} ({len(subset)}) entities"))
        print(part_relations.line(f"{part} ({len(subset)}) relationships"))
    for miss in entities.misses + relations.misses:
        print(f"  miss: {miss}")
    figures = {
        "entity precision": entities.precision,
        "entity recall": entities.recall,
        "relationship precision": relations.precision,
        "relationship recall": relations.recall,
    }
    for label, floor in FLOORS.items():
        assert figures[label] >= floor, f"{label} {figures[label]:.3f} < {floor}"
    assert names.precision == 1.0 and names.recall == 1.0, names.misses


def _relations(text: str, speaker: str | None = None) -> list[tuple[str, str, str]]:
    return [(r.from_name, r.type, r.to_name) for r in extract(text, speaker=speaker).relationships]


def _entities(text: str, speaker: str | None = None) -> list[tuple[str, str]]:
    return [(e.name, e.type) for e in extract(text, speaker=speaker).entities]


def test_work_fact_exact_output() -> None:
    assert extract("I now work for Northwind Traders.") == Extraction(
        entities=[ExtractedEntity("Northwind Traders", "organization", "I now work for Northwind Traders.", 0.8)],
        relationships=[ExtractedRelation(USER_NODE, "WORKS_AT", "Northwind Traders")],
        user_name=None,
    )


@pytest.mark.parametrize(
    ("text", "relation", "entity"),
    [
        ("I work at Acme Corp.", ("User", "WORKS_AT", "Acme Corp"), ("Acme Corp", "organization")),
        ("I joined Globex Labs last spring.", ("User", "WORKS_AT", "Globex Labs"), ("Globex Labs", "organization")),
        ("I'm employed at Initech.", ("User", "WORKS_AT", "Initech"), ("Initech", "organization")),
        ("I'm a senior engineer at Hooli.", ("User", "WORKS_AT", "Hooli"), ("Hooli", "organization")),
        (
            "I used to work at Umbrella Pharma.",
            ("User", "WORKED_AT", "Umbrella Pharma"),
            ("Umbrella Pharma", "organization"),
        ),
        ("I live in Lisbon.", ("User", "LIVES_IN", "Lisbon"), ("Lisbon", "place")),
        ("I moved to New York City.", ("User", "LIVES_IN", "New York City"), ("New York City", "place")),
        ("I'm based in Austin.", ("User", "LIVES_IN", "Austin"), ("Austin", "place")),
        ("I'm from Ohio.", ("User", "FROM", "Ohio"), ("Ohio", "place")),
        (
            "I study at the University of Toronto.",
            ("User", "STUDIES_AT", "University of Toronto"),
            ("University of Toronto", "organization"),
        ),
        ("Bob Smith works for Contoso Ltd.", ("Bob Smith", "WORKS_AT", "Contoso Ltd"), ("Contoso Ltd", "organization")),
    ],
)
def test_first_and_third_person_facts(text: str, relation: tuple[str, str, str], entity: tuple[str, str]) -> None:
    assert _relations(text) == [relation]
    assert entity in _entities(text)


@pytest.mark.parametrize(
    ("text", "relation", "name"),
    [
        ("My manager is Karen Lee.", "HAS_MANAGER", "Karen Lee"),
        ("My boss, Tom, approved it.", "HAS_MANAGER", "Tom"),
        ("Priya Patel is my manager.", "HAS_MANAGER", "Priya Patel"),
        ("My wife is Maria.", "HAS_SPOUSE", "Maria"),
        ("My husband Jake cooks.", "HAS_SPOUSE", "Jake"),
        ("I'm married to Chris.", "HAS_SPOUSE", "Chris"),
        ("My partner, Sam Rivera, is a nurse.", "HAS_PARTNER", "Sam Rivera"),
        ("My dentist is Dr. Patel.", "HAS_DENTIST", "Dr. Patel"),
        ("Dr. Nguyen is my doctor.", "HAS_DOCTOR", "Dr. Nguyen"),
        ("My sister Emma is twelve.", "HAS_SISTER", "Emma"),
        ("My brother's name is Luis.", "HAS_BROTHER", "Luis"),
        ("My best friend is Jordan.", "HAS_FRIEND", "Jordan"),
        ("Helen, my aunt, is visiting.", "HAS_AUNT", "Helen"),
    ],
)
def test_role_nouns(text: str, relation: str, name: str) -> None:
    assert _relations(text) == [(USER_NODE, relation, name)]
    assert (name, "person") in _entities(text)


@pytest.mark.parametrize(
    ("text", "name", "species"),
    [
        ("My cat is called Luna.", "Luna", "cat"),
        ("I have a dog named Biscuit.", "Biscuit", "dog"),
        ("Our dog Max hates the vacuum.", "Max", "dog"),
        ("My pet rabbit is named Clover.", "Clover", "rabbit"),
        ("Biscuit is my dog.", "Biscuit", "dog"),
    ],
)
def test_pets_carry_their_species(text: str, name: str, species: str) -> None:
    result = extract(text)
    assert _relations(text) == [(USER_NODE, "HAS_PET", name)]
    assert result.entities == [ExtractedEntity(name, "pet", f"{species}; {text}", 0.8)]


def test_plural_pets_called_by_name_are_each_a_pet() -> None:
    text = "My cats are called Biscuit and Mochi."
    assert _relations(text) == [(USER_NODE, "HAS_PET", "Biscuit"), (USER_NODE, "HAS_PET", "Mochi")]
    assert [(e.name, e.type, e.description) for e in extract(text).entities] == [
        ("Biscuit", "pet", f"cat; {text}"), ("Mochi", "pet", f"cat; {text}")]
    assert _relations("Our dogs are named Rex and Fido.") == [(USER_NODE, "HAS_PET", "Rex"),
                                                              (USER_NODE, "HAS_PET", "Fido")]
    assert _relations("My kids are Americans.") == []  # what they are, not who


@pytest.mark.parametrize(
    ("type_", "description", "relationship", "kind"),
    [
        ("pet", "cat; My cat Biscuit is sick.", "HAS_PET", "cat"),
        ("pet", "german shepherd; Our german shepherd Rex ...", "HAS_PET", "german shepherd"),
        ("cat", "The user's cat", "HAS_PET", "cat"),  # a model typed it by its kind
        ("pet", "pet; My pet Rex is old.", "HAS_PET", ""),  # HAS_PET says "pet"
        ("manager", "My manager is Dana.", "HAS_MANAGER", ""),
        ("person", "My wife Ana loves tea.", "HAS_SPOUSE", ""),
        ("organization", "Acme; the firm I work at", "WORKS_AT", ""),  # a description's own ";"
    ],
)
def test_the_kind_a_graph_line_names(type_: str, description: str, relationship: str, kind: str) -> None:
    assert named_kind(type_, description, relationship) == kind


def test_a_relationship_is_read_with_room_for_any_kind_noted_in_front_of_its_object() -> None:
    assert max(map(len, ROLES)) + len(NOTE_END) <= OBJECT_DESCRIPTION_HEAD_CHARS


def test_plural_roles_name_each_person() -> None:
    assert _relations("My friends Anna and Ben are coming over.") == [
        (USER_NODE, "HAS_FRIEND", "Anna"),
        (USER_NODE, "HAS_FRIEND", "Ben"),
    ]
    assert _relations("We have two cats, Salt and Pepper.") == [
        (USER_NODE, "HAS_PET", "Salt"),
        (USER_NODE, "HAS_PET", "Pepper"),
    ]


@pytest.mark.parametrize(
    ("text", "relation", "objects"),
    [
        ("I prefer tabs over spaces.", "PREFERS", ["tabs"]),
        ("I always use Neovim for editing.", "PREFERS", ["Neovim"]),
        ("I prefer to use Poetry for Python projects.", "PREFERS", ["Poetry"]),
        ("My favorite editor is VS Code.", "PREFERS", ["VS Code"]),
        ("I never use Windows.", "AVOIDS", ["Windows"]),
        ("I'm allergic to peanuts.", "AVOIDS", ["peanuts"]),
        ("Please never suggest MongoDB to me.", "AVOIDS", ["MongoDB"]),
        ("I like hiking and camping.", "LIKES", ["hiking", "camping"]),
        ("I love Thai food.", "LIKES", ["Thai food"]),
        ("I hate meetings before 10am.", "DISLIKES", ["meetings"]),
        ("I don't like cilantro.", "DISLIKES", ["cilantro"]),
        ("I can't stand Jira.", "DISLIKES", ["Jira"]),
        ("I love Python and use it at Stripe.", "LIKES", ["Python"]),  # once also LIKES "use"
        ("I hate Java and avoid it.", "DISLIKES", ["Java"]),
        ("I love hiking and camping in the woods.", "LIKES", ["hiking", "camping"]),
        ("I love helping the community and making it a better place.", "LIKES", ["helping the community"]),
        ("I love the smell and taste it adds to dishes.", "LIKES", ["smell", "taste"]),  # "it" opens a clause
    ],
)
def test_preferences(text: str, relation: str, objects: list[str]) -> None:
    result = extract(text)
    assert _relations(text) == [(USER_NODE, relation, name) for name in objects]
    preferences = [e for e in result.entities if e.type == "preference"]
    assert [(e.name, e.description) for e in preferences] == [(name, text) for name in objects]


@pytest.mark.parametrize(
    ("text", "identifier"),
    [
        ("The staging host is internal-hbr-2291.example.", "internal-hbr-2291.example"),
        ("Our API lives at https://api.example.com/v2.", "https://api.example.com/v2"),
        ("Logs are in /var/log/memproxy/app.log.", "/var/log/memproxy/app.log"),
        ("The config is at ~/.config/memproxy/config.yaml.", "~/.config/memproxy/config.yaml"),
        ("Check src/memory/graph.py first.", "src/memory/graph.py"),
        ("Set MEMPROXY_DB_PATH before starting.", "MEMPROXY_DB_PATH"),
        ("The ticket is PAY-4821.", "PAY-4821"),
        ("The bug is in commit 3f9c2ab.", "3f9c2ab"),
        ("Call the getUserProfile endpoint.", "getUserProfile"),
        ("The database server is 10.0.3.17.", "10.0.3.17"),
        ("Redis runs on cache-01.lan:6379 today.", "cache-01.lan:6379"),
        ("Email me at alice@example.com.", "alice@example.com"),
        # one of each kind the cases above leave out: each pattern only runs when the sentence
        # holds what it needs, and a wrong need would lose its kind
        ("Open C:\\Users\\ana\\notes.txt now.", "C:\\Users\\ana\\notes.txt"),
        ("Use the retry_budget setting.", "retry_budget"),
        ("Docs are under docs/api/v2 today.", "docs/api/v2"),
        ("Deploy api-v2-canary first.", "api-v2-canary"),
        ("The part number is XK4200Z.", "XK4200Z"),
    ],
)
def test_identifiers_keep_the_sentence_that_stated_them(text: str, identifier: str) -> None:
    found = [e for e in extract(text).entities if e.type == "identifier"]
    assert found == [ExtractedEntity(identifier, "identifier", text, 0.9)]


@pytest.mark.parametrize(
    ("text", "name", "alias"),
    [
        ("My name is Alice Chen.", "Alice Chen", None),
        ("Hi, I'm Raj and I work at Infosys.", "Raj", None),
        ("I'm Dana, I live in Oslo.", "Dana", None),
        ("Call me Alice.", None, "Alice"),  # a name to be called by; the store decides if it names the node
        ("Hey, it's Marco!", "Marco", None),
        ("I'm tired.", None, None),
        ("I'm Canadian.", None, None),
        ("I am OK.", None, None),
        ("This is Amazing!", None, None),
        ("My name is not important.", None, None),
        ("Don't call me Bob.", None, None),  # a name refused is no name
        ("Please don't call me Robert, call me Bob.", None, "Bob"),
        ("Never call me Bobby again.", None, None),
        ("My name is Alice. Call me Ally.", "Alice", "Ally"),
        ("I'm Alice, but call me Ally", "Alice", "Ally"),
        ("Actually, call me Al.", None, "Al"),
        ("Could you call me Ally from now on?", None, "Ally"),
        ("Why did you call me Bob?", None, None),
        ("My boss said 'call me Bob'.", None, None),  # someone else's words
        ("'Call me Bob,' he said.", None, None),
        ('"Call me Bob," my boss said.', None, None),
        ("It's not true that my name is Bob.", None, None),
    ],
)
def test_user_name_and_alias(text: str, name: str | None, alias: str | None) -> None:
    result = extract(text)
    assert (result.user_name, result.user_alias) == (name, alias)
    own = {canonical_name(n) for n in (name, alias) if n}
    assert not [e for e in result.entities if canonical_name(e.name) in own]


@pytest.mark.parametrize(
    ("text", "entities", "relations"),
    [
        (
            "My sister, who lives in Paris, works at Google.",
            [("the user's sister", "person"), ("Google", "organization"), ("Paris", "place")],
            [("the user's sister", "WORKS_AT", "Google"), ("the user's sister", "LIVES_IN", "Paris")],
        ),
        (
            "My friend Tom, who works at Acme, lives in Berlin.",
            [("Tom", "person"), ("Berlin", "place"), ("Acme", "organization")],
            [("Tom", "LIVES_IN", "Berlin"), (USER_NODE, "HAS_FRIEND", "Tom"), ("Tom", "WORKS_AT", "Acme")],
        ),
        (
            "Tom, who works at Acme, lives in Berlin.",
            [("Tom", "person"), ("Berlin", "place"), ("Acme", "organization")],
            [("Tom", "LIVES_IN", "Berlin"), ("Tom", "WORKS_AT", "Acme")],
        ),
        (
            "My manager, who is from Spain, is great.",
            [("the user's manager", "person"), ("Spain", "place")],
            [("the user's manager", "FROM", "Spain")],
        ),
        (
            "My sister, who lives in Paris, France, works at Google.",
            [("the user's sister", "person"), ("Google", "organization"), ("Paris", "place"), ("France", "place")],
            [("the user's sister", "WORKS_AT", "Google"), ("the user's sister", "LIVES_IN", "Paris")],
        ),
        (
            "I met Tom, who works at Acme.",
            [("Tom", "person"), ("Acme", "organization")],
            [("Tom", "WORKS_AT", "Acme")],
        ),
        (
            "Ask Tom, who is my manager, about the release.",
            [("Tom", "person")],
            [(USER_NODE, "HAS_MANAGER", "Tom")],
        ),
        (  # read whole, this once gave (Google)-[LIVES_IN]->(Rome)
            "Tom, whose sister works at Google, lives in Rome.",
            [("Tom", "person"), ("Rome", "place"), ("Google", "organization")],
            [("Tom", "LIVES_IN", "Rome")],
        ),
        (  # and this (Paris)-[WORKS_AT]->(Acme)
            "My manager Ana, whose team is in Paris, works at Acme.",
            [("Ana", "person"), ("Acme", "organization"), ("Paris", "place")],
            [("Ana", "WORKS_AT", "Acme"), (USER_NODE, "HAS_MANAGER", "Ana")],
        ),
        (
            "My brother Sam, whose wife is a doctor, lives in Lisbon.",
            [("Sam", "person"), ("Lisbon", "place")],
            [("Sam", "LIVES_IN", "Lisbon"), (USER_NODE, "HAS_BROTHER", "Sam")],
        ),
        (
            "My friend Lea, which is odd, lives in Oslo.",
            [("Lea", "person"), ("Oslo", "place")],
            [("Lea", "LIVES_IN", "Oslo"), (USER_NODE, "HAS_FRIEND", "Lea")],
        ),
    ],
)
def test_a_relative_clause_states_a_fact_about_its_own_subject(
    text: str, entities: list[tuple[str, str]], relations: list[tuple[str, str, str]]
) -> None:
    assert _entities(text) == entities
    assert _relations(text) == relations


@pytest.mark.parametrize(
    ("text", "relations"),
    [
        ("Tom and Ana live in Oslo.", [("Tom", "LIVES_IN", "Oslo"), ("Ana", "LIVES_IN", "Oslo")]),
        ("Tom, Ana and Jo work at Acme.", [("Tom", "WORKS_AT", "Acme"), ("Ana", "WORKS_AT", "Acme"),
                                          ("Jo", "WORKS_AT", "Acme")]),
        ("Tom and I live in Oslo.", [(USER_NODE, "LIVES_IN", "Oslo"), ("Tom", "LIVES_IN", "Oslo")]),
        ("Tom and Ana moved to Berlin last year.", [("Tom", "LIVES_IN", "Berlin"), ("Ana", "LIVES_IN", "Berlin")]),
        ("If Tom and Ana move to Rome, call me.", []),
        ("I visited Tom and Ana moved to Berlin.", [("Ana", "LIVES_IN", "Berlin")]),  # Tom was visited
        # The objects the singular rules refuse, refused here too.
        ("Tom and Ana moved to Postgres.", []),
        ("Tom and Ana joined Alice for lunch.", []),
        ("Tom and Ana work at Alice's bakery.", []),
    ],
)
def test_people_named_together_at_the_head_each_get_the_fact(
    text: str, relations: list[tuple[str, str, str]]
) -> None:
    assert sorted(_relations(text)) == sorted(relations)


@pytest.mark.parametrize(
    ("text", "relations"),
    [
        ("Tim is from Ireland and lives in Boston.", [("Tim", "FROM", "Ireland"), ("Tim", "LIVES_IN", "Boston")]),
        ("I was born in Sweden but grew up in Norway.", [(USER_NODE, "FROM", "Sweden"), (USER_NODE, "FROM", "Norway")]),
        ("I live in Rome and work at Acme.", [(USER_NODE, "LIVES_IN", "Rome"), (USER_NODE, "WORKS_AT", "Acme")]),
        ("My older sister lives in Rome and works at Acme.",
         [("the user's sister", "LIVES_IN", "Rome"), ("the user's sister", "WORKS_AT", "Acme")]),
        ("My friend Tom lives in Berlin and studies at TU Berlin.",
         [(USER_NODE, "HAS_FRIEND", "Tom"), ("Tom", "LIVES_IN", "Berlin"), ("Tom", "STUDIES_AT", "TU Berlin")]),
        ("Tom's wife works at Acme and lives in Rome.", []),  # the wife's, not Tom's
        ("Tom lives in Rome and Ana works at Acme.", [("Tom", "LIVES_IN", "Rome"), ("Ana", "WORKS_AT", "Acme")]),
        # What reaches over the first predicate reaches over the second.
        ("I don't live in Rome and work at Acme.", []),
        ("I used to live in Rome and work at Acme.", [(USER_NODE, "LIVED_IN", "Rome")]),
        ("I want to move to Rome and work at Acme.", []),
        ("If I move to Rome and work at Acme I'll be happy.", []),
        ("My boss said Tom lives in Rome and works at Acme.", []),
    ],
)
def test_a_predicate_after_and_without_its_own_subject_takes_the_sentences(
    text: str, relations: list[tuple[str, str, str]]
) -> None:
    assert sorted(_relations(text)) == sorted(relations)


@pytest.mark.parametrize(
    ("text", "relations"),
    [
        # Set off between commas, the name and the role are one person: once the fact went
        # to an unnamed "the user's sister" node beside Sarah's.
        ("Sarah, my sister, works at Apple.", [(USER_NODE, "HAS_SISTER", "Sarah"), ("Sarah", "WORKS_AT", "Apple")]),
        ("Sarah, my manager, lives in Kyiv.", [(USER_NODE, "HAS_MANAGER", "Sarah"), ("Sarah", "LIVES_IN", "Kyiv")]),
        # Without the second comma the name is spoken to, not described.
        ("Tom, my sister works at Apple.", [("the user's sister", "WORKS_AT", "Apple")]),
        # A sentence's opening place phrase is no name: once (User)-[HAS_SISTER]->(Paris).
        ("In Paris, my sister, a doctor, works at Acme.", []),
        ("After Rome, my friend, moved to Oslo.", [("the user's friend", "LIVES_IN", "Oslo")]),
        ("I work with Tom, my manager.", [(USER_NODE, "HAS_MANAGER", "Tom")]),
    ],
)
def test_a_role_set_off_beside_a_name_is_that_person(text: str, relations: list[tuple[str, str, str]]) -> None:
    assert sorted(_relations(text)) == sorted(relations)


@pytest.mark.parametrize(
    ("text", "relations"),
    [
        ("My friend who works at Google lives in Paris.", []),  # once (Google)-[LIVES_IN]->(Paris)
        ("The company that hired Tom is based in Berlin.", []),  # once (Tom)-[LIVES_IN]->(Berlin)
        ("A friend of Ana lives in Rome.", []),
        ("I heard that Tom lives in Paris.", [("Tom", "LIVES_IN", "Paris")]),
        ("Tom lives in Rome and Ana works at Acme.", [("Ana", "WORKS_AT", "Acme"), ("Tom", "LIVES_IN", "Rome")]),
        ("I work with Tom, who lives in Rome.", [("Tom", "LIVES_IN", "Rome")]),  # the clause read apart
    ],
)
def test_a_name_that_is_a_phrases_object_is_not_a_subject(text: str, relations: list[tuple[str, str, str]]) -> None:
    assert sorted(_relations(text)) == sorted(relations)


@pytest.mark.parametrize(
    ("text", "speaker", "relations"),
    [
        ("My sister works at Microsoft.", None, [("the user's sister", "WORKS_AT", "Microsoft")]),
        ("My older brother lives in Rome.", None, [("the user's brother", "LIVES_IN", "Rome")]),
        ("My mom is from Lagos.", "Caroline", [("Caroline's mom", "FROM", "Lagos")]),
        ("My late husband lived in Paris.", None, []),  # the current husband's node must not take it
        ("My company is based in Berlin.", None, []),  # a company is not a person
        ("My sister Emma lives in Paris.", None, [(USER_NODE, "HAS_SISTER", "Emma"), ("Emma", "LIVES_IN", "Paris")]),
        ("My boss said my sister works at Google.", None, []),
    ],
)
def test_a_person_named_only_by_role_is_a_node_of_the_speaker(
    text: str, speaker: str | None, relations: list[tuple[str, str, str]]
) -> None:
    assert sorted(_relations(text, speaker)) == sorted(relations)
    subjects = {a for a, _, _ in relations if a != USER_NODE}
    assert subjects <= {name for name, kind in _entities(text, speaker) if kind == "person"}


def test_speaker_lines_attribute_first_person_facts_to_the_speaker() -> None:
    text = "Caroline: I went to a LGBTQ support group yesterday."
    description = "Caroline: I went to a LGBTQ support group yesterday."
    assert extract(text, speaker="Caroline") == Extraction(
        entities=[
            ExtractedEntity("Caroline", "person", description, 0.8),
            ExtractedEntity("LGBTQ support group", "event", description, 0.8),
        ],
        relationships=[ExtractedRelation("Caroline", "ATTENDED", "LGBTQ support group")],
        user_name=None,
    )
    assert _relations("My husband Dave is great.", speaker="Melanie") == [("Melanie", "HAS_SPOUSE", "Dave")]
    assert _relations("Audrey: I'm from Seattle.", speaker="Audrey") == [("Audrey", "FROM", "Seattle")]


def test_speaker_without_facts_is_not_a_node() -> None:
    assert extract("John: Thanks! How was your weekend?", speaker="John") == Extraction()


NOTHING = [
    "The weather is nice today.",
    "Yesterday was a long day.",
    "Thanks, that works!",
    "Can you explain how recursion works?",
    "On Monday we have standup.",
    "In March I went hiking.",
    "I'm tired.",
    "My manager is on vacation.",
    "I work at a small startup.",
    "I like that idea.",
    "I like how you explained it.",
    "I'd like a summary of this thread.",
    "I love my dog.",
    "THE SERVER IS DOWN AGAIN.",
    "What is the difference between TCP and UDP?",
    "My father was a teacher.",
    "",
    "   ",
]


@pytest.mark.parametrize("text", [
    'My boss said "I live in Berlin".',  # someone else's words, quoted
    '"I work at Google," she said.',
    "He said: I live in Tokyo.",  # reported
    "My sister told me I work too much at Acme.",
    "It's not true that I work at Google.",  # denied
    "'I work at Google,' she said.",  # single quotation marks
])
def test_words_that_are_not_the_speakers_own_state_no_fact_about_them(text: str) -> None:
    assert not [r for r in extract(text).relationships if r.from_name == "User"]


def test_the_speakers_own_report_still_counts() -> None:
    assert [(r.from_name, r.type, r.to_name) for r in extract("I said I live in Porto.").relationships] == [
        ("User", "LIVES_IN", "Porto")]
    # apostrophes are no quotation marks
    assert _relations("In the '90s I lived in Rome.") == [("User", "LIVED_IN", "Rome")]
    assert _relations("James' car is red and I live in Porto.") == [("User", "LIVES_IN", "Porto")]


@pytest.mark.parametrize("text", NOTHING)
def test_nothing_to_extract(text: str) -> None:
    assert extract(text) == Extraction()


@pytest.mark.parametrize(
    "text",
    [
        "Should I move to Amsterdam?",
        "If I moved to Canada, would I need a visa?",
        "Do I work at Acme?",
        "I don't work at Initech anymore.",
        "I no longer live in Paris.",
        "I never worked at Google.",
        "My friend said I should move to Berlin.",
        "I work at Alice's bakery.",
        "I'm from Acme's support team.",
        "I use Alice's laptop sometimes.",
        "I quit my job at Acme.",
        "Tom is my friend's husband.",
        "Hi Karen, my manager asked about the release.",
        "My ex-wife Laura lives nearby.",
        "My late husband Frank loved jazz.",
        "I moved to Postgres last year.",
        "I joined Alice for lunch.",
    ],
)
def test_questions_hedges_negations_and_possessives_state_no_fact(text: str) -> None:
    assert _relations(text) == []


def test_names_are_cleaned_and_typed() -> None:
    assert _entities("The Eiffel Tower was crowded.") == [("Eiffel Tower", "place")]
    assert _entities("Honestly, Jordan Peterson's book was boring.") == [("Jordan Peterson", "person")]
    assert _entities("Visiting New York City next month with Dana.") == [
        ("New York City", "place"),
        ("Dana", "person"),
    ]
    assert _entities("We deploy everything with Terraform and Ansible.") == [
        ("Terraform", "product"),
        ("Ansible", "product"),
    ]
    assert _entities("I'm based in Austin, Texas.") == [("Austin", "place"), ("Texas", "place")]
    assert _entities("Alice and I met at Blue Bottle Coffee.") == [
        ("Alice", "person"),
        ("Blue Bottle Coffee", "place"),
    ]


def test_several_sentences_merge_by_canonical_name() -> None:
    result = extract("My dentist is Dr. Patel. I work at Acme Corp. Acme Corp's office is in Boston.")
    assert [(r.from_name, r.type, r.to_name) for r in result.relationships] == [
        (USER_NODE, "HAS_DENTIST", "Dr. Patel"),
        (USER_NODE, "WORKS_AT", "Acme Corp"),
    ]
    assert [(e.name, e.type, e.description) for e in result.entities] == [
        ("Dr. Patel", "person", "My dentist is Dr. Patel."),
        ("Acme Corp", "organization", "I work at Acme Corp."),
        ("Boston", "place", "Acme Corp's office is in Boston."),
    ]


def test_redaction_markers_are_not_identifiers() -> None:
    text = "My key is [REDACTED:openai_key] and the host is db-1.internal."
    assert extract(text).entities == [ExtractedEntity("db-1.internal", "identifier", text, 0.9)]


def test_sentences_do_not_break_after_titles() -> None:
    assert sentences("Dr. Patel is great. I saw Mr. Smith today!\nNew line, e.g. this") == [
        "Dr. Patel is great.",
        "I saw Mr. Smith today!",
        "New line, e.g. this",
    ]


def test_descriptions_are_trimmed_and_single_line() -> None:
    long = "I work at Acme Corp, " + "and it is a place with many long corridors " * 6 + "end."
    description = describe(long)
    assert len(description) <= 160 and description.endswith("…") and description.startswith("I work at Acme Corp,")
    assert describe("a\n b\tc", "Ann") == "Ann: a b c"
    assert extract(long).entities[0].description == description


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("Alice Chen", "alice chen"),
        ("  ALICE   chen ", "alice chen"),
        ("Alice's", "alice"),
        ("Alice\u2019s", "alice"),
        ("Acme Inc.", "acme inc"),
        ("St. Mary's Hospital", "st. mary's hospital"),
        ("", ""),
    ],
)
def test_canonical_name(name: str, canonical: str) -> None:
    assert canonical_name(name) == canonical


def test_single_valued_types() -> None:
    assert {"WORKS_AT", "LIVES_IN", "HAS_SPOUSE", "HAS_MANAGER", "HAS_PARTNER", "FROM"} <= SINGLE_VALUED
    assert not {"HAS_FRIEND", "HAS_PET", "LIKES", "PREFERS", "WORKED_AT"} & SINGLE_VALUED


def test_extraction_package_is_pure() -> None:
    proxy = Path(__file__).parent.parent / "proxy"
    sources = [path.read_text() for path in [*(proxy / "memory" / "extraction").glob("*.py"),
                                            *(proxy / "redaction").glob("*.py")]]
    for banned in ("import starlette", "import httpx", "import asyncio", "async def", "await ", "open("):
        assert not any(banned in source for source in sources), banned


@pytest.mark.parametrize(
    "text",
    [
        "I work at " + "Acme " * 3000 + "now",
        "My friends " + " and ".join(["Anna"] * 2000) + " came",
        ", ".join(["Anna Bell"] * 2000) + " is my sister",
        "Ab" * 30000,
        "ab" * 30000,
        "a." * 20000,
        "http" * 20000,
        "Dr. " * 20000,
        "I prefer " + "tabs and " * 5000,
        "Tom, who " * 3000 + "lives in Rome",
        "My sister, who lives in Paris" + ", France" * 3000 + ", works at Acme",
        "my sister " * 5000 + "works at Acme",
        # A relative-clause opener before a long run of spaces: 0.15 s a 600-character line for
        # the first clause pattern (it backtracked over every split of the run).
        "\n".join(["Tom, who" + " " * 585 + "x;"] * 70),
    ],
)
def test_pathological_input_stays_linear(text: str) -> None:
    # A generous bound: linear input takes well under a second; a quadratic pattern minutes.
    start = time.perf_counter()
    extract(text)
    assert time.perf_counter() - start < 10.0


def test_a_short_message_is_mined_at_once_unless_an_extraction_is_in_flight() -> None:
    async def body() -> None:
        rules = RulesExtractor()
        said = "I live in Porto."
        assert rules.now(said, None) == extract(said)  # on the loop: a thread's hop costs as much CPU
        assert rules.now("I live in Porto. " * 20, None) is None  # longer: in a thread
        in_flight = asyncio.ensure_future(rules("My manager is Dana. " * 100, None))
        await asyncio.sleep(0)  # another message's rules run in their thread: its facts come first
        assert rules.now(said, None) is None
        await in_flight
        assert rules.now(said, None) == extract(said)

    asyncio.run(body())


def test_a_short_message_asked_later_never_overtakes_one_waiting_for_the_extraction_in_flight() -> None:
    # A released lock reads unlocked before the call it wakes has run: a message asked in that
    # pass must still wait its turn, or its facts land first ("My name is Beth." then Ann's).
    async def body() -> None:
        rules = RulesExtractor()
        order: list[str] = []

        async def mine(name: str, text: str) -> None:  # as InlineFacts mines a message
            if rules.now(text, None) is None:
                await rules(text, None)
            order.append(name)

        await rules._one.acquire()  # another message's extraction is in flight
        first = asyncio.ensure_future(mine("first", "My name is Ann."))
        await asyncio.sleep(0)  # asked first: it waits for the one in flight
        second = asyncio.ensure_future(mine("second", "My name is Beth."))  # a later message is asked...
        rules._one.release()  # ...in the pass in which that extraction ends
        await asyncio.gather(first, second)
        assert order == ["first", "second"]

    asyncio.run(body())
