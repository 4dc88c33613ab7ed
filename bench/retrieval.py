"""Retrieval latency and memory as one user's memory grows, and other streams meanwhile.

Fills one user's SQLite store with N messages (varied sentences, some holding
identifiers) in conversations of about ten, plus entities, relationships and reasoning
traces in proportion, with other users' data beside it; then times `Retrieval.retrieve`
over a fixed set of queries, in a fresh process, and prints p50/p95 per source and for the
whole retrieval, and that process's resident memory. With `--rounds N` each size is timed
N times (a new process each time) and the table shows the median of each figure over the
rounds: on a shared machine one round can land on a busy second.

Then memproxy serves the store, and memory-off streams are measured with and without a
closed loop of memory-on requests beside them (bench/retrieval_streams.py). The issue's
lines follow as PASS/FAIL; the exit status is 1 when one fails.

    python bench/retrieval.py [--sizes 1000,10000,100000] [--queries 200] [--rounds 3] [--json] [--keep DIR]
                              [--embeddings off|local]
                              [--no-streams] [--stream-seconds 1.0] [--stream-rounds 3] [--retrieval-connections 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import closing
from datetime import UTC, datetime, timedelta
from multiprocessing import get_context
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.calls.embeddings import vector_parts  # noqa: E402
from proxy.memory.retrieval.base import Query  # noqa: E402
from proxy.memory.retrieval.retriever import Retrieval  # noqa: E402
from proxy.metrics import Metrics  # noqa: E402
from proxy.models import ReasoningStep, Scope  # noqa: E402
from proxy.settings import MemorySettings, load_settings  # noqa: E402
from proxy.stores.base import FinishTurn, StartTurn, WriteOp  # noqa: E402
from proxy.stores.sqlite.store import SQLiteStore  # noqa: E402
from proxy.stores.indexed_text import entity_terms  # noqa: E402
from proxy.http.upstream import Upstream  # noqa: E402
from harness.figures import p50_p95  # noqa: E402
from harness.proc import status_mb  # noqa: E402
from harness.report import Column, Criterion, all_passed, json_option, print_json, table  # noqa: E402
from retrieval_streams import Ask, StreamLoad, no_batching, stream_batching, streams_table  # noqa: E402

USER = Scope("bench-user")
OTHERS = [Scope(f"other-{n}") for n in range(3)]
PER_CONVERSATION = 10
BATCH = 2000
START = datetime(2024, 1, 1, tzinfo=UTC)
SOURCES = ("long-term", "graph", "conversation", "cross-session", "reasoning")
# Issue 4's limits on the total retrieval time: (stored items, percentile, ms).
LIMITS = ((10_000, "p50", 3.0), (10_000, "p95", 8.0), (100_000, "p95", 25.0))
# The resident-memory figures of the measuring process, MiB (see measure).
MEMORY = ("rss_mb_imported", "rss_mb_open", "rss_mb_end", "peak_mb")

PEOPLE = """Alice Bob Priya Mateo Fatima Olu Sven Keiko Rosa Dmitri Amara Lena Tomas Ines Kwame Yuki Omar Hana
    Lucas Zara Nils Chloe Ravi Marta Jonas Aisha Pablo Ingrid Tariq Mei Felix Noor Diego Elsa Kofi Sara Ivan Leila
    Bruno Astrid Hugo Nadia Emeka Julia Arjun Greta Malik Sofia Theo Rania""".split()
ORGS = """Acme Globex Initech Hooli Vandelay Umbrella Cyberdyne Soylent Wonka Stark Wayne Tyrell Monarch Aperture
    Oscorp Gringotts Pied Piper Dunder Prestige Virtucon""".split()
PLACES = """Lisbon Oslo Nairobi Kyoto Denver Porto Tallinn Hanoi Quito Lagos Bergen Seville Krakow Austin Dublin Accra
    Bologna Sapporo Tbilisi Valparaiso Ghent Leeds Malmo Perth Cusco Zagreb Tromso Ljubljana Riga Nantes""".split()
# Content words are many and each is rare, as in real conversations; a tiny vocabulary
# would make every query term match a tenth of the corpus.
TOPICS = """budget garden deploy invoice holiday dentist marathon recipe database lease guitar mortgage podcast
    wedding laptop vaccine thesis kayak migration bakery insurance passport conference newsletter printer
    sourdough bicycle roof plumber kitchen pension scholarship interview promotion salary contract server
    firewall backup certificate keyboard monitor camera drone telescope aquarium puppy kitten vet allergy
    pharmacy yoga climbing surfing skiing chess piano violin choir painting pottery knitting novel poem
    screenplay museum concert festival exhibition hackathon workshop seminar webinar lecture exam homework
    tuition daycare babysitter nanny grandparents anniversary birthday funeral reunion barbecue picnic
    camping hiking fishing sailing diving tennis football basketball cricket rugby swimming gym diet
    vitamins therapy meditation sleep insomnia headache dermatologist optician glasses braces orthodontist
    carpool commute train flight hotel airbnb visa embassy customs luggage souvenir mortgage refinance
    taxes accountant receipt refund warranty repair mechanic tires oil battery charger solar heatpump
    insulation window fence lawn compost seeds tomatoes chickens beehive orchard vineyard""".split()
VERBS = """review fix book cancel schedule rewrite finish discuss move test renew submit compare order return
    sign draft approve migrate upgrade clean paint measure replace install configure""".split()
WHEN = ["on Monday", "next week", "tomorrow", "before Friday", "in March", "after lunch", "tonight", "this weekend",
        "in June", "by the end of the month", "on the 14th", "after the holidays", "first thing tomorrow"]
TEMPLATES = [
    "I need to {verb} the {topic} {when} with {person}.",
    "{person} said the {topic} at {org} is almost done.",
    "Can you remind me to {verb} the {topic} {when}?",
    "We moved the {topic} meeting to {place} {when}.",
    "The {topic} notes are on {ident} if you need them.",
    "My {topic} plan for {place} changed again {when}.",
    "{person} from {org} asked whether we could {verb} the {topic}.",
    "Sure, I will help you {verb} the {topic} {when}; {person} already agreed.",
    "Remember that the {topic} deadline at {org} is {when}.",
    "Set {ident} before you {verb} the {topic}.",
]
QUERIES = [
    "when is the {topic} deadline?",
    "what did {person} say about the {topic}?",
    "where do I work?",
    "remind me what we decided about the {topic} in {place}",
    "is {ident} still the right value for the {topic}?",
    "who at {org} handles the {topic}?",
    "what is my {topic} plan?",
    "{verb} the {topic} {when}",
]


def identifier(rng: random.Random) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        return f"internal-{rng.choice(TOPICS)}-{rng.randrange(10000)}.example"
    if kind == 1:
        return f"{rng.choice(TOPICS).upper()}_{rng.choice(VERBS).upper()}_{rng.randrange(100)}"
    if kind == 2:
        return f"/srv/{rng.choice(TOPICS)}/{rng.choice(VERBS)}-{rng.randrange(1000)}.yaml"
    return f"{rng.choice(TOPICS)}{rng.choice(VERBS).title()}Id"


def sentence(rng: random.Random, templates: list[str]) -> str:
    return rng.choice(templates).format(
        verb=rng.choice(VERBS), topic=rng.choice(TOPICS), when=rng.choice(WHEN), person=rng.choice(PEOPLE),
        org=rng.choice(ORGS), place=rng.choice(PLACES), ident=identifier(rng),
    )


def message_ops(scope: Scope, count: int, rng: random.Random) -> list[WriteOp]:
    """`count` messages, user and assistant in turns, ten to a conversation, one a minute."""
    ops: list[WriteOp] = []
    for n in range(0, count, 2):
        conv = f"conv-{n // PER_CONVERSATION}"
        at = START + timedelta(minutes=n)
        key = f"{scope.user}-t{n}"
        ops.append(StartTurn(scope, key, conv, f"h-{key}", at, sentence(rng, TEMPLATES)))
        if n + 1 < count:
            steps: tuple[ReasoningStep, ...] = ()
            if n % 50 == 0:
                steps = (ReasoningStep("search_notes", json.dumps({"q": rng.choice(TOPICS)}), sentence(rng, TEMPLATES)),)
            ops.append(FinishTurn(scope, key, conv, sentence(rng, TEMPLATES), at + timedelta(seconds=30),
                                  task="look it up", steps=steps))
    return ops


def add_graph(path: Path, scope: Scope, count: int, rng: random.Random) -> None:
    """About one entity per 20 messages, a user node, and edges between them."""
    names = sorted({*PEOPLE, *ORGS, *PLACES, *(f"{t.title()} project {n}" for t in TOPICS for n in range(count))})
    names = names[:max(len(PEOPLE) + len(ORGS) + len(PLACES), count // 20)]
    rows = [("me", "Sam Rivera", "user", "the user")]
    for n, name in enumerate(names):
        kind = "person" if name in PEOPLE else "organization" if name in ORGS else "place" if name in PLACES else "project"
        rows.append((f"e{n}", name, kind, f"{name} appears in notes about the {rng.choice(TOPICS)} {rng.choice(WHEN)}"))
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("INSERT INTO users (id, created_at) VALUES (?, 0) ON CONFLICT DO NOTHING", (scope.user,))
        db.executemany(
            "INSERT INTO entities (id, user_id, name, canonical_name, type, description, name_terms, type_terms,"
            " description_terms, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0)",
            [(eid, scope.user, name, name.casefold(), kind, desc, *entity_terms(name, kind, desc))
             for eid, name, kind, desc in rows],
        )
        ids = [row[0] for row in rows]
        edges = [("me", "WORKS_AT", "e1"), ("me", "LIVES_IN", "e2")]
        edges += [(rng.choice(ids), rng.choice(["KNOWS", "PART_OF", "LOCATED_IN", "USES"]), rng.choice(ids))
                  for _ in range(len(ids) * 2)]
        db.executemany(
            "INSERT INTO relationships (id, user_id, from_id, type, to_id, valid_from, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, 0)",
            [(f"r{n}", scope.user, f, t, to, START.timestamp() + n) for n, (f, t, to) in enumerate(edges)],
        )


async def build(path: Path, size: int, seed: int) -> float:
    """Fill the store; the seconds it took."""
    rng = random.Random(seed)
    started = time.perf_counter()
    store = SQLiteStore(str(path), synchronous="OFF")
    await store.open()
    try:
        ops = message_ops(USER, size, rng)
        for other in OTHERS:
            ops += message_ops(other, max(100, size // 10), rng)
        for n in range(0, len(ops), BATCH):
            await store.apply(ops[n:n + BATCH])
    finally:
        await store.close()
    add_graph(path, USER, size, rng)
    with closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA optimize")
    return time.perf_counter() - started


def queries(count: int, size: int, seed: int) -> list[Query]:
    rng = random.Random(seed + 1)
    conversations = max(1, size // PER_CONVERSATION)
    out = []
    for _ in range(count):
        text = sentence(rng, QUERIES)
        known = rng.random() < 0.7
        conv = f"conv-{rng.randrange(conversations)}" if known else f"conv-new-{rng.randrange(10**6)}"
        out.append(Query(text, conv, ("You are a helpful assistant.", sentence(rng, TEMPLATES)), 6,
                         new_conversation=not known))
    return out


def measure_fresh(path: Path, size: int, count: int, seed: int, embeddings: str = "off") -> dict[str, Any]:
    """`measure` in a new process, so its memory figures hold the retrieval path and nothing else."""
    context = get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_measure_here, path, size, count, seed, embeddings).result()


def _measure_here(path: Path, size: int, count: int, seed: int, embeddings: str) -> dict[str, Any]:
    return asyncio.run(measure(path, size, count, seed, embeddings))


async def measure(path: Path, size: int, count: int, seed: int, embeddings: str = "off") -> dict[str, Any]:
    """Time the queries; resident memory once imported, with the store open, at the end, and its peak.

    With `embeddings` on (`local`: the embedded model), every item's vector is filled in first
    (untimed, as memproxy writes them with each item) and each query is embedded and searched too."""
    memory = {"rss_mb_imported": status_mb("self", "VmRSS")}
    store = SQLiteStore(str(path))
    await store.open()
    memory["rss_mb_open"] = status_mb("self", "VmRSS")
    try:
        vectors = None
        if embeddings != "off":
            settings = load_settings(environ={"MEMPROXY_EMBEDDINGS_MODEL": embeddings})
            parts = vector_parts(settings, Upstream(settings.upstream), store, Metrics())
            if parts is None:
                raise RuntimeError(f"embeddings {embeddings!r} could not be set up")
            vectors = parts[0]
            await parts[1].filler.fill_all()
        retrieval = Retrieval(store, MemorySettings(), Metrics(), vectors)
        asked = queries(count, size, seed)
        started = time.perf_counter()
        for query in asked[:20]:  # warm the page cache and the stemmer; the first asks for the user's postings
            with contextlib.suppress(TimeoutError):  # a cold read of a large store may pass the budget
                await retrieval.retrieve(USER, query)
        postings_s = await postings_built(store, started)
        timed = await time_queries(retrieval, asked)
        memory["rss_mb_end"] = status_mb("self", "VmRSS")
        memory["peak_mb"] = status_mb("self", "VmHWM")
    finally:
        await store.close()
    return {"size": size, "queries": count, "postings_s": postings_s, **timed,
            "memory": {k: round(v, 1) for k, v in memory.items()}}


async def time_queries(retrieval: Retrieval, asked: list[Query]) -> dict[str, Any]:
    """Each query's retrieval timed: the mean number of items injected, p50/p95 ms in total and per source."""
    totals: list[float] = []
    per_source: dict[str, list[float]] = {source: [] for source in SOURCES}
    injected = []
    for query in asked:
        started = time.perf_counter()
        result = await retrieval.retrieve(USER, query)
        totals.append((time.perf_counter() - started) * 1000)
        injected.append(result.injected)
        for source, ms in result.log["sources_ms"].items():
            per_source[source].append(ms)
    return {"mean_injected": round(statistics.mean(injected), 2), "total": p50_p95(totals),
            **{source: p50_p95(times) for source, times in per_source.items() if times}}


