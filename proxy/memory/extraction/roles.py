"""Role nouns ("my manager", "our dog") and the relationship each one states."""

from __future__ import annotations

import re

PET_SPECIES = [
    *"""cat dog puppy kitten rabbit bunny hamster parrot bird fish turtle tortoise horse snake lizard
    ferret gecko budgie pony goldfish retriever labrador poodle terrier beagle bulldog husky corgi
    dachshund collie spaniel pug chihuahua tabby""".split(),
    "guinea pig",
    "german shepherd",
]

NOTE_END = "; "  # after the role noun rules extraction notes in front of a pet's description: "cat; ..."

# role noun -> (relationship, type of the named entity)
ROLES: dict[str, tuple[str, str]] = {
    **dict.fromkeys(["manager", "boss", "supervisor", "line manager", "team lead"], ("HAS_MANAGER", "person")),
    **dict.fromkeys(["wife", "husband", "spouse"], ("HAS_SPOUSE", "person")),
    **dict.fromkeys(
        ["partner", "girlfriend", "boyfriend", "fiance", "fiancee", "fiancé", "fiancée"], ("HAS_PARTNER", "person")
    ),
    "dentist": ("HAS_DENTIST", "person"),
    **dict.fromkeys(["doctor", "physician", "gp"], ("HAS_DOCTOR", "person")),
    **dict.fromkeys(["therapist", "counselor", "counsellor", "psychiatrist"], ("HAS_THERAPIST", "person")),
    "sister": ("HAS_SISTER", "person"),
    "brother": ("HAS_BROTHER", "person"),
    **dict.fromkeys(["mother", "mom", "mum"], ("HAS_MOTHER", "person")),
    **dict.fromkeys(["father", "dad"], ("HAS_FATHER", "person")),
    "son": ("HAS_SON", "person"),
    "daughter": ("HAS_DAUGHTER", "person"),
    **dict.fromkeys(["kid", "child", "baby"], ("HAS_CHILD", "person")),
    "cousin": ("HAS_COUSIN", "person"),
    "aunt": ("HAS_AUNT", "person"),
    "uncle": ("HAS_UNCLE", "person"),
    **dict.fromkeys(["grandmother", "grandma", "granny"], ("HAS_GRANDMOTHER", "person")),
    **dict.fromkeys(["grandfather", "grandpa"], ("HAS_GRANDFATHER", "person")),
    "niece": ("HAS_NIECE", "person"),
    "nephew": ("HAS_NEPHEW", "person"),
    **dict.fromkeys(["friend", "best friend", "buddy", "pal", "bestie"], ("HAS_FRIEND", "person")),
    **dict.fromkeys(["coworker", "co-worker", "colleague", "teammate"], ("HAS_COLLEAGUE", "person")),
    **dict.fromkeys(["roommate", "flatmate", "housemate"], ("HAS_ROOMMATE", "person")),
    **dict.fromkeys(["neighbor", "neighbour"], ("HAS_NEIGHBOR", "person")),
    "mentor": ("HAS_MENTOR", "person"),
    "coach": ("HAS_COACH", "person"),
    **dict.fromkeys(["landlord", "landlady"], ("HAS_LANDLORD", "person")),
    **dict.fromkeys(["lawyer", "attorney"], ("HAS_LAWYER", "person")),
    "accountant": ("HAS_ACCOUNTANT", "person"),
    **dict.fromkeys(["employer", "company"], ("WORKS_AT", "organization")),
    **dict.fromkeys(["school", "university", "college"], ("STUDIES_AT", "organization")),
    "hometown": ("FROM", "place"),
    **dict.fromkeys([*PET_SPECIES, "pet"], ("HAS_PET", "pet")),
}

_IRREGULAR_PLURALS = {
    "child": "children",
    "puppy": "puppies",
    "bunny": "bunnies",
    "fish": "fish",
    "goldfish": "goldfish",
    "pony": "ponies",
    "baby": "babies",
    "bestie": "besties",
}
PLURALS = {_IRREGULAR_PLURALS.get(role, role + "s"): role for role in ROLES}


def _alternation(words: list[str]) -> str:
    return "|".join(re.escape(word).replace(r"\ ", r"\s+") for word in sorted(words, key=len, reverse=True))


_SPECIES = _alternation(PET_SPECIES)
# `pet rabbit` names the species; a lone `pet` does not
SINGULAR = rf"pet\s+(?:{_SPECIES})|{_alternation(list(ROLES))}"
PLURAL = rf"pets|{_alternation(list(PLURALS))}"
SPECIES = _SPECIES
SPECIES_PLURAL = _alternation([plural for plural, role in PLURALS.items() if role in PET_SPECIES])


def named_kind(entity_type: str, description: str, relationship: str) -> str:
    """The kind the user named an entity by ("my cat Biscuit": cat) when the relationship does not
    already say it (HAS_PET says "pet", HAS_MANAGER "manager"); "" when there is none.

    It is the entity's type when that is a role noun (a model may type Biscuit `cat`), or else
    the note rules extraction writes in front of a pet's description ("cat; My cat Biscuit ...").
    """
    said = relationship.casefold().split("_")
    note, found, _ = description.partition(NOTE_END)
    for named in (entity_type, note if found else ""):
        kind = " ".join(named.casefold().split())
        if kind in ROLES and kind not in said:
            return kind
    return ""


def role_of(noun: str) -> tuple[str, str, str]:
    """(relationship, entity type, role word) for a matched role noun, singular or plural."""
    word = re.sub(r"\s+", " ", noun.lower())
    word = PLURALS.get(word, word)
    if word.startswith("pet "):
        word = word[4:]
    relationship, kind = ROLES.get(word, ("HAS_PET", "pet"))
    return relationship, kind, word
