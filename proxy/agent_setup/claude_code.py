"""Claude Code: `env` in its settings, and with --mcp its MCP server list (docs/clients-claude-code.md).

User scope: `settings.json` and `.claude.json` under CLAUDE_CONFIG_DIR when it is set, else
`~/.claude/settings.json` and `~/.claude.json`. Project scope (--project): the project's
`.claude/settings.local.json` (not checked in) and `.mcp.json`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.agent_setup.agent import SetupRequest
from proxy.agent_setup.edits import Change, Target

HEADER = "X-Memory-User"


class ClaudeCode:
    name = "claude-code"

    def targets(self, request: SetupRequest) -> list[Target]:
        configured = request.env.get("CLAUDE_CONFIG_DIR")
        settings = (request.cwd / ".claude" / "settings.local.json" if request.project
                    else Path(configured or request.home / ".claude") / "settings.json")
        found = [Target(settings, "json", (
            Change(("env", "ANTHROPIC_BASE_URL"), lambda _: request.url, announce=True),
            Change(("env", "ANTHROPIC_CUSTOM_HEADERS"), lambda old: with_header(old, HEADER, request.user)),
        ))]
        if request.mcp:
            servers = (request.cwd / ".mcp.json" if request.project
                       else Path(configured or request.home) / ".claude.json")
            server = {"type": "http", "url": f"{request.url}/mcp", "headers": {HEADER: request.user}}
            change = Change(("mcpServers", "memproxy"), lambda _: server, announce=True)
            found.append(Target(servers, "json", (change,)))
        return found

    def instead(self, mode: str, url: str) -> str:
        if mode == "api-keys":
            return (f"memproxy runs with auth.mode: api-keys, so Claude Code must send the user's memproxy key, which "
                    f"setup does not write into files: set ANTHROPIC_BASE_URL={url} and ANTHROPIC_API_KEY=<the "
                    "memproxy key> (Claude Code sends it as x-api-key; memproxy calls Anthropic with "
                    "upstream.anthropic_api_key). For MCP: claude mcp add --transport http memproxy "
                    f"{url}/mcp --header \"Authorization: Bearer <the memproxy key>\".")
        return ("memproxy runs with auth.mode: signed, so every request of Claude Code needs a fresh "
                "X-Memory-Scope-Token (an HS256 token that expires), which a settings file cannot hold: set "
                f"ANTHROPIC_BASE_URL={url} and put the token in ANTHROPIC_CUSTOM_HEADERS "
                "(\"X-Memory-Scope-Token: <token>\") from whatever issues tokens.")


def with_header(old: Any, name: str, value: str) -> str:
    """ANTHROPIC_CUSTOM_HEADERS (one `Name: value` a line) with `name` set, every other header kept."""
    lines = old.split("\n") if isinstance(old, str) and old else []
    line = f"{name}: {value}"
    named = [i for i, text in enumerate(lines) if text.split(":", 1)[0].strip().lower() == name.lower()]
    if not named:
        return "\n".join([*lines, line])
    lines[named[0]] = line
    return "\n".join(text for i, text in enumerate(lines) if i not in named[1:])
