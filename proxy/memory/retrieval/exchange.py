"""A message hit carries its exchange: the turn just before it and the turn just after it.

An answer often sits one turn from the words that found it: "did you go?" finds the
question, "yes, last Tuesday" answers it. So once the block's hits are chosen and fit the
budget, each message hit (best first) takes its neighbours in its conversation, whole,
while the block stays within `memory.max_tokens` and the line within its share of it. A
neighbour is never one the block already holds, nor one the request already shows, nor an
assistant's non-answer. The line reads in the order the turns were said: `user
(2026-11-02): question | assistant: answer`.

Before that, a hit said just before or after a better hit joins that hit's line (when the
line stays within its share) and gives its slot to the next hit: its turn is in the block
either way, and the slot finds a turn the block would not have held. The joined line then
carries the turns around all of its turns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from proxy.memory.retrieval.block import DATE_END, message_line, neutralise, render
from proxy.memory.retrieval.fusion import PER_HIT_SHARE
from proxy.memory.retrieval.sources.no_memory import non_answer
from proxy.models import Hit, StoredMessage

MESSAGE_SOURCES = frozenset({"conversation", "cross-session"})
SEPARATOR = " | "
EXCHANGE = "exchange"  # a Hit.parts key: the ids of the neighbours its line carries, in order

Neighbours = Mapping[str, tuple[StoredMessage | None, StoredMessage | None]]


def message_hits(hits: Sequence[Hit]) -> list[str]:
    """The ids of the hits that are messages, whose neighbours may be carried."""
    return [hit.id for hit in hits if hit.source in MESSAGE_SOURCES]


def join_adjacent(hits: Sequence[Hit], neighbours: Neighbours, limit: int, max_tokens: int) -> list[Hit]:
    """The first `limit` hits once each message hit said just before or after a better one is joined
    to that one's line, in the order said, when the line stays within its share of the budget: the
    turn is in the block either way, and its slot goes to the next hit."""
    per_hit = max_tokens * 4 // PER_HIT_SHARE
    kept: list[Hit] = []
    owner: dict[str, int] = {}  # a kept message hit's neighbour id -> the kept hit's index
    for hit in hits:
        at = owner.get(hit.id) if hit.source in MESSAGE_SOURCES else None
        if at is not None:
            better = kept[at]
            before, after = neighbours.get(better.id, (None, None))
            side, message = ("before", before) if before is not None and before.id == hit.id else ("after", after)
            longer = _joined(better.content, message, side) if message and DATE_END in better.content else ""
            if longer and len(neutralise(longer)) <= per_hit:
                ids = list(better.parts.get(EXCHANGE, ()))
                ids.insert(0 if side == "before" else len(ids), hit.id)
                kept[at] = replace(better, content=longer, parts={**better.parts, EXCHANGE: ids})
                continue
        if len(kept) == limit:
            break
        kept.append(hit)
        if hit.source in MESSAGE_SOURCES:
            for message in neighbours.get(hit.id, (None, None)):
                if message is not None:
                    owner.setdefault(message.id, len(kept) - 1)
    return kept


def unread(hits: Sequence[Hit], neighbours: Neighbours) -> list[str]:
    """The ids of the message hits, and of the turns joined to them, whose neighbours are not read yet."""
    ids = [i for hit in hits if hit.source in MESSAGE_SOURCES for i in (hit.id, *hit.parts.get(EXCHANGE, ()))]
    return [i for i in ids if i not in neighbours]


def carry(hits: Sequence[Hit], neighbours: Neighbours, max_tokens: int, header: str,
          shown: Callable[[str], bool]) -> list[Hit]:
    """The hits, each message hit with the neighbours that fit the budget added to its line."""
    limit = max_tokens * 4  # the budget's chars, as fusion.apply_budget counts them
    per_hit = limit // PER_HIT_SHARE
    used = len(render(hits, header))
    held = {hit.id for hit in hits} | {i for hit in hits for i in hit.parts.get(EXCHANGE, ())}
    said = {_words(hit.content.partition(DATE_END)[2]) for hit in hits if hit.source in MESSAGE_SOURCES}
    carried: list[Hit] = []
    for hit in hits:
        line, ids = hit.content, list[str](hit.parts.get(EXCHANGE, ()))
        before, after = _around(hit.id, set(ids), neighbours) if hit.source in MESSAGE_SOURCES else (None, None)
        for side, message in (("before", before), ("after", after)):
            if (message is None or message.id in held or _words(message.content) in said
                    or (message.role == "assistant" and non_answer(message.content))
                    or shown(message.content) or DATE_END not in line):
                continue
            longer = _joined(line, message, side)
            grows = len(neutralise(longer)) - len(neutralise(line))
            if used + grows > limit or len(neutralise(longer)) > per_hit:
                continue
            line, used = longer, used + grows
            ids.insert(0 if side == "before" else len(ids), message.id)
            held.add(message.id)
            said.add(_words(message.content))
        carried.append(replace(hit, content=line, parts={**hit.parts, EXCHANGE: ids}) if ids else hit)
    return carried


def _around(hit_id: str, joined: set[str], neighbours: Neighbours) -> tuple[StoredMessage | None, StoredMessage | None]:
    """The turn before the first and the turn after the last of a line's turns (the hit and those joined to it)."""
    first = last = hit_id
    while (message := neighbours.get(first, (None, None))[0]) is not None and message.id in joined:
        first = message.id
    while (message := neighbours.get(last, (None, None))[1]) is not None and message.id in joined:
        last = message.id
    return neighbours.get(first, (None, None))[0], neighbours.get(last, (None, None))[1]


def _joined(line: str, message: StoredMessage, side: str) -> str:
    """The line with the message said before or after it, in the order said, the date kept in front."""
    said = message_line(message.role, message.created_at, message.content)
    head, _, text = said.partition(DATE_END)
    role = head.rsplit(" (", 1)[0]
    if side == "after":
        return f"{line}{SEPARATOR}{role}: {text}"
    line_head, _, line_text = line.partition(DATE_END)
    line_role, _, line_date = line_head.rpartition(" (")
    return f"{role} ({line_date}{DATE_END}{text}{SEPARATOR}{line_role}: {line_text}"


def _words(text: str) -> str:
    """Text compared on its words: the same words said twice are one memory."""
    return " ".join(neutralise(text).casefold().split())
