"""How fast is this machine, against the one issue 4's figures were measured on?

Issue 4 quotes five reference timings (one user, 5 content words a query): rank-bm25
scoring 10,000 and 100,000 documents, SQLite FTS5's `bm25()` answering the same, and numpy
top-10 cosine over 384-dimension float32 vectors at 10,000 and 100,000. This repeats each
here on bench/retrieval.py's sentences and prints the ratio to the issue's figure: a ratio of
2 means this machine took twice as long. Absolute lines in the other benchmarks ("p50 <= 4
ms") were set on the issue's machine; read them beside this ratio.

These rows time Python and SQLite arithmetic, not what a proxy spends most of its time on
(thread hand-offs, socket reads, epoll waits). For that, `bench/overhead.py --targets
direct,reference` times a bare starlette + httpx pass-through: it added 0.40 ms p50 at c=1
on the quiet host where issue 4's memory-on line was met (2026-12-01), and 0.72 ms on a
host this script put at 0.71-0.78 (2026-12-02).

    python bench/host.py [--repeat 50] [--json]
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import sys
from collections.abc import Callable
from contextlib import closing

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the server pins it

import numpy as np
from rank_bm25 import BM25Okapi

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness.figures import repeat_ms  # noqa: E402
from harness.report import Column, json_option, print_json, table  # noqa: E402
from retrieval import PEOPLE, PLACES, TEMPLATES, TOPICS, VERBS, sentence  # noqa: E402

# (what, documents, the figure in ms)
REFERENCE = (
    ("rank-bm25 get_scores", 10_000, 6.0),
    ("rank-bm25 get_scores", 100_000, 89.0),
    ("FTS5 bm25 top 10", 10_000, 0.13),
    ("FTS5 bm25 top 10", 100_000, 0.41),
    ("numpy cosine top 10, 384 dims", 10_000, 0.3),
    ("numpy cosine top 10, 384 dims", 100_000, 8.0),
)
# The reference pass-through's added p50 at c=1 on the host where issue 4's memory-on line held.
QUIET_REFERENCE_MS = 0.40
COLUMNS = (Column("measurement", 32, align="<"), Column("documents", 10, ","), Column("here ms", 9, ".3f"),
           Column("issue ms", 9, ".2f"), Column("ratio", 6, ".2f"))
CONTENT_WORDS = [w.lower() for w in (*TOPICS, *VERBS, *PEOPLE, *PLACES)]


def median_ms(run: Callable[[], object], repeat: int) -> float:
    """The median of `repeat` timed calls, after one that warms caches and lazily built structures."""
    return statistics.median(repeat_ms(run, repeat))


def words(text: str) -> list[str]:
    return [w.strip(".,;?!").lower() for w in text.split()]


def rank_bm25_ms(docs: list[str], queries: list[list[str]], repeat: int) -> float:
    index = BM25Okapi([words(d) for d in docs])
    turn = iter(range(10**9))
    return median_ms(lambda: index.get_scores(queries[next(turn) % len(queries)]), repeat)


def fts5_ms(docs: list[str], queries: list[list[str]], repeat: int) -> float:
    with closing(sqlite3.connect(":memory:")) as db:
        db.execute("CREATE VIRTUAL TABLE docs USING fts5(body)")
        db.executemany("INSERT INTO docs (body) VALUES (?)", ((d,) for d in docs))
        turn = iter(range(10**9))

        def search() -> object:
            query = " OR ".join(f'"{w}"' for w in queries[next(turn) % len(queries)])
            return db.execute("SELECT rowid FROM docs WHERE docs MATCH ? ORDER BY bm25(docs) LIMIT 10",
                              (query,)).fetchall()

        return median_ms(search, repeat)


def cosine_ms(count: int, repeat: int, rng: np.random.Generator) -> float:
    matrix = rng.standard_normal((count, 384), dtype=np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    query = matrix[0].copy()

    def top10() -> object:
        scores = matrix @ query
        best = np.argpartition(scores, -10)[-10:]
        return best[np.argsort(scores[best])[::-1]]

    return median_ms(top10, repeat)


def measure(repeat: int, seed: int = 7) -> list[dict[str, object]]:
    rng = random.Random(seed)
    docs = [sentence(rng, TEMPLATES) for _ in range(max(n for _, n, _ in REFERENCE))]
    queries = [rng.sample(CONTENT_WORDS, 5) for _ in range(64)]
    vectors = np.random.default_rng(seed)
    rows = []
    for what, count, reference in REFERENCE:
        if what.startswith("rank-bm25"):
            ms = rank_bm25_ms(docs[:count], queries, max(5, repeat // (count // 10_000)))
        elif what.startswith("FTS5"):
            ms = fts5_ms(docs[:count], queries, repeat)
        else:
            ms = cosine_ms(count, repeat, vectors)
        rows.append({"what": what, "documents": count, "ms": round(ms, 3), "issue_ms": reference,
                     "ratio": round(ms / reference, 2)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=50, help="timed runs of each measurement (median)")
    json_option(parser, help="also print one JSON object as the last line")
    args = parser.parse_args()
    rows = measure(args.repeat)
    print(table(COLUMNS, [[row[key] for key in ("what", "documents", "ms", "issue_ms", "ratio")] for row in rows]))
    python = [r["ratio"] for r in rows if str(r["what"]).startswith("rank-bm25")]
    factor = statistics.geometric_mean(python)  # type: ignore[arg-type]
    print(f"\nthis machine runs Python {factor:.2f}x the time of the issue's (rank-bm25 rows, geometric mean)")
    print("for the proxy path, time the reference pass-through (bench/overhead.py --targets direct,reference):"
          f" it added {QUIET_REFERENCE_MS} ms p50 at c=1 on the quiet host of 2026-12-01")
    if args.json:
        print_json({"rows": rows, "python_factor": round(factor, 2)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