async def postings_built(store: SQLiteStore, started: float, timeout: float = 300.0) -> float:
    """Seconds from the first query until the user's in-memory postings were built (sqlite/postings.py),
    as on a memproxy that has served the user before: measured retrieval searches them, not FTS5."""
    while not (store.message_indexes.holds(USER.user) and store.entity_indexes.holds(USER.user)):
        if time.perf_counter() - started > timeout:
            raise RuntimeError("the user's postings were not built in time")
        await store.search_messages(USER, ("plan",), limit=1)  # asks again for any dropped meanwhile
        await asyncio.sleep(0.05)
    return round(time.perf_counter() - started, 2)


def median_of_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One row whose every p50 and p95 is the median of that figure over the rounds."""
    row: dict[str, Any] = {"size": rounds[0]["size"], "queries": rounds[0]["queries"], "rounds": len(rounds),
                           "mean_injected": statistics.median(r["mean_injected"] for r in rounds),
                           "postings_s": statistics.median(r["postings_s"] for r in rounds)}
    for column in ("total", *SOURCES):
        if all(column in r for r in rounds):
            row[column] = {p: round(statistics.median(r[column][p] for r in rounds), 3) for p in ("p50", "p95")}
    row["memory"] = {k: round(statistics.median(r["memory"][k] for r in rounds), 1) for k in MEMORY}
    return row


def latency_table(rows: list[dict[str, Any]], lead: list[tuple[Column, str]]) -> str:
    """Per row: the `lead` columns (each with the row's key it shows), then p50 / p95 ms in total and per source."""
    columns = [column for column, _ in lead] + [Column(f"{name}\np50 / p95 ms", 18) for name in ("total", *SOURCES)]

    def cell(row: dict[str, Any], name: str) -> str | None:
        return f"{row[name]['p50']:>8.3f} / {row[name]['p95']:<6.3f}" if name in row else None

    return table(columns, [[row[key] for _, key in lead] + [cell(row, name) for name in ("total", *SOURCES)]
                           for row in rows])


def retrieval_table(rows: list[dict[str, Any]]) -> str:
    return latency_table(rows, [(Column("items", 8), "size"), (Column("build s", 8, ".1f"), "build_s"),
                                (Column("postings s", 10, ".2f"), "postings_s")])


def memory_table(rows: list[dict[str, Any]]) -> str:
    """The measuring process's resident memory, and memproxy's when it served the store."""
    columns = [Column("items", 8),
               *(Column(title, 9, ".1f") for title in ("imported", "open", "end", "peak", "growth")),
               Column("memproxy start", 15, ".1f"), Column("memproxy end", 13, ".1f")]
    values = []
    for row in rows:
        m, streams = row["memory"], row.get("streams", {})
        values.append((row["size"], m["rss_mb_imported"], m["rss_mb_open"], m["rss_mb_end"], m["peak_mb"],
                       m["peak_mb"] - m["rss_mb_imported"], streams.get("server_rss_mb_start"),
                       streams.get("server_rss_mb_end")))
    return ("resident memory, MiB: the measuring process once imported, with the store open, after the queries,"
            " its peak; memproxy serving the store, at start and after the stream run\n" + table(columns, values))


def issue_lines(rows: list[dict[str, Any]]) -> list[Criterion]:
    """Issue 4's lines for the sizes that ran: total latency limits, and no batching of other streams."""
    by_size = {row["size"]: row for row in rows}
    out = []
    for size, which, limit in LIMITS:
        if size in by_size:
            got = by_size[size]["total"][which]
            out.append(Criterion(f"total retrieval {which} <= {limit:g} ms at {size:,} items", got <= limit,
                                 f"{got:.3f} ms"))
    for row in rows:
        if "streams" in row:
            out.append(no_batching(row["size"], row["streams"]))
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000,10000", help="comma-separated message counts (default 1000,10000)")
    p.add_argument("--queries", type=int, default=200, help="timed queries per size")
    p.add_argument("--rounds", type=int, default=1, help="time each size this many times; report the medians")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--embeddings", default="off",
                   help="off (lexical only), local (the embedded model) or a provider's model, as embeddings.model")
    p.add_argument("--keep", type=Path, help="build the stores in this directory and keep them")
    json_option(p)
    p.add_argument("--no-streams", action="store_true", help="skip the streams beside retrieval (no servers)")
    p.add_argument("--stream-seconds", type=float, default=1.0, help="seconds per slice of the stream run")
    p.add_argument("--stream-rounds", type=int, default=3, help="slices of streams alone, and as many beside retrieval")
    p.add_argument("--retrieval-connections", type=int, default=4,
                   help="memory-on connections running retrieval beside the streams")
    return p.parse_args(argv)


