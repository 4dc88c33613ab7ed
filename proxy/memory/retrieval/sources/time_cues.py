"""Time cues: a question that asks "when", or names a period, ranks messages by their dates.

"When did Alice move?" is answered by a message that dates what it says ("we moved last
week", "in May"), and "Did Bob travel in April 2022?" by a message written then. Either
cue raises a message's lexical score by a share, so it reorders messages that match the
question about as well, and never finds a message that does not match it at all.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Awaitable, Sequence
from datetime import datetime

from proxy.memory.retrieval.sources import Found
from proxy.memory.retrieval.trigger import TRIGGER_REASON
from proxy.models import StoredMessage

DATED_SHARE = 0.3  # score share for a message that dates what it says, when the question asks "when"
IN_PERIOD_SHARE = 0.3  # score share for a message written in the period the question names

_MONTHS = "|".join(month.lower() for month in calendar.month_name[1:])
_ASKS_WHEN = re.compile(r"\bwhen\b|\bhow long\b|\bwhat (?:year|month|day|date|time)\b", re.IGNORECASE)
_PERIOD = re.compile(rf"\b(?:({_MONTHS})\s+)?((?:19|20)\d\d)\b", re.IGNORECASE)
# Matched in lower case: twice as fast as ignoring case, and every candidate of a "when"
# question is read.
_DATES = re.compile(
    rf"\b(?:yesterday|today|tonight|tomorrow|ago|last|next|recently|lately|weekend|week|month|year"
    rf"|monday|tuesday|wednesday|thursday|friday|saturday|sunday|{_MONTHS}|(?:19|20)\d\d)\b")


def asks_when(question: str) -> bool:
    """True when the question asks for a time ("when", "how long", "what year")."""
    return bool(_ASKS_WHEN.search(question))


def periods(question: str) -> list[tuple[int, int | None]]:
    """The (year, month or None) periods the question names ("April 2022", "in 2023")."""
    return [(int(year), _month(month) if month else None) for month, year in _PERIOD.findall(question)]


def _month(name: str) -> int:
    return [month.lower() for month in calendar.month_name].index(name.lower())


def dated(text: str) -> bool:
    """True when the text dates what it says (a weekday, a month, "last week", "yesterday")."""
    return bool(_DATES.search(text.lower()))


def within(at: datetime, named: Sequence[tuple[int, int | None]]) -> bool:
    """True when `at` falls in one of the named periods."""
    return any(at.year == year and (month is None or at.month == month) for year, month in named)


async def ranked(question: str, work: Awaitable[list[Found[StoredMessage]]]) -> list[Found[StoredMessage]]:
    """The messages `work` finds, reordered by the question's time cues; as found when it has none.

    Messages found by an unseen identifier stay in front, as the search put them.
    """
    found = await work
    when, named = asks_when(question), periods(question)
    if not (when or named) or not found:
        return found
    scored = []
    for f in found:
        share = (DATED_SHARE if when and dated(f.item.content) else 0.0) + (
            IN_PERIOD_SHARE if named and within(f.item.created_at, named) else 0.0)
        scored.append(Found(f.item, f.score * (1 + share), f.reason, {**f.parts, "time_cue": share}) if share else f)
    return sorted(scored, key=lambda f: (f.reason != TRIGGER_REASON, -round(f.score, 9)))
