"""Codex CLI: a `memproxy` model provider in `config.toml`, made the default (docs/clients-codex.md).

The file is `$CODEX_HOME/config.toml` (default `~/.codex/config.toml`), edited with tomlkit
so its comments and the rest of its formatting stay. With --mcp, `[mcp_servers.memproxy]`
too. Codex has no project-level provider setting, so --project is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.agent_setup.agent import SetupRequest
from proxy.agent_setup.edits import Change, Target

HEADER = "X-Memory-User"
PROVIDER = ("model_providers", "memproxy")


class ProjectUnsupported(ValueError):
    """The agent has no project-level file for this."""


class Codex:
    name = "codex"

    def targets(self, request: SetupRequest) -> list[Target]:
        if request.project:
            raise ProjectUnsupported("Codex reads its model provider from CODEX_HOME only; run without --project")
        config = Path(request.env.get("CODEX_HOME") or request.home / ".codex") / "config.toml"
        values: list[tuple[str, Any]] = [("name", "memproxy"), ("base_url", f"{request.url}/v1"),
                                         ("wire_api", "responses"), ("env_key", "OPENAI_API_KEY"),
                                         ("supports_websockets", False)]
        changes = [Change(("model_provider",), lambda _: "memproxy", announce=True),
                   *(Change((*PROVIDER, key), _const(value), announce=key == "base_url") for key, value in values),
                   Change((*PROVIDER, "http_headers"), lambda old: with_header(old, request.user))]
        if request.mcp:
            # The server is replaced whole: an earlier stdio server's `command` beside `url` is
            # a server Codex refuses to load.
            server = {"url": f"{request.url}/mcp", "http_headers": {HEADER: request.user}}
            changes.append(Change(("mcp_servers", "memproxy"), _const(server), announce=True))
        return [Target(config, "toml", tuple(changes))]

    def instead(self, mode: str, url: str) -> str:
        if mode == "api-keys":
            return ("memproxy runs with auth.mode: api-keys, so Codex must send the user's memproxy key, which setup "
                    "does not write into files: in config.toml, [model_providers.memproxy] with "
                    f"base_url = \"{url}/v1\", wire_api = \"responses\" and env_key naming a variable that holds the "
                    "memproxy key (memproxy calls the provider with upstream.api_key), and model_provider = "
                    "\"memproxy\".")
        return ("memproxy runs with auth.mode: signed, so every request of Codex needs a fresh X-Memory-Scope-Token "
                "(an HS256 token that expires), which config.toml cannot hold: use [model_providers.memproxy] with "
                f"base_url = \"{url}/v1\" and env_http_headers = {{ \"X-Memory-Scope-Token\" = \"<a variable your "
                "token issuer fills>\" }}.")


def _const(value: Any) -> Any:
    return lambda _: value


def with_header(old: Any, user: str) -> dict[str, Any]:
    """The provider's http_headers with X-Memory-User set, every other header kept."""
    headers = {k: v for k, v in old.items() if k.lower() != HEADER.lower()} if isinstance(old, dict) else {}
    return {**headers, HEADER: user}
