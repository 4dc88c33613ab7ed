"""What memproxy adds over a direct call and over a minimal pass-through, side by side.

Starts the mock upstream, the reference pass-through and memproxy, each its own process
(one uvicorn worker, uvloop + httptools), then measures every target in interleaved
rounds and prints the medians, the ratios and the issue's done-criteria. See bench/README.md.

    python bench/overhead.py [--quick] [--rounds 5] [--duration 1.0] [--json]
                             [--disconnect-storm 500] [--memory-items 1000] [--targets ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.loadgen import Target, run_client
from harness.measure import Figures, Measured, StreamShape, Subject, warm_up
from harness.memory import MEMORY_USER, memory_recovered, seed_memories
from harness.report import all_passed, json_option, print_json
from harness.rounds import rotating
from harness.targets import REPO, Server, Targets, source_version
from storm import disconnect_storm
from summary import MEMPROXY, Results, Summary, criteria, ratio_table, table
from wire_summary import wire_criteria, wire_json, wire_table
from summary import as_json as summary_json

# memproxy with memory on for MEMORY_USER: memproxy-on saves every turn, memproxy-on-ro sends
# X-Memory-Persist: false (recall and injection as usual, nothing saved). One process, one store.
MEMORY_ON = ("memproxy-on", "memproxy-on-ro", "memproxy-hooks")
TARGETS = ("direct", "reference", "memproxy-off", "memproxy-on")
KNOWN_TARGETS = TARGETS + ("memproxy-on-ro", "reference-httpx", "memproxy-quiet", "memproxy-hooks")
# With --wires naming messages, responses or gemini, each of these targets gets a twin on that wire,
# named with the wire's suffix: the same server and headers, the same questions sent on the wire's
# path (POST /v1/messages, POST /v1/responses, POST /v1beta/models/bench-model:generateContent).
WIRE_SUFFIXES = {"messages": "-messages", "responses": "-responses", "gemini": "-gemini"}
WIRE_TWINS = ("direct", "memproxy-off", "memproxy-on", "memproxy-on-ro", "memproxy-hooks")
# memproxy-hooks: memory on, with one no-op Python hook on every event (--hooks), beside memproxy-on.
NO_OP_HOOKS = [
    {"event": event, "python": "proxy.hook_examples:no_opinion"}
    for event in ("session_start", "user_prompt_submit", "post_retrieval", "pre_tool_use", "post_tool_use",
                  "pre_memory_write", "stop")]
# Request numbers each load owns (see run_rounds): more requests than a load ever sends, and a
# multiple of 8, so request n still asks question n % 8.
NUMBERS_PER_LOAD = 10**7


@dataclass(frozen=True)
class Step:
    """One measurement every target goes through in each round."""

    name: str
    streamed: bool
    concurrency: int


STEPS = (
    Step("latency_c1", False, 1), Step("latency_c8", False, 8),
    Step("throughput_c32", False, 32), Step("throughput_c64", False, 64),
    Step("stream_c1", True, 1), Step("stream_c32", True, 32),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds; figures are medians over them")
    p.add_argument("--duration", type=float, default=1.0, help="seconds per step, per target, per round")
    p.add_argument("--slices", type=int, default=4, help="turns the targets take within each step of a round")
    p.add_argument("--quick", action="store_true", help="short smoke run (~20-60 s): 2 rounds of 0.2 s")
    json_option(p)
    p.add_argument("--targets", default=",".join(TARGETS),
                   help=f"comma-separated, from {', '.join(KNOWN_TARGETS)} (memproxy-on-ro: memory on, "
                        "X-Memory-Persist: false; reference-httpx: httpx's own transport; "
                        "memproxy-quiet: a second memproxy, memory off, log level warning)")
    p.add_argument("--wires", default="chat",
                   help="comma-separated, from chat, messages, responses, gemini: with messages (responses, "
                        "gemini), direct and every memproxy-off/on target also run on Anthropic's Messages wire "
                        "(OpenAI's Responses wire, Gemini's generateContent), named target + '-messages' "
                        "('-responses', '-gemini'), in the same rounds")
    p.add_argument("--steps", default=",".join(step.name for step in STEPS),
                   help="comma-separated subset of the steps to run (default: all)")
    p.add_argument("--stream-events", type=int, default=50, help="chunk events per measured stream (plus [DONE])")
    p.add_argument("--stream-gap-ms", type=float, default=5.0, help="time between two events of a measured stream")
    p.add_argument("--upstream-ms", type=float, default=0.0,
                   help="the mock's time to a completion's first byte (0: at once, the worst case for "
                        "memproxy's writes, which otherwise overlap the upstream's time)")
    p.add_argument("--memory-items", type=int, default=0,
                   help="memories to store for the memory-on user first (Memory API; chat turns, slowly, without it)")
    p.add_argument("--disconnect-storm", type=int, default=0, metavar="N",
                   help="afterwards, N streaming clients leave mid-stream under load; then leak checks on memproxy")
    p.add_argument("--hooks", action="store_true",
                   help="also measure memproxy-hooks: memory on with a no-op Python hook on every event")
    p.add_argument("--log-level", default="info", help="memproxy's server.log_level (its default: info)")
    p.add_argument("--memproxy-dir", type=Path, default=REPO, help="the memproxy checkout to run (default: this one)")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.duration, args.slices = 2, 0.2, 2
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if args.hooks and "memproxy-hooks" not in args.targets:
        args.targets.append("memproxy-hooks")
    unknown = set(args.targets) - set(KNOWN_TARGETS)
    if unknown or "direct" not in args.targets:
        p.error(f"--targets must include direct and only name {', '.join(KNOWN_TARGETS)}")
    wires = {w.strip() for w in args.wires.split(",") if w.strip()}
    if not wires or wires - {"chat", *WIRE_SUFFIXES}:
        p.error("--wires must name some of chat, messages, responses, gemini")
    twins = [t + suffix for wire, suffix in WIRE_SUFFIXES.items() if wire in wires
             for t in args.targets if t in WIRE_TWINS]
    if twins:
        args.targets = (args.targets if "chat" in wires else ["direct"]) + twins
    names = {name.strip() for name in args.steps.split(",") if name.strip()}
    args.steps = [step for step in STEPS if step.name in names]
    if not args.steps or names - {step.name for step in STEPS}:
        p.error(f"--steps must name some of {', '.join(step.name for step in STEPS)}")
    return args


def start_servers(args: argparse.Namespace, targets: Targets) -> dict[str, Server]:
    """The processes the chosen targets need, keyed by target name (one memproxy serves three)."""
    mock = targets.mock(args.stream_events, args.stream_gap_ms, args.upstream_ms)
    servers = {"direct": mock}
    upstream = mock.url("/v1")
    wanted = {base_target(name)[0] for name in args.targets}
    gemini = any(base_target(name)[1] == "gemini" for name in args.targets)
    if "reference" in wanted:
        servers["reference"] = targets.reference(upstream, "aiohttp", "reference")
    if "reference-httpx" in wanted:
        servers["reference-httpx"] = targets.reference(upstream, "httpx", "reference-httpx")
    if {"memproxy-off", *MEMORY_ON} & wanted:
        memproxy = targets.memproxy(upstream, args.log_level, args.memproxy_dir, gemini=gemini)
        servers.update(dict.fromkeys(("memproxy-off", *MEMORY_ON), memproxy))
    if "memproxy-hooks" in wanted:
        servers["memproxy-hooks"] = targets.memproxy(upstream, args.log_level, args.memproxy_dir,
                                                     name="memproxy-hooks", hooks=NO_OP_HOOKS, gemini=gemini)
    if "memproxy-quiet" in wanted:
        servers["memproxy-quiet"] = targets.memproxy(upstream, "warning", args.memproxy_dir,
                                                     name="memproxy-quiet", gemini=gemini)
    return servers


def subjects(args: argparse.Namespace, servers: dict[str, Server]) -> dict[str, Subject]:
    """Each target with its port, headers and serving process."""
    out = {}
    for name in args.targets:
        base, wire = base_target(name)
        headers = {"x-memory-user": MEMORY_USER} if base in MEMORY_ON else {}
        if base == "memproxy-on-ro":
            headers["x-memory-persist"] = "false"
        out[name] = Subject(Target(name, servers[base].port, headers, wire=wire), servers[base], servers["direct"])
    return out


def base_target(name: str) -> tuple[str, str]:
    """The target a name runs (its server and headers) and the wire it speaks."""
    for wire, suffix in WIRE_SUFFIXES.items():
        if name.endswith(suffix):
            return name.removesuffix(suffix), wire
    return name, "chat"


async def run_step(step: Step, targets: dict[str, Subject], order: list[str], args: argparse.Namespace,
                   shape: StreamShape, first: int) -> dict[str, Figures]:
    """One step for every target: the targets take turns in slices of duration/slices seconds.

    Target i numbers its requests from first + i * NUMBERS_PER_LOAD.
    """
    numbers = {name: first + i * NUMBERS_PER_LOAD for i, name in enumerate(targets)}
    loads = {name: Measured(targets[name], step.concurrency, shape if step.streamed else None, numbers[name])
             for name in order}
    try:
        for name in order:
            await loads[name].open()
        for _ in range(args.slices):
            for name in order:
                await loads[name].slice(args.duration / args.slices)
    finally:
        for load in loads.values():
            load.close()
    return {name: load.figures() for name, load in loads.items()}


async def memory_closed(targets: dict[str, Subject], waits: Figures) -> None:
    """Wait until memproxy's circuit breaker is closed, when a memory-on target is measured.

    A step at 32 or 64 connections can time retrieval out and open the breaker for 15 s; the
    steps after it would then measure memory-on requests that skipped memory.
    """
    subject = next((subject for name, subject in targets.items() if base_target(name)[0] in MEMORY_ON), None)
    if subject is None:
        return
    waited = await memory_recovered(subject.target, MEMORY_USER)
    if waited < 0 or waited > 0.05:  # the first /readyz alone takes a few ms
        waits["breaker_waits"] += 1
        waits["breaker_wait_s"] += max(waited, 0.0)
        waits["breaker_still_open"] += float(waited < 0)


async def run_rounds(args: argparse.Namespace, targets: dict[str, Subject]) -> tuple[Results, Figures]:
    """Every step for every target, interleaved: within a step the targets take turns slice by
    slice, and the order rotates each round so no target always goes first.

    Each load (round, step, target) numbers its requests in a range of its own, and the number is
    in the question, so no request of the run repeats an earlier one. memproxy takes a repeated
    history within memory.retry_window_s (30 s) for a retry of the same turn and answers it with
    that turn's saved block, without retrieval: repeats would let memproxy-on skip retrieval, and
    memproxy-on-ro (same user) would be answered from memproxy-on's saved turns.
    """
    shape = StreamShape(args.stream_events, args.stream_gap_ms)
    names = list(targets)
    results: Results = {step.name: {name: [] for name in names} for step in args.steps}
    waits = {"breaker_waits": 0.0, "breaker_wait_s": 0.0, "breaker_still_open": 0.0}
    for r in range(args.rounds):
        started = time.perf_counter()
        order = rotating(names, r)
        for i, step in enumerate(args.steps):
            # From 1, not 0: the warm-up's requests are numbered from 0.
            first = (1 + (r * len(args.steps) + i) * len(names)) * NUMBERS_PER_LOAD
            await memory_closed(targets, waits)
            for name, figures in (await run_step(step, targets, order, args, shape, first)).items():
                results[step.name][name].append(figures)
        print(f"  round {r + 1}/{args.rounds} done in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return results, waits


def memory_sizes(servers: dict[str, Server], targets: list[str]) -> dict[str, float]:
    """Resident memory of each target's serving process, MiB."""
    return {name: servers[base_target(name)[0]].rss_mb() for name in targets}


