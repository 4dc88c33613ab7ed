"""Where a server's CPU goes, from py-spy (`pip install py-spy`): thread names, and a sampled profile.

`py-spy record --format raw --threads` writes one line per distinct stack:
`thread (TID): NAME;outermost (file.py);...;innermost (file.py) COUNT`. The summary gives each
thread's share of the samples and the functions most often on top of a stack (self time).
Sampling is `--nonblocking` (the process is not paused), at a modest rate, so the profile
costs the measured server little; py-spy's own CPU is on the same cores, though.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

SAMPLES_PER_S = 50
_THREAD = re.compile(r'^Thread (\d+) \([a-z]+\): "(.*)"$', re.MULTILINE)
_RAW = re.compile(r"^thread \((\d+)\): ([^;]*);(.*) (\d+)$")


def available() -> bool:
    return shutil.which("py-spy") is not None


def thread_names(pid: int) -> dict[int, str]:
    """Thread id -> Python thread name, from one `py-spy dump` (empty when py-spy fails)."""
    done = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
    return {int(tid): name for tid, name in _THREAD.findall(done.stdout)}


def record(pid: int, seconds: float, out: Path, rate: int = SAMPLES_PER_S) -> subprocess.Popen[bytes]:
    """Start sampling `pid` for `seconds` into `out` (raw format, `rate` samples a second); wait on the
    returned process."""
    argv = ["py-spy", "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))), "--format", "raw",
            "--threads", "--nolineno", "--nonblocking", "--rate", str(rate), "--output", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stacks(raw: Path) -> Iterator[tuple[str, list[str], int]]:
    """(thread name, frames outermost first, samples) of each distinct stack of a raw profile."""
    for line in raw.read_text().splitlines():
        found = _RAW.match(line)
        if found is not None:
            _, name, stack, count = found.groups()
            yield name, stack.split(";"), int(count)


def summary(raw: Path, top: int = 12) -> list[str]:
    """Samples per thread, and the `top` innermost functions by samples, as report lines."""
    threads: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    total = 0
    for name, frames, samples in stacks(raw):
        total += samples
        threads[_thread_kind(name)] += samples
        leaves[frames[-1]] += samples
    if not total:
        return ["  (no samples)"]
    lines = ["  samples by thread: " + ", ".join(f"{name} {n / total:.0%}" for name, n in threads.most_common())]
    lines += [f"  {n / total:>6.1%}  {leaf}" for leaf, n in leaves.most_common(top)]
    return lines


def _thread_kind(name: str) -> str:
    """Threads of one pool counted together: `memproxy-sqlite-reader-0` and `-1` are one kind."""
    return re.sub(r"[-_]\d+$", "", name)
