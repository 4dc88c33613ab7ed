"""memproxy's command line: serve, setup, demo, export, import, delete, reindex, eval."""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from proxy.agent_setup import AGENT_NAMES
from proxy.errors import ProxyError
from proxy.settings import ConfigError, Settings, load_settings, require_hash_key
from proxy.stores.base import StoreError
from proxy.stores.reindex_terms import REINDEX_BATCH

# `memproxy reindex --terms` tells how far it is at most this often (and when each table is done).
PROGRESS_EVERY_S = 5.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memproxy",
        description="OpenAI-compatible reverse proxy that gives any LLM application long-term memory.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", default=os.environ.get("MEMPROXY_CONFIG"),
                       help="YAML config file (default: $MEMPROXY_CONFIG)")
    serve.add_argument("--host", help="address to listen on (server.host)")
    serve.add_argument("--port", type=int, help="port to listen on (server.port)")
    serve.add_argument("--upstream", help="provider base URL with its /v1 prefix (upstream.base_url)")
    serve.add_argument("--workers", type=_positive,
                       help="worker processes sharing the port and the store (server.workers)")
    serve.set_defaults(run=_serve)

    demo = commands.add_parser("demo", help="see memory work with no provider key: memproxy in front of a"
                               " built-in echo provider, a fact told and asked about")
    demo.add_argument("--port", type=int, default=8080, help="port memproxy listens on (default 8080)")
    demo.add_argument("--serve", action="store_true", help="after the tour, keep serving until Ctrl-C")
    demo.set_defaults(run=_demo)

    export = commands.add_parser("export", help="write a user's memory as JSON Lines to stdout")
    export.add_argument("--user", required=True, help="the user id")
    export.add_argument("--config", default=os.environ.get("MEMPROXY_CONFIG"), help="YAML config file")
    export.set_defaults(run=_export)

    importer = commands.add_parser("import", help="read JSON Lines (as export writes them) into a user")
    importer.add_argument("file", metavar="FILE", help="the JSON Lines file, or - for stdin")
    importer.add_argument("--user", required=True, help="the user id to import into")
    importer.add_argument("--config", default=os.environ.get("MEMPROXY_CONFIG"), help="YAML config file")
    importer.set_defaults(run=_import)

    delete = commands.add_parser("delete", help="delete everything memproxy holds about a user")
    delete.add_argument("--user", required=True, help="the user id")
    delete.add_argument("--config", default=os.environ.get("MEMPROXY_CONFIG"), help="YAML config file")
    delete.set_defaults(run=_delete)

    reindex = commands.add_parser("reindex", help="compute every missing embedding for embeddings.model,"
                                  " or (--terms) every item's search terms")
    reindex.add_argument("--terms", action="store_true",
                         help="make the search terms of every saved item again with this memproxy's tokeniser"
                              " (items saved by an older one), instead of the embeddings")
    reindex.add_argument("--batch", type=_positive, default=REINDEX_BATCH,
                         help=f"with --terms: items per transaction (default {REINDEX_BATCH})")
    reindex.add_argument("--user", help="only this user's items (default: every user)")
    reindex.add_argument("--config", default=os.environ.get("MEMPROXY_CONFIG"), help="YAML config file")
    reindex.set_defaults(run=_reindex)

    setup = commands.add_parser("setup", help="point a coding agent at memproxy: write its own settings "
                                "(docs/clients-claude-code.md, docs/clients-codex.md, docs/clients-gemini-cli.md)")
    setup.add_argument("agent", choices=AGENT_NAMES, help="the agent to set up")
    setup.add_argument("--user", help="the user id memory is kept under (default: your login name)")
    setup.add_argument("--url", help="memproxy's root URL, no path (default: from server.host and server.port)")
    setup.add_argument("--mcp", action="store_true", help="also register memproxy's MCP server (docs/mcp.md)")
    setup.add_argument("--project", action="store_true",
                       help="the project's files: Claude Code's .claude/settings.local.json and .mcp.json, "
                       "Gemini CLI's .gemini/.env and .gemini/settings.json")
    setup.add_argument("--dry-run", action="store_true", help="print the change (keys masked), write nothing")
    setup.add_argument("--undo", action="store_true", help="remove what setup added, restore what it replaced")
    setup.add_argument("--config", default=os.environ.get("MEMPROXY_CONFIG"), help="YAML config file")
    setup.set_defaults(run=_setup)

    evaluate = commands.add_parser("eval", help="run a retrieval benchmark")
    benchmarks = evaluate.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    locomo = benchmarks.add_parser("locomo", help="LoCoMo retrieval: turn recall@k through the whole memory path")
    locomo.add_argument("--data", required=True, help="the LoCoMo JSON file, e.g. snap-research/locomo's"
                        " data/locomo10.json (docs/evaluation.md)")
    locomo.add_argument("--k", type=int, default=10, help="memories per question, max_memories (1-12; default 10)")
    locomo.add_argument("--sample", action="append", metavar="ID",
                        help="only this conversation (sample_id, e.g. conv-30); repeat for more")
    locomo.add_argument("--json", action="store_true", help="end with one JSON object of the figures on stdout")
    locomo.add_argument("--config", default=os.environ.get("MEMPROXY_CONFIG"), help="YAML config file")
    locomo.set_defaults(run=_eval_locomo)
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def load(args: argparse.Namespace) -> Settings:
    """Settings from --config, the environment and the command's flags."""
    overrides: dict[str, Any] = {}
    for flag, key in (("host", "server.host"), ("port", "server.port"), ("workers", "server.workers"),
                      ("upstream", "upstream.base_url")):
        value = getattr(args, flag, None)
        if value is not None:
            overrides[key] = value
    return load_settings(getattr(args, "config", None), overrides=overrides)


