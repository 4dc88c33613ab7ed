"""How much of a user's index a search scores, the same on every backend.

A search costs about the number of rows holding *any* query term, so a whole-history search
of a user with more than SMALL_INDEX_ROWS rows scores only the rows saying the query's
rarest terms (by the user's own counts), as many terms as fit in a budget of CANDIDATE_SHARE
of the user's rows (at most CANDIDATE_MAX_ROWS); when even the rarest term is said by more
rows than the budget, the newest budget's worth of them. A smaller index is searched whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# A whole-history search scores the rows saying its rarest terms, as many terms as this
# share of the user's rows holds...
CANDIDATE_SHARE = 0.03
# ...never fewer than this many rows...
CANDIDATE_MIN_ROWS = 200
# ...and never more: no search scores more than this many.
CANDIDATE_MAX_ROWS = 1000
# A user's index this small is searched whole: it costs what the budget above would allow.
SMALL_INDEX_ROWS = CANDIDATE_MAX_ROWS


def candidate_terms(terms: Sequence[str], counts: dict[str, int], rows: int) -> list[str] | None:
    """The terms a whole-history search keeps its candidates to, or None to score every match.

    `counts` are the user's rows saying each term, of the user's `rows`. The rarest terms are
    kept while the rows saying them fit the budget; the others still count toward each
    candidate's score. The rarest term that occurs is always kept, so a search never comes
    back empty for want of a term.
    """
    if rows <= SMALL_INDEX_ROWS:
        return None
    budget = candidate_budget(rows)
    present = sorted((t for t in terms if counts.get(t, 0) > 0), key=lambda t: (counts[t], t))
    kept: list[str] = []
    for term in present:
        budget -= counts[term]
        if budget < 0:
            break
        kept.append(term)
    return None if len(kept) == len(present) else kept or present[:1]


def candidate_budget(rows: int) -> int:
    """The most candidates a whole-history search of a user's `rows` rows scores."""
    return min(CANDIDATE_MAX_ROWS, max(CANDIDATE_MIN_ROWS, int(CANDIDATE_SHARE * rows)))


@dataclass(frozen=True)
class Plan:
    """Which rows a search scores: those saying one of `finding` (in the finding column), the
    newest `newest` of them when set; each scored over every one of `terms`."""

    terms: list[str]
    finding: list[str]
    newest: int | None

    @staticmethod
    def of(terms: list[str], counts: dict[str, int], rows: int, *, whole_history: bool) -> Plan:
        """A conversation search scores all its rows saying a term; a whole-history search keeps to its
        rarest terms within the budget (`counts`: the user's rows saying each term, of the user's `rows`)."""
        if not whole_history:
            return Plan(terms, terms, None)
        return Plan(terms, candidate_terms(terms, counts, rows) or terms,
                    candidate_budget(rows) if rows > SMALL_INDEX_ROWS else None)
