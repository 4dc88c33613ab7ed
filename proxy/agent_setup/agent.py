"""What an agent module provides, and what it is given: one module per agent, named in command.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from proxy.agent_setup.edits import Target


@dataclass(frozen=True)
class SetupRequest:
    """One run of `memproxy setup AGENT`."""

    user: str
    url: str  # memproxy's root URL, no path, no trailing slash
    mcp: bool  # also register memproxy's MCP server
    project: bool  # the project's files (the working directory's) instead of the user's
    env: Mapping[str, str]
    home: Path
    cwd: Path


class Agent(Protocol):
    """A coding agent whose configuration setup writes."""

    name: str

    def targets(self, request: SetupRequest) -> list[Target]:
        """The files to edit and the keys to set (with `request.mcp`, the MCP server's too)."""

    def instead(self, mode: str, url: str) -> str:
        """In auth.mode `api-keys` or `signed`: what the agent must send instead (setup writes nothing)."""
