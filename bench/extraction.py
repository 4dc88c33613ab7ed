"""Extraction throughput: the rules extractor alone, and the queue's drain rate end to end.

1. `rules`: messages per second through `extract()` on one core, over realistic user
   messages (facts about the speaker, other people, preferences, identifiers, questions,
   chit-chat, some long ones), with p50/p95 per message.
2. `drain`: a real SQLite file holding the messages (and the assistant answers, which are
   dequeued unmined) of several users is drained by the real worker and writer, as a
   restarted proxy would: items per second from the first claim to an empty queue, and the
   graph it built. One case spreads the messages over many users, one gives them to one.

    python bench/extraction.py [--messages 5000] [--users 50] [--seed 7] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from contextlib import closing
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.figures import call_ms, percentile  # noqa: E402
from harness.report import Column, json_option, print_json, table  # noqa: E402
from proxy.memory.extraction import extract  # noqa: E402
from proxy.memory.learning.worker import ExtractionWorker  # noqa: E402
from proxy.memory.writer import Writer  # noqa: E402
from proxy.metrics import Metrics  # noqa: E402
from proxy.models import Scope  # noqa: E402
from proxy.stores.base import FinishTurn, StartTurn, WriteOp  # noqa: E402
from proxy.stores.sqlite.store import SQLiteStore  # noqa: E402

START = datetime(2026, 1, 1, tzinfo=UTC)
PEOPLE = "Alice Bob Priya Mateo Fatima Olu Sven Keiko Rosa Dmitri Amara Lena Tomas Ines Kwame Yuki Omar Hana".split()
SURNAMES = "Chen Reyes Okafor Lindqvist Tanaka Haddad Moreau Novak Silva Kowalski Mensah Park".split()
ORGS = ["Northwind Traders", "Contoso Pharma", "Globex", "Initech", "Acme Robotics", "Fabrikam", "Tailspin Toys",
        "Wingtip Labs", "Litware", "Adventure Works", "Proseware", "Coho Winery"]
PLACES = "Lisbon Oslo Nairobi Kyoto Denver Porto Tallinn Hanoi Quito Lagos Bergen Seville Krakow Austin".split()
TOPICS = """budget garden deploy invoice holiday dentist marathon recipe database lease guitar mortgage podcast
    wedding laptop thesis kayak migration bakery insurance passport conference printer roof kitchen""".split()
PREFS = ["dark mode", "tabs", "Go", "Python", "green tea", "morning meetings", "vim", "window seats", "sushi"]
ROLES = ["manager", "sister", "brother", "dentist", "friend", "colleague", "wife", "husband", "landlord", "mentor"]
USER_TEMPLATES = [
    "I work at {org}.", "I just started a new job at {org} as a {topic} engineer.", "I live in {place} now.",
    "My {role} {person} lives in {place}.", "My {role} is {person} {surname}.", "I prefer {pref} over {pref2}.",
    "Please always use {pref} in examples.", "My name is {person} {surname}.", "Our staging host is {ident}.",
    "{person} from {org} asked whether we could move the {topic} review.", "Can you help me plan the {topic}?",
    "What did {person} say about the {topic} last week?", "Thanks, that worked!", "Hmm, not sure about that one.",
    "We moved the {topic} meeting to {place} next Tuesday, {person} will join from {org}.",
    "I grew up in {place} and studied at the University of {place2}.", "My dog {person} hates the {topic}.",
]
ANSWERS = ["Sure, here is a plan for the {topic}: first review the budget, then book the venue.",
           "{person} mentioned the {topic} on Monday; I would ask {org} for an update.",
           "Got it. I will keep that in mind for the {topic}."]


def identifier(rng: random.Random) -> str:
    return rng.choice([f"db-{rng.randrange(99)}.prod.internal", f"https://api.example.com/v{rng.randrange(9)}",
                       f"{rng.getrandbits(28):07x}", f"/var/log/app-{rng.randrange(99)}.log"])


def fill(template: str, rng: random.Random) -> str:
    return template.format(org=rng.choice(ORGS), place=rng.choice(PLACES), place2=rng.choice(PLACES),
                           person=rng.choice(PEOPLE), surname=rng.choice(SURNAMES), topic=rng.choice(TOPICS),
                           pref=rng.choice(PREFS), pref2=rng.choice(PREFS), role=rng.choice(ROLES),
                           ident=identifier(rng))


def user_message(rng: random.Random) -> str:
    """One to three sentences; one message in twenty is a long paragraph."""
    count = rng.choice([1, 1, 1, 2, 3]) if rng.random() > 0.05 else rng.randrange(12, 30)
    return " ".join(fill(rng.choice(USER_TEMPLATES), rng) for _ in range(count))


def measure_rules(texts: list[str]) -> dict[str, Any]:
    """Messages per second through the rules extractor, single-threaded."""
    for text in texts[:200]:
        extract(text)  # warm the regex caches
    started = time.perf_counter()
    times = [1000 * call_ms(partial(extract, text)) for text in texts]  # µs
    elapsed = time.perf_counter() - started
    return {"messages": len(texts), "seconds": round(elapsed, 3), "messages_per_s": round(len(texts) / elapsed),
            "chars_per_s": round(sum(map(len, texts)) / elapsed), "mean_chars": round(statistics.mean(map(len, texts))),
            "p50_us": round(percentile(times, 50)), "p95_us": round(percentile(times, 95))}


def turn_ops(users: int, texts: list[str], rng: random.Random) -> list[WriteOp]:
    """The turns of the messages, round-robin over the users, each with an assistant answer."""
    ops: list[WriteOp] = []
    for n, text in enumerate(texts):
        scope, at = Scope(f"user-{n % users}"), START + timedelta(seconds=n)
        conversation = f"c{n // (users * 10)}"
        ops.append(StartTurn(scope, f"t{n}", conversation, f"h{n}", at, text))
        ops.append(FinishTurn(scope, f"t{n}", conversation, fill(rng.choice(ANSWERS), rng), at))
    return ops


async def measure_drain(path: Path, users: int, texts: list[str], seed: int) -> dict[str, Any]:
    """Items per second through the real worker and writer until the queue is empty."""
    store, metrics = SQLiteStore(str(path)), Metrics()
    await store.open()
    ops = turn_ops(users, texts, random.Random(seed))
    for start in range(0, len(ops), 2000):
        await store.apply(ops[start:start + 2000])
    items = (await store.queue_depth())["pending"]
    writer = Writer(store, metrics, 10000)
    worker = ExtractionWorker(store, writer, metrics, from_roles=["user"], isolate_agents=False)
    writer.start()
    try:
        started = time.perf_counter()
        while await worker.drain_once():
            pass
        elapsed = time.perf_counter() - started
        depth = await store.queue_depth()
    finally:
        await writer.close()
        await store.close()
    with closing(sqlite3.connect(path)) as db:
        entities, = db.execute("SELECT count(*) FROM entities").fetchone()
        edges, closed = db.execute("SELECT count(*), count(invalid_at) FROM relationships").fetchone()
    return {"users": users, "queue_items": items, "user_messages": len(texts), "seconds": round(elapsed, 3),
            "items_per_s": round(items / elapsed), "user_messages_per_s": round(len(texts) / elapsed),
            "left": depth, "entities": entities, "relationships": edges, "invalidated": closed}


DRAIN_COLUMNS = (Column("users", 6), Column("items", 7), Column("seconds", 8, ".2f"), Column("items/s", 8),
                 Column("user msg/s", 10), Column("entities", 9), Column("edges", 7), Column("closed", 7))
DRAIN_KEYS = ("users", "queue_items", "seconds", "items_per_s", "user_messages_per_s", "entities", "relationships",
              "invalidated")


def report(rules: dict[str, Any], drains: list[dict[str, Any]]) -> str:
    return "\n".join([
        "rules extractor (one core)",
        f"  {rules['messages']} messages, mean {rules['mean_chars']} chars: {rules['messages_per_s']} msg/s,"
        f" {rules['chars_per_s']} chars/s, p50 {rules['p50_us']} µs, p95 {rules['p95_us']} µs",
        "", "queue drain (worker + writer + SQLite file)",
        table(DRAIN_COLUMNS, [[d[key] for key in DRAIN_KEYS] for d in drains], indent="  ")])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=5000, help="user messages (default 5000)")
    p.add_argument("--users", type=int, default=50, help="users the spread case shares them among (default 50)")
    p.add_argument("--seed", type=int, default=7)
    json_option(p)
    return p.parse_args(argv)


async def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    texts = [user_message(rng) for _ in range(args.messages)]
    rules = measure_rules(texts)
    print(f"rules: {rules['messages_per_s']} msg/s", file=sys.stderr)
    drains = []
    with tempfile.TemporaryDirectory() as scratch:
        for users in (args.users, 1):
            drains.append(await measure_drain(Path(scratch) / f"drain-{users}.db", users, texts, args.seed))
            print(f"drain, {users} users: {drains[-1]['items_per_s']} items/s", file=sys.stderr)
    print(report(rules, drains))
    if args.json:
        print_json({"rules": rules, "drain": drains})


if __name__ == "__main__":
    asyncio.run(main())
