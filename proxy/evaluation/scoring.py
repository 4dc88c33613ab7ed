"""Scoring a retrieval benchmark: pure functions over what each question's hits cover.

A hit covers the turns whose text the block carries (a message hit its own turn and the
turns its line carries around it; an entity or relationship hit only the message it was
most recently extracted from), so a name mentioned everywhere cannot cover everything.
Turn recall is the fraction of a question's evidence turns covered; session recall the
fraction of its evidence sessions that any hit comes from.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.evaluation.locomo import CATEGORIES, SCORED_CATEGORIES, session_of


@dataclass(frozen=True)
class Answer:
    """What retrieval returned for one question: the turns its block covers (None: a hit covering no turn)."""

    category: int
    evidence: tuple[str, ...]
    covered: tuple[str | None, ...]
    ms: float = 0.0
    sources: tuple[str, ...] = ()  # the source of each hit, in block order


def turn_recall(evidence: Sequence[str], covered: Iterable[str | None]) -> float:
    """The fraction of the evidence turns some hit covers."""
    wanted = set(evidence)
    if not wanted:
        raise ValueError("a question without evidence is not scored")
    return len(wanted.intersection(covered)) / len(wanted)


def session_recall(evidence: Sequence[str], covered: Iterable[str | None]) -> float:
    """The fraction of the evidence sessions that some hit comes from."""
    wanted = {session_of(dia_id) for dia_id in evidence}
    if not wanted:
        raise ValueError("a question without evidence is not scored")
    found = {session_of(dia_id) for dia_id in covered if dia_id is not None}
    return len(wanted & found) / len(wanted)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear between closest ranks; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _recalls(answers: Sequence[Answer], measure: Callable[[Sequence[str], Iterable[str | None]], float]) -> list[float]:
    return [measure(a.evidence, a.covered) for a in answers]


@dataclass
class Summary:
    """The benchmark's figures over every answered question."""

    k: int
    answers: list[Answer] = field(default_factory=list)
    ingest_s: float = 0.0
    extract_s: float = 0.0
    turns: int = 0
    conversations: int = 0

    def scored(self, categories: Iterable[int] = SCORED_CATEGORIES) -> list[Answer]:
        """Answers of these categories whose question has evidence."""
        wanted = set(categories)
        return [a for a in self.answers if a.category in wanted and a.evidence]

    def _category(self, category: int) -> float | None:
        """Turn recall of one category; None when it has no scored question."""
        answers = self.scored([category])
        return round(_mean(_recalls(answers, turn_recall)), 4) if answers else None

    def as_dict(self) -> dict[str, Any]:
        """The figures as the --json object reports them."""
        scored = self.scored()
        adversarial = self.scored([5])
        latencies = [a.ms for a in self.answers]
        slots = Counter(source for a in scored for source in a.sources)
        return {
            "k": self.k,
            "turn_recall": round(_mean(_recalls(scored, turn_recall)), 4),
            "by_category": {CATEGORIES[c]: self._category(c) for c in SCORED_CATEGORIES},
            "category_questions": {CATEGORIES[c]: len(self.scored([c])) for c in SCORED_CATEGORIES},
            "session_recall": round(_mean(_recalls(scored, session_recall)), 4),
            "adversarial": {
                "turn_recall": round(_mean(_recalls(adversarial, turn_recall)), 4),
                "session_recall": round(_mean(_recalls(adversarial, session_recall)), 4),
                "questions": len(adversarial),
            },
            "questions": len(scored),
            "skipped": sum(1 for a in self.answers if not a.evidence),
            "slots": {source: round(n / len(scored), 3) for source, n in sorted(slots.items())} if scored else {},
            "p50_ms": round(percentile(latencies, 50), 3),
            "p95_ms": round(percentile(latencies, 95), 3),
            "ingest_s": round(self.ingest_s, 3),
            "extract_s": round(self.extract_s, 3),
            "turns": self.turns,
            "conversations": self.conversations,
        }