def _serve(args: argparse.Namespace) -> int:
    from proxy import logs
    from proxy.http.connections import ConnectionGuard, GuardedHttpProtocol, max_client_connections

    settings = load(args)
    require_hash_key(settings.store)  # before any worker starts: each would stop on it
    logs.configure(settings.server.log_level)
    _announce(settings)
    guard = ConnectionGuard(max_client_connections(settings), settings.server.header_timeout_s,
                            settings.server.max_header_bytes)
    options: dict[str, Any] = dict(
        host=settings.server.host,
        port=settings.server.port,
        log_config=None,
        access_log=False,
        server_header=False,  # the provider's headers reach the client, not ours
        date_header=False,
        timeout_graceful_shutdown=settings.server.grace_period_s,  # a float works
        loop="auto",
        # uvicorn only calls it, as it would a protocol class: the guard rides in with it
        # (each worker gets its own copy: the cap is per process).
        http=functools.partial(GuardedHttpProtocol, guard=guard),
    )
    if settings.server.workers > 1:
        from proxy.workers import serve_workers

        return serve_workers(settings, options)
    return _serve_alone(settings, options)


def _serve_alone(settings: Settings, options: dict[str, Any]) -> int:
    """One process serves: this one."""
    import uvicorn

    from proxy.app import create_app

    app = create_app(settings, own_process=True)
    # uvicorn shuts down gracefully on SIGTERM or SIGINT, then raises the signal again
    # under the handler it found at start: a no-op one makes a finished shutdown exit 0
    # (an orchestrator reads 0 as a clean stop) instead of dying of the signal (143) or a KeyboardInterrupt.
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, lambda *_: None)
    uvicorn.run(app, **options)
    return 0


def _announce(settings: Settings) -> None:
    """One line at start-up: where memproxy listens, where it forwards, where memory lives, how many
    processes serve."""
    import logging

    logging.getLogger("memproxy").info("memproxy starting", extra={
        "listen": f"{settings.server.host}:{settings.server.port}",
        "upstream": settings.upstream.base_url,
        "store": settings.store.where(),
        "workers": settings.server.workers,
    })


def _demo(args: argparse.Namespace) -> int:
    import asyncio

    from proxy.demo.tour import run

    for stop in (signal.SIGTERM, signal.SIGINT):  # as serve: a stop after the shutdown exits 0
        signal.signal(stop, lambda *_: None)
    asyncio.run(run(args.port, args.serve, lambda text: print(text, flush=True)))
    return 0


