"""Gemini CLI: its base URL and the user header in the `.env` file it loads, the Gemini API key
chosen in its settings, and with --mcp its MCP server list (docs/clients-gemini-cli.md).

Gemini CLI takes its base URL and extra headers only from environment variables
(GOOGLE_GEMINI_BASE_URL, GEMINI_CLI_CUSTOM_HEADERS); it loads them itself from
`~/.gemini/.env` (`~` being GEMINI_CLI_HOME when set) in a folder it trusts, so no shell
profile is touched. User scope: `~/.gemini/.env` and `~/.gemini/settings.json`. Project scope
(--project): the project's `.gemini/.env` and `.gemini/settings.json`. The user's API key is
never written: GEMINI_API_KEY stays theirs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from proxy.agent_setup.agent import SetupRequest
from proxy.agent_setup.edits import Change, Target

HEADER = "X-Memory-User"
# GEMINI_CLI_CUSTOM_HEADERS is `Name: value` pairs split at a comma that starts the next pair.
_NEXT_HEADER = re.compile(r",(?=\s*[^,:]+:)")


class GeminiCli:
    name = "gemini-cli"

    def targets(self, request: SetupRequest) -> list[Target]:
        folder = (request.cwd if request.project
                  else Path(request.env.get("GEMINI_CLI_HOME") or request.home)) / ".gemini"
        found = [Target(folder / ".env", "env", (
            Change(("GOOGLE_GEMINI_BASE_URL",), lambda _: request.url, announce=True),
            Change(("GEMINI_CLI_CUSTOM_HEADERS",), lambda old: with_header(old, HEADER, request.user)),
        ))]
        # memproxy serves the Gemini API with an API key; a Google sign-in goes to other hosts.
        changes = [Change(("security", "auth", "selectedType"), lambda _: "gemini-api-key", announce=True)]
        if request.mcp:
            server = {"httpUrl": f"{request.url}/mcp", "headers": {HEADER: request.user}}
            changes.append(Change(("mcpServers", "memproxy"), lambda _: server, announce=True))
        # Gemini CLI reads settings.json with its comments stripped: they are allowed, and kept.
        found.append(Target(folder / "settings.json", "jsonc", tuple(changes)))
        return found

    def instead(self, mode: str, url: str) -> str:
        if mode == "api-keys":
            return ("memproxy runs with auth.mode: api-keys, so Gemini CLI must send the user's memproxy key, "
                    f"which setup does not write into files: set GOOGLE_GEMINI_BASE_URL={url} and GEMINI_API_KEY=<the "
                    "memproxy key> (Gemini CLI sends it as x-goog-api-key; memproxy calls Google with "
                    "upstream.gemini_api_key), with security.auth.selectedType \"gemini-api-key\" in "
                    "~/.gemini/settings.json. For MCP: mcpServers.memproxy with httpUrl "
                    f"\"{url}/mcp\" and headers {{\"Authorization\": \"Bearer <the memproxy key>\"}}.")
        return ("memproxy runs with auth.mode: signed, so every request of Gemini CLI needs a fresh "
                "X-Memory-Scope-Token (an HS256 token that expires), which a settings file cannot hold: set "
                f"GOOGLE_GEMINI_BASE_URL={url} and put the token in GEMINI_CLI_CUSTOM_HEADERS "
                "(\"X-Memory-Scope-Token: <token>\") from whatever issues tokens.")


def with_header(old: Any, name: str, value: str) -> str:
    """GEMINI_CLI_CUSTOM_HEADERS (`Name: value` pairs, comma-separated) with `name` set, every
    other header kept."""
    pairs = [pair.strip() for pair in _NEXT_HEADER.split(old)] if isinstance(old, str) and old.strip() else []
    pair = f"{name}: {value}"
    named = [i for i, text in enumerate(pairs) if text.split(":", 1)[0].strip().lower() == name.lower()]
    if not named:
        return ", ".join([*pairs, pair])
    pairs[named[0]] = pair
    return ", ".join(text for i, text in enumerate(pairs) if i not in named[1:])