def run_size(path: Path, size: int, args: argparse.Namespace, logs: Path | None) -> dict[str, Any]:
    """Build the store unless it exists, time retrieval, then (with `logs`) the streams beside it: one row."""
    built = 0.0
    if not path.exists():
        built = asyncio.run(build(path, size, args.seed))
    rounds = [measure_fresh(path, size, args.queries, args.seed, args.embeddings) for _ in range(max(1, args.rounds))]
    row = median_of_rounds(rounds) if len(rounds) > 1 else rounds[0]
    row["build_s"] = round(built, 1)
    if len(rounds) > 1:
        row["each_round"] = [{"total": r["total"]} for r in rounds]
    print(f"{size} items: total p50 {row['total']['p50']} ms, p95 {row['total']['p95']} ms", file=sys.stderr)
    if logs is not None:
        asks = [Ask(q.text, q.visible, None if q.new_conversation else q.conversation_id)
                for q in queries(args.queries, size, args.seed)]
        load = StreamLoad(args.stream_seconds, args.stream_rounds, args.retrieval_connections)
        row["streams"] = stream_batching(path, USER.user, asks, load, logs)
        print(f"{size} items: {row['streams']['events_per_read']} events per read beside"
              f" {row['streams']['retrievals']} retrievals", file=sys.stderr)
    return row


def main(argv: list[str] | None = None) -> int:
    """Every size; exit 1 when one of the issue's lines fails."""
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    logs = None if args.no_streams else Path(tempfile.mkdtemp(prefix="memproxy-retrieval-"))
    with tempfile.TemporaryDirectory() as scratch:
        where = args.keep or Path(scratch)
        where.mkdir(parents=True, exist_ok=True)
        rows = [run_size(where / f"retrieval-{size}.db", size, args, logs) for size in sizes]
    if logs is not None:
        print(f"server logs in {logs}", file=sys.stderr)
    print(retrieval_table(rows))
    print()
    print(memory_table(rows))
    if not args.no_streams:
        print()
        print(streams_table(rows))
    lines = issue_lines(rows)
    print()
    for line in lines:
        print(line.line())
    if args.json:
        print_json({"retrieval": rows, "lines": [c.as_json() for c in lines]})
    return 0 if all_passed(lines) else 1


if __name__ == "__main__":
    sys.exit(main())
