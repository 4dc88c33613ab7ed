"""Retrieval latency on PostgreSQL beside SQLite, as one user's memory grows.

The same data as bench/retrieval.py (its generators, the same seed: N messages of one
user in conversations of ten, entities and edges in proportion, other users beside it)
goes into a SQLite file and into a PostgreSQL schema; then the same queries are timed
through `Retrieval.retrieve` on each, p50/p95 per source and in total.

    python bench/retrieval_pg.py [--sizes 10000,100000] [--queries 200] [--store postgresql://...] [--json]

Without --store a throwaway PostgreSQL server is started (tests/pg_server.py: initdb and
pg_ctl in a temporary directory; fsync off, as for tests). With --store, the data goes
into schemas `bench_<size>` of that database and is kept for the next run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncpg  # noqa: E402
import retrieval as lite  # noqa: E402  (bench/retrieval.py: the data and the queries)

from proxy.memory.retrieval.retriever import Retrieval  # noqa: E402
from proxy.metrics import Metrics  # noqa: E402
from proxy.settings import MemorySettings  # noqa: E402
from proxy.stores.base import Store  # noqa: E402
from proxy.stores.postgres.store import PostgresStore  # noqa: E402
from proxy.stores.sqlite.store import SQLiteStore  # noqa: E402
from proxy.stores.indexed_text import entity_terms  # noqa: E402
from harness.report import Column, json_option, print_json  # noqa: E402
from harness.targets import throwaway_postgres  # noqa: E402

WARM_QUERIES = 20


def graph_rows(size: int, rng: random.Random) -> tuple[list[tuple[str, str, str, str]], list[tuple[str, str, str]]]:
    """The entities and edges bench/retrieval.py's add_graph writes, drawn from `rng` the same way."""
    names = sorted({*lite.PEOPLE, *lite.ORGS, *lite.PLACES,
                    *(f"{t.title()} project {n}" for t in lite.TOPICS for n in range(size))})
    names = names[:max(len(lite.PEOPLE) + len(lite.ORGS) + len(lite.PLACES), size // 20)]
    rows = [("me", "Sam Rivera", "user", "the user")]
    for n, name in enumerate(names):
        kind = ("person" if name in lite.PEOPLE else "organization" if name in lite.ORGS
                else "place" if name in lite.PLACES else "project")
        rows.append((f"e{n}", name, kind,
                     f"{name} appears in notes about the {rng.choice(lite.TOPICS)} {rng.choice(lite.WHEN)}"))
    ids = [row[0] for row in rows]
    edges = [("me", "WORKS_AT", "e1"), ("me", "LIVES_IN", "e2")]
    edges += [(rng.choice(ids), rng.choice(["KNOWS", "PART_OF", "LOCATED_IN", "USES"]), rng.choice(ids))
              for _ in range(len(ids) * 2)]
    return rows, edges


async def add_graph(conn: asyncpg.Connection, size: int, rng: random.Random) -> None:
    """The user's graph, as bench/retrieval.py writes it into SQLite."""
    rows, edges = graph_rows(size, rng)
    user, zero = lite.USER.user, lite.START - timedelta(days=1)
    await conn.execute("INSERT INTO users (id, created_at) VALUES ($1, $2) ON CONFLICT DO NOTHING", user, zero)
    await conn.executemany(
        "INSERT INTO entities (id, user_id, name, canonical_name, type, description, name_terms, type_terms,"
        " description_terms, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10)",
        [(eid, user, name, name.casefold(), kind, desc, *entity_terms(name, kind, desc), zero)
         for eid, name, kind, desc in rows])
    await conn.executemany(
        "INSERT INTO relationships (id, user_id, from_id, type, to_id, valid_from, created_at)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7)",
        [(f"r{n}", user, f, t, to, lite.START + timedelta(seconds=n), zero) for n, (f, t, to) in enumerate(edges)])


async def build(url: str, size: int, seed: int) -> float:
    """Fill the schema of `url` as bench/retrieval.py fills a SQLite file; the seconds it took."""
    rng = random.Random(seed)
    started = time.perf_counter()
    store = PostgresStore(url)
    await store.open()
    try:
        ops = lite.message_ops(lite.USER, size, rng)
        for other in lite.OTHERS:
            ops += lite.message_ops(other, max(100, size // 10), rng)
        for n in range(0, len(ops), lite.BATCH):
            await store.apply(ops[n:n + lite.BATCH])
    finally:
        await store.close()
    conn = await asyncpg.connect(url)
    try:
        await add_graph(conn, size, rng)
        await conn.execute("VACUUM ANALYZE")  # what autovacuum does on a live database
    finally:
        await conn.close()
    return time.perf_counter() - started


async def measure(store: Store, size: int, count: int, seed: int) -> dict[str, Any]:
    """Time `count` retrievals of one user on an open store, as bench/retrieval.py does."""
    retrieval = Retrieval(store, MemorySettings(), Metrics())
    asked = lite.queries(count, size, seed)
    for query in asked[:WARM_QUERIES]:
        await retrieval.retrieve(lite.USER, query)
    return {"size": size, "queries": count, **await lite.time_queries(retrieval, asked)}


async def run_backend(store: Store, build_s: float, size: int, args: argparse.Namespace, name: str) -> dict[str, Any]:
    await store.open()
    try:
        row = await measure(store, size, args.queries, args.seed)
    finally:
        await store.close()
    row.update(store=name, build_s=round(build_s, 1))
    print(f"{name} {size} items: total p50 {row['total']['p50']} ms, p95 {row['total']['p95']} ms", file=sys.stderr)
    return row


async def schema_ready(server_url: str, schema: str) -> bool:
    """Create the schema if missing; True when it already held a built store."""
    conn = await asyncpg.connect(server_url)
    try:
        found = await conn.fetchval("SELECT to_regclass($1)", f"{schema}.schema_version")
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        return found is not None
    finally:
        await conn.close()


async def one_size(server_url: str, where: Path, size: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    path = where / f"retrieval-{size}.db"
    built = 0.0 if path.exists() else await lite.build(path, size, args.seed)
    rows = [await run_backend(SQLiteStore(str(path)), built, size, args, "sqlite")]
    schema = f"bench_{size}"
    url = f"{server_url}{'&' if '?' in server_url else '?'}search_path={schema}"
    built = 0.0 if await schema_ready(server_url, schema) else await build(url, size, args.seed)
    rows.append(await run_backend(PostgresStore(url), built, size, args, "postgresql"))
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    return lite.latency_table(rows, [(Column("items", 8), "size"), (Column("store", 10), "store"),
                                     (Column("build s", 8, ".1f"), "build_s")])


@contextmanager
def server_url(given: str | None) -> Iterator[str]:
    """The given PostgreSQL URL, or a throwaway server's for the length of the run."""
    if given:
        yield given
        return
    with throwaway_postgres() as server:
        yield server.url()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10000,100000", help="comma-separated message counts (default 10000,100000)")
    p.add_argument("--queries", type=int, default=200, help="timed queries per size and store")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--store", help="postgresql://... to measure (default: a throwaway local server)")
    p.add_argument("--keep", type=Path, help="build the SQLite files in this directory and keep them")
    json_option(p)
    return p.parse_args(argv)


async def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch, server_url(args.store) as url:
        where = args.keep or Path(scratch)
        where.mkdir(parents=True, exist_ok=True)
        for size in sizes:
            rows += await one_size(url, where, size, args)
    print(table(rows))
    if args.json:
        print_json({"retrieval": rows})


if __name__ == "__main__":
    asyncio.run(main())