async def bench(args: argparse.Namespace, servers: dict[str, Server]) -> dict[str, Any]:
    """Seed, warm up, measure the rounds, then the storm; everything the report needs."""
    targets = subjects(args, servers)
    report: dict[str, Any] = {}
    memory_on = [subject for name, subject in targets.items() if base_target(name)[0] in MEMORY_ON]
    if args.memory_items and memory_on:
        print(f"seeding {args.memory_items} memories for {MEMORY_USER} ...", file=sys.stderr)
        report["seed"] = await seed_memories(memory_on[0].target, MEMORY_USER, args.memory_items)
        report["seed"]["breaker_closed_after_s"] = await memory_recovered(memory_on[0].target, MEMORY_USER)
    print("warming up ...", file=sys.stderr)
    for name, subject in targets.items():
        # memory-on shares memproxy-off's process and pool; 64 recalls at once would only trip its breaker
        memory_on_target = base_target(name)[0] in MEMORY_ON
        await warm_up(subject, StreamShape(args.stream_events, args.stream_gap_ms), 4 if memory_on_target else 64)
    report["rss_mb_start"] = memory_sizes(servers, args.targets)
    print(f"measuring {args.rounds} rounds of {args.duration} s per step and target ...", file=sys.stderr)
    report["results"], waits = await run_rounds(args, targets)
    if memory_on:
        report["memory"] = waits
    report["rss_mb_end"] = memory_sizes(servers, args.targets)
    stormed = targets.get(MEMPROXY) or (memory_on[0] if memory_on else None)
    if args.disconnect_storm and stormed is not None:
        print(f"disconnect storm: {args.disconnect_storm} clients ...", file=sys.stderr)
        report["storm"] = await disconnect_storm(stormed, args.disconnect_storm, MEMORY_USER)
    return report