def _export(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from proxy.app import open_store
    from proxy.models import Scope
    from proxy.identity.scope import valid_id

    settings = load(args)
    scope = Scope(user=valid_id(args.user, "--user"))
    sqlite_file = settings.store.sqlite_path
    if sqlite_file is not None and not sqlite_file.is_file():
        # Opening it would create an empty database, and the export would pass for one of a user with nothing.
        print(f"memproxy: no database at {sqlite_file} (check --config or store.url)", file=sys.stderr)
        return 1

    async def run() -> int:
        store = open_store(settings.store)
        await store.open()
        written = 0
        try:
            async for record in store.export(scope):
                sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")
                written += 1
        finally:
            await store.close()
        return written

    if asyncio.run(run()) == 0:
        print(f"memproxy: nothing stored for user {args.user!r} in {settings.store.where()}", file=sys.stderr)
        return 1
    return 0


def _setup(args: argparse.Namespace) -> int:
    from proxy.agent_setup.command import SetupError, run

    try:
        return run(args.agent, load(args), user=args.user, url=args.url, mcp=args.mcp, project=args.project,
                   dry_run=args.dry_run, undo=args.undo)
    except SetupError as exc:
        print(f"memproxy setup: {exc}", file=sys.stderr)
        return 2


def _eval_locomo(args: argparse.Namespace) -> int:
    import asyncio

    from proxy.evaluation import locomo, report, runner

    settings = load(args)
    try:
        samples = locomo.select(locomo.load(args.data), args.sample)
        progress = report.progress_for(sys.stderr, args.json)
        summary = asyncio.run(runner.run(samples, settings, args.k, progress))
    except (locomo.DataError, runner.BenchmarkError) as exc:
        print(f"memproxy: {exc}", file=sys.stderr)
        return 2
    figures = summary.as_dict()
    print(report.as_json(figures) if args.json else report.table(figures))
    return 0


def _on_store(args: argparse.Namespace, work: Callable[[Any, Any], Awaitable[Any]]) -> Any:
    """Run `work(store, scope)` on the configured store, for the user named by --user (None without one)."""
    import asyncio

    from proxy.app import open_store
    from proxy.models import Scope
    from proxy.identity.scope import valid_id

    settings = load(args)
    scope = None if args.user is None else Scope(user=valid_id(args.user, "--user"))

    async def run() -> Any:
        store = open_store(settings.store)
        await store.open()
        try:
            return await work(store, scope)
        finally:
            await store.close()

    return asyncio.run(run())


def _import(args: argparse.Namespace) -> int:
    import json

    from proxy.api.jsonl import parse_lines

    if args.file == "-":
        data = sys.stdin.buffer.read()
    else:
        with open(args.file, "rb") as handle:
            data = handle.read()
    records = parse_lines(data)
    counts = _on_store(args, lambda store, scope: store.import_records(scope, records))
    print(json.dumps(counts))
    return 0


def _delete(args: argparse.Namespace) -> int:
    import json

    counts = _on_store(args, lambda store, scope: store.delete_user(scope))
    print(json.dumps({"user": args.user, "deleted": counts}))
    return 0


def _reindex(args: argparse.Namespace) -> int:
    if args.terms:
        return _reindex_terms(args)
    import asyncio
    import json

    from proxy.app import open_store
    from proxy.calls.embeddings import embeddings_caller
    from proxy.memory.vectors.filler import FillCounts, Filler
    from proxy.memory.vectors.embedder import EmbeddingFailed
    from proxy.identity.scope import valid_id
    from proxy.http.upstream import Upstream

    settings = load(args)
    user = valid_id(args.user, "--user") if args.user is not None else None
    if settings.embeddings.model == "off":
        print("memproxy: reindex needs embeddings on (embeddings.model is off)", file=sys.stderr)
        return 2

    async def run() -> int:
        upstream = Upstream(settings.upstream)
        store = open_store(settings.store)
        counts = FillCounts()
        embed = None
        try:
            embed = embeddings_caller(settings, upstream)
            if embed is None:
                print("memproxy: reindex needs the embedded model installed (embeddings.model: local) or a key of "
                      "memproxy's own for a provider's model: embeddings.api_key or upstream.api_key", file=sys.stderr)
                return 2
            await store.open()
            e = settings.embeddings
            filler = Filler(store, embed, embed.model, batch=e.batch_size, timeout_s=e.timeout_s)
            await filler.fill_all(user=user, counts=counts)
        except EmbeddingFailed as exc:
            print(f"memproxy: the embeddings endpoint failed: {exc}; run reindex again to go on", file=sys.stderr)
            return 1
        finally:
            if embed is not None:  # what was saved, also when the endpoint failed part way
                print(json.dumps({"model": embed.model, "user": user, "embedded": counts.saved,
                                  "skipped": counts.skipped}))
            await store.close()
            await upstream.aclose()
        return 0

    return asyncio.run(run())


def _reindex_terms(args: argparse.Namespace) -> int:
    import json
    import time

    from proxy.stores.reindex_terms import TermsCounts, reindex_all

    counts = TermsCounts()
    shown = time.monotonic()

    def progress(table: str, done: bool) -> None:
        nonlocal shown
        if done or time.monotonic() - shown >= PROGRESS_EVERY_S:
            shown = time.monotonic()
            state = "done" if done else "so far"
            print(f"memproxy: {table}: {counts.read[table]} read, {counts.reindexed[table]} re-indexed ({state})",
                  file=sys.stderr, flush=True)

    try:
        _on_store(args, lambda store, scope: reindex_all(store, counts, user=None if scope is None else scope.user,
                                                         batch=args.batch, on_batch=progress))
    finally:  # what was done, also when the store failed part way (run again: what is current is not rewritten)
        print(json.dumps({"user": args.user, "reindexed": counts.reindexed,
                          "unchanged": {t: counts.read[t] - counts.reindexed[t] for t in counts.read}}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `memproxy` console script."""
    args = _parser().parse_args(argv)
    try:
        return int(args.run(args))
    except ConfigError as exc:
        print(f"memproxy: configuration error: {exc}", file=sys.stderr)
        return 2
    except ProxyError as exc:
        print(f"memproxy: {exc.message}", file=sys.stderr)
        return 2
    except StoreError as exc:
        print(f"memproxy: store error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"memproxy: {exc.filename or ''}: {exc.strerror}", file=sys.stderr)
        return 1
