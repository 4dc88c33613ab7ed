"""How far any choice of k message hits can get on LoCoMo under the per-conversation cap of cross-session hits.

Ingests each dev conversation exactly as `memproxy eval locomo` does (same writer, store,
extraction), ranks every question's messages with the store's own BM25 search (the
cross-session source's candidates, uncapped, 200 deep), then scores turn recall (categories
1-4) for several selections of that one ranking: the top k with no cap, the top k with at
most 3 per conversation (each LoCoMo session being a conversation), and other ways
of spending the slots under the cap. Entity and relationship hits are left out: this is
the ceiling of the message sources alone.

    python bench/locomo_cap.py --data locomo-dev.json [--json]     # the data: docs/evaluation.md
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.evaluation import locomo, runner
from proxy.evaluation.locomo import session_of
from proxy.evaluation.scoring import Summary
from proxy.settings import Settings
from proxy.stores.sqlite.store import SQLiteStore
from proxy.terms import query_terms
from harness.report import Column, json_option, print_json, table

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
DEPTH = 200
PER_GROUP = 3  # the per-conversation cap cross-session hits had before it was removed

Ranked = list[str]  # dia_ids, best first
Select = Callable[[Ranked], Sequence[str]]


async def rankings(data: Path) -> list[tuple[int, tuple[str, ...], Ranked]]:
    """(category, evidence, ranked turns) for every scored question of the dev split."""
    out = []
    with tempfile.TemporaryDirectory(prefix="memproxy-cap-") as tmp:
        for sample in locomo.load(data):
            store = SQLiteStore(str(Path(tmp) / f"{sample.sample_id}.db"))
            await store.open()
            try:
                memory = await runner.ingest(store, Settings(), sample, Summary(10))
                for question in sample.questions:
                    if question.category not in CATEGORIES or not question.evidence:
                        continue
                    rows = await store.search_messages(memory.scope, query_terms(question.text)[:64],
                                                       exclude_conversation_id="a fresh one", limit=DEPTH)
                    out.append((question.category, question.evidence, [memory.dia_ids[m.id] for m, _ in rows]))
            finally:
                await store.close()
    return out


def top(k: int, cap: int | None = None) -> Select:
    """The k best, at most `cap` from one session."""
    def select(ranked: Ranked) -> list[str]:
        taken: Counter[int] = Counter()
        chosen = []
        for dia_id in ranked:
            if cap is not None and taken[session_of(dia_id)] >= cap:
                continue
            taken[session_of(dia_id)] += 1
            chosen.append(dia_id)
            if len(chosen) == k:
                break
        return chosen
    return select


def by_session(k: int, cap: int = PER_GROUP) -> Select:
    """Whole sessions first: the best session's `cap` best, then the next session's."""
    def select(ranked: Ranked) -> list[str]:
        groups: dict[int, list[str]] = {}
        for dia_id in ranked:
            groups.setdefault(session_of(dia_id), []).append(dia_id)
        return [d for hits in groups.values() for d in hits[:cap]][:k]
    return select


def recall(questions: list[tuple[int, tuple[str, ...], Ranked]], select: Select) -> dict[str, float]:
    by: dict[str, list[float]] = defaultdict(list)
    for category, evidence, ranked in questions:
        wanted = set(evidence)
        by[CATEGORIES[category]].append(len(wanted & set(select(ranked))) / len(wanted))
    every = [r for values in by.values() for r in values]
    return {"overall": round(sum(every) / len(every), 4),
            **{name: round(sum(by[name]) / len(by[name]), 4) for name in CATEGORIES.values()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="the LoCoMo JSON file (docs/evaluation.md)")
    json_option(p)
    args = p.parse_args()
    questions = asyncio.run(rankings(args.data))
    variants = {
        "top 10, no cap": top(10),
        f"top 10, at most {PER_GROUP} per session (memproxy)": top(10, PER_GROUP),
        f"top 12, at most {PER_GROUP} per session": top(12, PER_GROUP),
        f"top 15, at most {PER_GROUP} per session": top(15, PER_GROUP),
        f"top 20, at most {PER_GROUP} per session": top(20, PER_GROUP),
        f"all {DEPTH}, at most {PER_GROUP} per session": top(DEPTH, PER_GROUP),
        f"10 by whole sessions, {PER_GROUP} each": by_session(10),
    }
    results = {name: recall(questions, select) for name, select in variants.items()}
    print(f"{len(questions)} questions; turn recall, categories 1-4\n")
    columns = [Column("selection", 45, align="<"), Column("overall", 8, ".4f"),
               *(Column(c, 12, ".4f") for c in CATEGORIES.values())]
    print(table(columns, [(name, r["overall"], *(r[c] for c in CATEGORIES.values())) for name, r in results.items()]))
    if args.json:
        print_json(results)


if __name__ == "__main__":
    main()
