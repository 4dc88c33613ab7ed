"""Where one memory-on request's CPU goes: memproxy's CPU per request by thread, and py-spy's profile.

One memproxy process with `--memory-items` memories of one user answers `--requests` streamed
requests one at a time (each saved, or recall only with `--mode ro`); its CPU per request is read
from /proc by thread before and after. With py-spy installed, the run is sampled and the report
lists the functions by inclusive and by self share of the samples, in milliseconds a request.
With `--perf`, Linux perf samples it instead and the report splits its CPU by shared object: the
interpreter running Python, the kernel (system calls, thread switches), SQLite, numpy and BLAS.

`--saved-first N` saves N turns before the measured requests: `--mode ro` then measures recall
on the store the same run of `--mode on` would search, so the two differ by the saving alone.

    python bench/request_cpu.py [--memory-items 10000] [--requests 600] [--mode on|ro] [--source DIR]
                                [--saved-first N] [--perf]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import proc, pyspy  # noqa: E402
from harness.loadgen import Target, chat_payload, connect, numbered, run_client  # noqa: E402
from harness.memory import MEMORY_USER, memory_recovered, seed_memories  # noqa: E402
from harness.targets import REPO, Server, Targets, source_version  # noqa: E402

RATE = 400  # samples a second: a request of a few ms needs many
PERF_RATE = 999


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-items", type=int, default=10000)
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--mode", choices=("on", "ro"), default="on", help="on: every turn saved; ro: recall only")
    parser.add_argument("--source", type=Path, default=REPO, help="the memproxy checkout to measure")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--no-profile", action="store_true", help="CPU by thread only, without py-spy")
    parser.add_argument("--keep-profile", type=Path, help="copy py-spy's raw stacks here, to read further")
    parser.add_argument("--saved-first", type=int, default=0, help="turns saved before the measured requests")
    parser.add_argument("--perf", action="store_true", help="sample with Linux perf: CPU by shared object")
    args = parser.parse_args()
    with Targets("memproxy-cpu-") as targets:
        mock = targets.mock(events=5, delay_ms=0.0)
        server = targets.memproxy(mock.url(), "warning", args.source)
        run_client(measure(args, targets, server))


async def measure(args: argparse.Namespace, targets: Targets, server: Server) -> None:
    headers = {"x-memory-user": MEMORY_USER} | ({"x-memory-persist": "false"} if args.mode == "ro" else {})
    target = Target("memproxy", server.port, headers)
    if args.memory_items:
        await seed_memories(target, MEMORY_USER, args.memory_items)
        await memory_recovered(target, MEMORY_USER)
    if args.saved_first:
        await save_turns(Target("memproxy", server.port, {"x-memory-user": MEMORY_USER}), args.saved_first)
    make = numbered(chat_payload(target, stream=True), 1_000_000)
    conn = await connect(target)
    for n in range(50):
        await conn.request(make(n))
    await asyncio.sleep(1.0)  # the warm-up's writes and vectors settle
    names = pyspy.thread_names(server.pid) if pyspy.available() else {}
    sampler = None
    raw = targets.workdir / "profile.raw"
    if args.perf:
        raw = targets.workdir / "perf.data"
        sampler = subprocess.Popen(["perf", "record", "-F", str(PERF_RATE), "-p", str(server.pid), "-o", str(raw)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await asyncio.sleep(1.0)
    elif pyspy.available() and not args.no_profile:
        sampler = pyspy.record(server.pid, 3600, raw, RATE)
        await asyncio.sleep(1.0)
    before, cpu_before = proc.thread_cpu(server.pid, names), server.cpu_seconds()
    started = time.perf_counter()
    errors = 0
    for n in range(50, 50 + args.requests):
        reply = await conn.request(make(n))
        errors += reply.status != 200
    elapsed = time.perf_counter() - started
    await asyncio.sleep(0.5)
    after, cpu_after = proc.thread_cpu(server.pid, names), server.cpu_seconds()
    if sampler is not None:
        sampler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT, not on SIGTERM
        sampler.wait()
    conn.close()
    per = 1000.0 / args.requests
    print(f"memproxy {source_version(args.source)}, {args.memory_items} memories, mode {args.mode}, "
          f"{args.requests} requests one at a time ({errors} errors), {elapsed / args.requests * 1000:.2f} ms each")
    print(f"CPU a request: {(cpu_after - cpu_before) * per:.2f} ms")
    for name in sorted(after, key=lambda k: after[k] - before.get(k, 0.0), reverse=True):
        spent = (after[name] - before.get(name, 0.0)) * per
        if spent >= 0.01:
            print(f"  {name:<40} {spent:6.2f} ms")
    if args.perf and raw.exists():
        report_objects(raw, args.top)
    elif sampler is not None and raw.exists():
        report(raw, args.requests, elapsed, args.top)
        if args.keep_profile:
            shutil.copyfile(raw, args.keep_profile)


async def save_turns(target: Target, turns: int) -> None:
    """`turns` saved requests of their own numbers, then a pause for their writes and vectors."""
    make = numbered(chat_payload(target, stream=True), 5_000_000)
    conn = await connect(target)
    for n in range(turns):
        await conn.request(make(n))
    conn.close()
    await asyncio.sleep(2.0)


def report_objects(data: Path, top: int) -> None:
    """perf's samples of the process by shared object, as shares of its CPU."""
    done = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", "dso",
                           "-g", "none"], capture_output=True, text=True, timeout=600)
    shares = [line.strip() for line in done.stdout.splitlines() if line.strip() and not line.startswith("#")]
    print("perf, CPU by shared object:")
    for line in shares[:top]:
        print(f"  {line}")


def report(raw: Path, requests: int, elapsed: float, top: int) -> None:
    """Functions by inclusive and self samples, in ms a request."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for _, frames, samples in pyspy.stacks(raw):
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    ms = 1000.0 / RATE / requests
    print(f"py-spy: {total} samples ({total * ms:.2f} ms a request, idle waits excluded)")
    print("inclusive:")
    for frame, n in inclusive.most_common(top):
        print(f"  {n * ms:6.2f}  {frame}")
    print("self:")
    for frame, n in own.most_common(top):
        print(f"  {n * ms:6.2f}  {frame}")


if __name__ == "__main__":
    main()
