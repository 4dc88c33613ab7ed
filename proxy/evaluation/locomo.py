"""LoCoMo (Maharana et al., ACL 2024) as the benchmark reads it: turns, sessions, questions.

Only `conversation` and `qa` are read; the LLM-written summaries and observations are not
memories. The data is CC BY-NC 4.0 and is never copied into the repository or the
package: it is read from the path the user gives.

Evidence ids are normalised for the dataset's known defects: several ids packed in one
string (`"D8:6; D9:17"`, `"D9:1 D4:4 D4:6"`), a stray colon (`"D:11:26"`), a zero-padded
turn (`"D30:05"`); an id that names no turn of its conversation (`"D"`, `"D10:19"`) is
dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
SCORED_CATEGORIES = (1, 2, 3, 4)  # category 5 (adversarial) is reported apart

_SESSION_KEY = re.compile(r"session_(\d+)")
_EVIDENCE = re.compile(r"D:?(\d+):(\d+)")
_DATE_FORMAT = "%I:%M %p on %d %B, %Y"  # "1:56 pm on 8 May, 2023"


class DataError(ValueError):
    """The benchmark file is not LoCoMo as this reader knows it."""


@dataclass(frozen=True)
class Turn:
    """One utterance: `dia_id` "D3:5" is session 3, turn 5."""

    dia_id: str
    session: int
    speaker: str
    text: str
    caption: str = ""  # a shared image's caption (blip_caption)


@dataclass(frozen=True)
class Session:
    """One sitting of the conversation, with the date it happened."""

    number: int
    at: datetime
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Question:
    """A QA item with its evidence turns (normalised; empty when none names a turn)."""

    text: str
    category: int
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class Sample:
    """One conversation between two people and the questions asked about it."""

    sample_id: str
    sessions: tuple[Session, ...]
    questions: tuple[Question, ...]

    @property
    def turns(self) -> int:
        return sum(len(s.turns) for s in self.sessions)


def load(path: str | Path) -> list[Sample]:
    """Every sample of a LoCoMo JSON file."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: {exc}") from exc
    if not isinstance(raw, list):
        raise DataError(f"{path}: expected a list of samples")
    return [sample(item) for item in raw]


def select(samples: list[Sample], ids: Sequence[str] | None) -> list[Sample]:
    """The samples named by `ids` (all when None), in file order; an unknown id is an error."""
    if not ids:
        return samples
    unknown = set(ids) - {s.sample_id for s in samples}
    if unknown:
        raise DataError(f"no sample {', '.join(sorted(unknown))} in the data")
    return [s for s in samples if s.sample_id in ids]


def sample(raw: Mapping[str, Any]) -> Sample:
    """One sample from its JSON object."""
    try:
        conversation = raw["conversation"]
        sessions = tuple(_sessions(conversation))
        known = {t.dia_id for s in sessions for t in s.turns}
        questions = tuple(
            Question(str(q["question"]), int(q["category"]), normalise_evidence(q.get("evidence") or [], known))
            for q in raw["qa"]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"sample {raw.get('sample_id', '?')}: {type(exc).__name__}: {exc}") from exc
    return Sample(str(raw["sample_id"]), sessions, questions)


def _sessions(conversation: Mapping[str, Any]) -> Iterable[Session]:
    numbers = sorted(int(m.group(1)) for key in conversation if (m := _SESSION_KEY.fullmatch(key)))
    for number in numbers:
        turns = conversation[f"session_{number}"]
        if not turns:
            continue
        at = session_date(conversation[f"session_{number}_date_time"])
        yield Session(number, at, tuple(_turn(t, number) for t in turns))


def _turn(raw: Mapping[str, Any], session: int) -> Turn:
    return Turn(str(raw["dia_id"]), session, str(raw["speaker"]), str(raw["text"]), str(raw.get("blip_caption") or ""))


def session_date(text: str) -> datetime:
    """A session's date ("1:56 pm on 8 May, 2023"), taken as UTC."""
    return datetime.strptime(" ".join(text.split()), _DATE_FORMAT).replace(tzinfo=UTC)


def normalise_evidence(raw: Iterable[str], known: set[str] | frozenset[str]) -> tuple[str, ...]:
    """Evidence ids as `D<session>:<turn>`, each once, only those naming a turn in `known`."""
    found: dict[str, None] = {}
    for item in raw:
        for match in _EVIDENCE.finditer(str(item)):
            dia_id = f"D{int(match.group(1))}:{int(match.group(2))}"
            if dia_id in known:
                found.setdefault(dia_id, None)
    return tuple(found)


def turn_text(turn: Turn) -> str:
    """What the benchmark saves for a turn: `Name: text`, a shared photo's caption appended."""
    text = f"{turn.speaker}: {turn.text}"
    if turn.caption:
        text += f" [shares a photo: {turn.caption}]"
    return text


def session_of(dia_id: str) -> int:
    """The session number of a dia_id ("D3:5" -> 3)."""
    match = _EVIDENCE.fullmatch(dia_id)
    if match is None:
        raise ValueError(f"not a turn id: {dia_id!r}")
    return int(match.group(1))
