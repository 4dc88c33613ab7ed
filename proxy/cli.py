"""memproxy's command line: serve, export, import, delete, eval."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from proxy.settings import ConfigError, Settings, load_settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memproxy",
        description="OpenAI-compatible reverse proxy that gives any LLM application long-term memory.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="YAML config file")
    serve.add_argument("--host", help="address to listen on (server.host)")
    serve.add_argument("--port", type=int, help="port to listen on (server.port)")
    serve.add_argument("--upstream", help="provider base URL with its /v1 prefix (upstream.base_url)")
    serve.set_defaults(run=_serve)
    return parser


def load(args: argparse.Namespace) -> Settings:
    """Settings from --config, the environment and the command's flags."""
    overrides: dict[str, Any] = {}
    for flag, key in (("host", "server.host"), ("port", "server.port"), ("upstream", "upstream.base_url")):
        value = getattr(args, flag, None)
        if value is not None:
            overrides[key] = value
    return load_settings(getattr(args, "config", None), overrides=overrides)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from proxy import logs
    from proxy.app import create_app

    settings = load(args)
    logs.configure(settings.server.log_level)
    app = create_app(settings)
    uvicorn.run(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_config=None,
        access_log=False,
        server_header=False,  # the provider's headers reach the client, not ours
        date_header=False,
        timeout_graceful_shutdown=int(settings.server.grace_period_s),
        loop="auto",
        http="auto",
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `memproxy` console script."""
    args = _parser().parse_args(argv)
    try:
        return int(args.run(args))
    except ConfigError as exc:
        print(f"memproxy: configuration error: {exc}", file=sys.stderr)
        return 2
