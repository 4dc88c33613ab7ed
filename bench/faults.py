"""kill -9 rounds: memproxy killed at a random moment while turns stream.

Each round starts memproxy on one SQLite file, streams `--streams` turns through it at
once, kills it with SIGKILL at a random moment, and checks the file with
`PRAGMA integrity_check`. After the last round memproxy starts once more (its start-up
recovery runs), and every turn whose stream the client saw end with `data: [DONE]` must
be in the store with its answer: turns lost = 0.

    python bench/faults.py [--rounds 50] [--streams 50] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from processes import Server, start_memproxy, start_mock  # noqa: E402

DONE = b"data: [DONE]\n\n"


async def stream_turns(url: str, round_no: int, streams: int) -> list[str]:
    """Start `streams` streamed turns at once; the texts of those that ended with [DONE]."""
    completed: list[str] = []

    async def one(i: int, client: httpx.AsyncClient) -> None:
        text = f"round {round_no} turn {i}"
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": text}]}
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body,
                                     headers={"x-memory-user": f"user{i % 10}"}) as response:
                data = b"".join([piece async for piece in response.aiter_raw()])
        except httpx.HTTPError:
            return
        if data.endswith(DONE):
            completed.append(text)

    async with httpx.AsyncClient(base_url=url, timeout=30, limits=httpx.Limits(max_connections=streams)) as client:
        await asyncio.gather(*(one(i, client) for i in range(streams)))
    return completed


async def kill_during(server: Server, round_no: int, streams: int, rng: random.Random) -> list[str]:
    """Stream turns and SIGKILL the server part way through."""
    task = asyncio.create_task(stream_turns(f"http://127.0.0.1:{server.port}", round_no, streams))
    await asyncio.sleep(rng.uniform(0.05, 0.6))
    server.process.kill()
    return await task


def answered_turns(db: Path) -> set[str]:
    """User texts of turns stored with an answer."""
    with sqlite3.connect(db) as check:
        return {row[0] for row in check.execute(
            "SELECT u.content FROM messages u JOIN messages a ON a.user_id = u.user_id AND a.turn_key = u.turn_key"
            " WHERE u.role = 'user' AND a.role = 'assistant'")}


def integrity(db: Path) -> str:
    with sqlite3.connect(db) as check:
        return str(check.execute("PRAGMA integrity_check").fetchone()[0])


def run(rounds: int, streams: int, seed: int) -> dict[str, object]:
    """All rounds; integrity and turns lost (docs/performance.md)."""
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="memproxy-faults-"))
    mock = start_mock(work, events=20, delay_ms=10)
    db = work / "memproxy.db"
    completed: list[str] = []
    ok_rounds = 0
    started = time.monotonic()
    try:
        for round_no in range(rounds):
            server = start_memproxy(work, f"http://127.0.0.1:{mock.port}/v1", "warning")
            completed += asyncio.run(kill_during(server, round_no, streams, rng))
            server.process.wait(10)
            ok_rounds += integrity(db) == "ok"
            print(f"round {round_no + 1}/{rounds}: {len(completed)} completed so far", file=sys.stderr)
        start_memproxy(work, f"http://127.0.0.1:{mock.port}/v1", "warning").stop()  # recovery at start-up
        lost = sorted(set(completed) - answered_turns(db))
    finally:
        mock.stop()
    return {"rounds": rounds, "streams_per_round": streams, "integrity_ok": ok_rounds,
            "completed_turns": len(completed), "turns_lost": len(lost), "lost": lost[:10],
            "seconds": round(time.monotonic() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = run(args.rounds, args.streams, args.seed)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"integrity_check ok: {result['integrity_ok']}/{result['rounds']}")
        print(f"turns completed (client saw [DONE]): {result['completed_turns']}, turns lost: {result['turns_lost']}")
    raise SystemExit(0 if result["turns_lost"] == 0 and result["integrity_ok"] == result["rounds"] else 1)


if __name__ == "__main__":
    main()