def print_report(args: argparse.Namespace, report: dict[str, Any], version: str) -> bool:
    """The table, the ratios, the storm and the criteria; True when every criterion passed."""
    summary = Summary(report["results"], args.targets)
    print(f"\nmemproxy {version}: {args.rounds} interleaved rounds, {args.duration} s per step; medians over rounds."
          f"\nstreams: {args.stream_events} chunk events + [DONE], {args.stream_gap_ms} ms apart. "
          f"upstream's time to first byte: {args.upstream_ms:g} ms. "
          f"memproxy log level: {args.log_level}.\n")
    print(table(summary, {"RSS MiB after warm-up": report["rss_mb_start"], "RSS MiB at end": report["rss_mb_end"]}))
    print()
    print(ratio_table(summary))
    wires = wire_table(summary)
    if wires:
        print()
        print(wires)
    for name in (name for name in args.targets if base_target(name)[0] in MEMORY_ON):
        sent = sum(f["requests"] for step in report["results"].values() for f in step[name])
        saved = "none saved (X-Memory-Persist: false)" if "-ro" in name else "each saved as a turn"
        print(f"\n{name}: {sent:,.0f} measured requests for {MEMORY_USER}, {saved}.")
    for key in ("seed", "memory", "storm"):
        if key in report:
            print(f"\n{key}: " + ", ".join(f"{k} {v:g}" for k, v in report[key].items()))
    checks = criteria(summary, args.memory_items) + wire_criteria(summary)
    print()
    for check in checks:
        print(check.line())
    if args.json:
        settings = {**vars(args), "memproxy_dir": str(args.memproxy_dir), "steps": [s.name for s in args.steps]}
        out = {"memproxy": version, "settings": settings,
               **summary_json(summary), "wires": wire_json(summary), "rss_mb_start": report["rss_mb_start"], "rss_mb_end": report["rss_mb_end"],
               "seed": report.get("seed"), "memory": report.get("memory"), "storm": report.get("storm"),
               "criteria": [c.as_json() for c in checks]}
        print_json(out)
    return all_passed(checks)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit 1 when a done-criterion fails (informational ones do not count)."""
    args = parse_args(argv)
    started = time.perf_counter()
    with Targets("memproxy-bench-") as targets:
        report = run_client(bench(args, start_servers(args, targets)))
    print(f"finished in {time.perf_counter() - started:.0f} s; server logs in {targets.workdir}", file=sys.stderr)
    return 0 if print_report(args, report, source_version(args.memproxy_dir)) else 1


if __name__ == "__main__":
    sys.exit(main())
