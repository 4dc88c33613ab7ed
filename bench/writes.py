"""What saving a turn costs SQLite: WAL pages and writer time per turn, and where the pages go.

A turn as the proxy saves it with a fast upstream: its start, its memory block and its
answer in one transaction (the writer's group commit), applied through the real
`SQLiteStore.apply`. Two stores are filled side by side, one with memproxy's ids
(`proxy.ids.new_id`: time first, UUIDv7's layout) and one with random uuid4 ids, the
reference; then rounds of turns alternate between them, the checkpoint held back, and the
WAL's growth says how many pages each turn wrote. Figures are medians over the rounds.

    python bench/writes.py [--history 20000] [--rounds 6] [--turns 300] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.ids import new_id  # noqa: E402
from proxy.models import Scope  # noqa: E402
from proxy.stores.sqlite import batch as sqlite_batch  # noqa: E402
from proxy.stores.base import FinishTurn, SaveBlock, StartTurn  # noqa: E402
from proxy.stores.sqlite.store import SQLiteStore  # noqa: E402
from harness.report import Column, json_option, print_json, table  # noqa: E402
from harness.rounds import alternating  # noqa: E402

USER = Scope("bench-user")
NEVER_S = 1e9  # the checkpoint thread's period while measuring: the WAL only grows
BATCH = 500
LOG = {"hits": [{"source": "cross-session", "id": "x" * 32, "reason": "rank", "score": {"bm25": 8.5, "rank": n},
                 "tokens": 28} for n in range(6)], "sources_ms": {"cross-session": 1.2}}
SCHEMES: dict[str, Callable[[], str]] = {"time-ordered": new_id, "random": lambda: uuid.uuid4().hex}


def turn_ops(make_id: Callable[[], str], n: int) -> list[Any]:
    key, conversation, at = make_id(), make_id(), datetime.now(UTC)
    return [
        StartTurn(USER, key, conversation, uuid.uuid4().hex, at, f"request {n}: which tools do I prefer for my projects?"),
        SaveBlock(USER, key, "Relevant long-term memory about this user:\n1. [cross-session] user: tools", 1, LOG, at),
        FinishTurn(USER, key, conversation, f"Here is a short answer about request {n}.", at,
                   answer_hash=uuid.uuid4().hex),
    ]


class Side:
    """One store and its id scheme."""

    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.path = path
        self.store = SQLiteStore(str(path), checkpoint_every_s=NEVER_S)
        self.made = 0
        self.ms: list[float] = []
        self.pages: list[float] = []
        self.trees: Counter[str] = Counter()

    async def save(self, turns: int) -> float:
        """Seconds to save `turns` turns, one transaction each, with this side's ids."""
        sqlite_batch.new_id = SCHEMES[self.name]  # message ids are made inside the batch
        started = time.perf_counter()
        for _ in range(turns):
            await self.store.apply(turn_ops(SCHEMES[self.name], self.made))
            self.made += 1
        return time.perf_counter() - started

    def empty_wal(self) -> None:
        with closing(sqlite3.connect(self.path)) as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def wal_pages(self) -> list[int]:
        """The page number of every frame in the WAL."""
        data = Path(f"{self.path}-wal").read_bytes()
        if len(data) < 32:
            return []
        size = int.from_bytes(data[8:12], "big")
        return [int.from_bytes(data[at:at + 4], "big") for at in range(32, len(data) - size, 24 + size)]

    def owners(self) -> dict[int, str]:
        with closing(sqlite3.connect(self.path)) as db:
            return {page: name for name, page in db.execute("SELECT name, pageno FROM dbstat")}


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Side]:
    sides = {name: Side(name, workdir / f"{name}.db") for name in SCHEMES}
    for side in sides.values():
        await side.store.open()
        print(f"{side.name}: saving a history of {args.history} turns ...", file=sys.stderr)
        for done in range(0, args.history, BATCH):
            await side.save(min(BATCH, args.history - done))
            side.empty_wal()
    for r in range(args.rounds):
        for side in alternating(list(sides.values()), r):
            side.empty_wal()
            seconds = await side.save(args.turns)
            pages = side.wal_pages()
            side.ms.append(seconds * 1000 / args.turns)
            side.pages.append(len(pages) / args.turns)
            if r == args.rounds - 1:
                owners = side.owners()
                side.trees.update(owners.get(page, "?") for page in pages)
    for side in sides.values():
        await side.store.close()
    return sides


def report(args: argparse.Namespace, sides: dict[str, Side]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for name, side in sides.items():
        figures[name] = {
            "ms_per_turn": round(statistics.median(side.ms), 4),
            "wal_pages_per_turn": round(statistics.median(side.pages), 2),
            "pages_by_tree": {tree: round(n / args.turns, 2) for tree, n in side.trees.most_common(8)},
        }
    ours, reference = figures["time-ordered"], figures["random"]
    figures["ratio_ms"] = round(ours["ms_per_turn"] / reference["ms_per_turn"], 3)
    figures["ratio_pages"] = round(ours["wal_pages_per_turn"] / reference["wal_pages_per_turn"], 3)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=20_000, help="turns saved before measuring")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--turns", type=int, default=300, help="turns per side per round")
    json_option(parser)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="memproxy-writes-") as workdir:
        figures = report(args, asyncio.run(measure(args, Path(workdir))))
    print(f"one transaction per turn (start, block, answer), {args.history} turns of history, "
          f"{args.rounds} rounds of {args.turns} turns a side; medians")
    columns = (Column("ids", 13, align="<"), Column("ms per turn", 11, ".3f"), Column("WAL pages per turn", 19, ".2f"),
               Column("  pages by B-tree (last round)", 0, align="<"))
    print(table(columns, [(name, figures[name]["ms_per_turn"], figures[name]["wal_pages_per_turn"],
                           "  " + ", ".join(f"{tree} {n}" for tree, n in figures[name]["pages_by_tree"].items()))
                          for name in SCHEMES]))
    print(f"time-ordered / random: {figures['ratio_ms']}x the time, {figures['ratio_pages']}x the pages")
    if args.json:
        print_json(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
