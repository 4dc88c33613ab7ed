"""Paired A/B: this checkout against another, side by side, in alternating bursts.

On a shared two-core machine the absolute figures of `overhead.py` drift by about
±0.5 ms between runs a few minutes apart, which hides the 0.1-0.5 ms a change to the
memory path makes. Here both versions run at once, each with its own copy of the same
seeded store behind one mock, and a single-connection closed loop alternates between
them burst by burst (A then B, B then A, ...), the same number of requests each. Both sides live through the same noise,
so the median of the per-round differences shows what the change did.

    python bench/ab.py --base /path/to/other/checkout            # memory on, then on-ro
    python bench/ab.py --base ../old --mode on --rounds 30 --burst 100 --upstream-ms 50

A is this checkout, B the one at --base (for example a `git worktree` of the commit
before the change). A negative difference means A is faster.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from harness.figures import Paired
from harness.loadgen import ClosedLoop, Target, chat_payload, numbered, run_client
from harness.memory import MEMORY_USER, seed_memories
from harness.rounds import alternating, burst
from harness.targets import REPO, Server, Targets, source_version

# Each side and mode numbers its requests in a range of its own: no request repeats an
# earlier one, which memproxy would take for a retry (as in overhead.py).
NUMBERS_PER_LOAD = 10**9
SIDES = ("A", "B")


@dataclass
class Side:
    """One version's figures over the rounds: per-round p50 and p99 (ms) and server CPU per request."""

    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the other memproxy checkout (B)")
    parser.add_argument("--memory-items", type=int, default=10_000, help="memories seeded into each store")
    parser.add_argument("--mode", default="on,ro", help="on (recall and save), ro (recall only), or both")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--burst", type=int, default=300, help="requests each side sends per round")
    parser.add_argument("--upstream-ms", type=float, default=0.0, help="the mock's time to answer")
    args = parser.parse_args(argv)
    args.modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    if not args.modes or set(args.modes) - {"on", "ro"}:
        parser.error("--mode: on, ro or on,ro")
    if not (args.base / "proxy").is_dir():
        parser.error(f"--base: {args.base} is not a memproxy checkout (no proxy/ there)")
    return args


def headers(mode: str) -> dict[str, str]:
    return {"x-memory-user": MEMORY_USER, **({"x-memory-persist": "false"} if mode == "ro" else {})}


async def measure(args: argparse.Namespace, servers: dict[str, Server], mode: str, first: int) -> dict[str, Side]:
    """Alternating bursts of one mode; each side's figures per round."""
    loads = {}
    for n, name in enumerate(SIDES):
        target = Target(name, servers[name].port, headers(mode))
        loads[name] = ClosedLoop(target, numbered(chat_payload(target, stream=False), first + n * NUMBERS_PER_LOAD), 1)
        await loads[name].open()
    sides = {name: Side() for name in SIDES}
    try:
        for r in range(args.rounds):
            for name in alternating(SIDES, r):
                # A side waits two bursts between its own at each change of order: past the
                # server's keep-alive, so the burst reconnects first.
                figures = await burst(loads[name], servers[name], args.burst)
                side = sides[name]
                side.p50.append(figures.p50_ms)
                side.p99.append(figures.p99_ms)
                side.cpu_ms.append(figures.cpu_ms)
                if figures.errors:
                    print(f"  {name}: {figures.errors} errors in round {r + 1}", file=sys.stderr)
    finally:
        for load in loads.values():
            load.close()
    return sides


def report(mode: str, sides: dict[str, Side]) -> str:
    a, b = sides["A"], sides["B"]
    paired = Paired(a.p50, b.p50)
    med = statistics.median
    return (f"memory-{mode}: p50 A {med(a.p50):.3f} B {med(b.p50):.3f} ms, A-B {paired.median:+.3f} ms"
            f" (A faster in {paired.below_zero}/{len(paired.rounds)} rounds);"
            f" p99 A {med(a.p99):.2f} B {med(b.p99):.2f} ms;"
            f" server CPU per request A {med(a.cpu_ms):.3f} B {med(b.cpu_ms):.3f} ms")


async def run(args: argparse.Namespace, servers: dict[str, Server]) -> list[str]:
    if args.memory_items:
        for name in SIDES:
            target = Target(name, servers[name].port, headers("on"))
            print(f"seeding {args.memory_items} memories into {name} ...", file=sys.stderr)
            await seed_memories(target, MEMORY_USER, args.memory_items)
    lines = []
    for n, mode in enumerate(args.modes):
        print(f"measuring memory-{mode}: {args.rounds} rounds of {args.burst} requests a side ...", file=sys.stderr)
        first = (1 + n * len(SIDES)) * NUMBERS_PER_LOAD
        lines.append(report(mode, await measure(args, servers, mode, first)))
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with Targets("memproxy-ab-") as targets:
        upstream = targets.mock(answer_ms=args.upstream_ms).url("/v1")
        servers = {"A": targets.memproxy(upstream, source=REPO, name="memproxy-a"),
                   "B": targets.memproxy(upstream, source=args.base.resolve(), name="memproxy-b")}
        lines = run_client(run(args, servers))
    print(f"A = {source_version(REPO)} (this checkout), B = {source_version(args.base)} ({args.base});"
          f" {args.memory_items} memories each, upstream answers in {args.upstream_ms:g} ms;"
          f" server logs in {targets.workdir}")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
