"""Paired: the Messages or Responses wire against Chat Completions on one memproxy, in alternating bursts.

`overhead.py --wires chat,messages` runs the wires in the same rounds, but its absolute
figures drift by ±0.5 ms on a shared host. Here a single keep-alive connection per wire and
side (through memproxy, and to the mock directly) sends bursts in turn, the order reversed
every other round, so both wires live through the same noise; the median of the per-round
differences of their added p50s is the figure. Memory off, then on (seeded user).

    python bench/wires_ab.py [--wire messages|responses] [--rounds 30] [--burst 200] [--memory-items 10000]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from harness.figures import Paired, differences
from harness.loadgen import ClosedLoop, Target, numbered, run_client, wire_payload
from harness.memory import MEMORY_USER, seed_memories
from harness.rounds import alternating, burst
from harness.targets import REPO, Server, Targets, source_version

OTHER_WIRES = ("messages", "responses")  # each compared with "chat"
# Each load numbers its requests in a range of its own: no request repeats an earlier one,
# which memproxy would take for a retry (as in overhead.py).
NUMBERS_PER_LOAD = 10**8


async def measure(mock: Server, memproxy: Server, headers: dict[str, str], first: int, args: argparse.Namespace) -> str:
    """One mode's alternating bursts; its line of the report."""
    other = args.wire
    wires = ("chat", other)
    loads = {}
    for n, (wire, side) in enumerate((w, s) for w in wires for s in ("direct", "proxy")):
        server = memproxy if side == "proxy" else mock
        target = Target(f"{side}-{wire}", server.port, headers if side == "proxy" else {}, wire=wire)
        loads[wire, side] = ClosedLoop(target, numbered(wire_payload(target, stream=False),
                                                        first + n * NUMBERS_PER_LOAD), 1)
        await loads[wire, side].open()
    p50: dict[tuple[str, str], list[float]] = {key: [] for key in loads}
    cpu: dict[str, list[float]] = {wire: [] for wire in wires}
    try:
        for r in range(args.rounds):
            for key in alternating(list(loads), r):
                figures = await burst(loads[key], memproxy, args.burst)
                p50[key].append(figures.p50_ms)
                if key[1] == "proxy":
                    cpu[key[0]].append(figures.cpu_ms)
    finally:
        for load in loads.values():
            load.close()
    added = {w: differences(p50[w, "proxy"], p50[w, "direct"]) for w in wires}
    paired = Paired(added[other], added["chat"])
    low, high = paired.spread
    med = statistics.median
    return (f"added p50 chat {med(added['chat']):.3f} {other} {med(added[other]):.3f} ms, {other} - chat "
            f"{paired.median:+.3f} ms (per round {low:+.2f} to {high:+.2f}, {other} faster in "
            f"{paired.below_zero}/{len(paired.rounds)}); server CPU per request chat {med(cpu['chat']):.3f} "
            f"{other} {med(cpu[other]):.3f} ms")


async def run(args: argparse.Namespace, mock: Server, memproxy: Server) -> list[str]:
    if args.memory_items:
        print(f"seeding {args.memory_items} memories ...", file=sys.stderr)
        await seed_memories(Target("memproxy", memproxy.port), MEMORY_USER, args.memory_items)
    lines = []
    for n, (mode, headers) in enumerate((("off", {}), ("on", {"x-memory-user": MEMORY_USER}))):
        print(f"memory {mode}: {args.rounds} rounds of {args.burst} requests a load ...", file=sys.stderr)
        lines.append(f"memory {mode}: " + await measure(mock, memproxy, headers, n * 10 * NUMBERS_PER_LOAD, args))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wire", choices=OTHER_WIRES, default="messages", help="the wire compared with chat")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--burst", type=int, default=200, help="requests each load sends per round")
    parser.add_argument("--memory-items", type=int, default=10_000, help="memories seeded for the memory-on user")
    args = parser.parse_args(argv)
    with Targets("memproxy-wires-ab-") as targets:
        mock = targets.mock()
        lines = run_client(run(args, mock, targets.memproxy(mock.url("/v1"))))
    print(f"memproxy {source_version(REPO)}; {args.memory_items} memories; server logs in {targets.workdir}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
