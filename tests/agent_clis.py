"""The coding-agent CLIs (Claude Code, Codex CLI, Gemini CLI) at the versions pinned in tests/clients/.

`.ci/run` installs them with `npm ci`; on a developer's machine the first test that needs
them runs the same install. Without npm the tests skip with a message, except where
`CI` or `MEMPROXY_REQUIRE_NPM` is set: there a missing CLI is a failure, never a skip.
Each run gets its own empty HOME, no auto-updater, telemetry or other outside traffic,
and a timeout, so a run is deterministic against a local fake upstream.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

CLIENTS = Path(__file__).parent / "clients"
BIN = CLIENTS / "node_modules" / ".bin"
INSTALL_TIMEOUT_S = 600
RUN_TIMEOUT_S = 120
QUIET_ENV = {
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "NO_COLOR": "1",
}


def _required() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("MEMPROXY_REQUIRE_NPM"))


def cli_path(name: str) -> Path:
    """The pinned CLI's executable, installed on first use; skips (or fails in CI) without npm."""
    path = BIN / name
    if path.exists():
        return path
    if shutil.which("npm") is None:
        message = f"npm is not installed, so the {name} CLI test cannot run (install Node.js and npm)"
        if _required():
            pytest.fail(message)
        pytest.skip(message)
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=CLIENTS, check=True,
                   timeout=INSTALL_TIMEOUT_S)
    if not path.exists():
        pytest.fail(f"npm ci in {CLIENTS} did not install {name}")
    return path


@dataclass(frozen=True)
class CliRun:
    """What one non-interactive CLI run printed."""

    returncode: int
    stdout: str
    stderr: str


def run_claude(prompt: str, *, base_url: str, home: Path, workdir: Path, headers: dict[str, str],
               resume: bool = False, allowed_tools: str = "Bash") -> CliRun:
    """`claude -p PROMPT` against `base_url`, with the user named in ANTHROPIC_CUSTOM_HEADERS."""
    args = [str(cli_path("claude")), "-p", prompt, "--allowedTools", allowed_tools]
    if resume:
        args.insert(1, "--continue")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "sk-ant-test-dummy",
        "ANTHROPIC_CUSTOM_HEADERS": "\n".join(f"{name}: {value}" for name, value in headers.items()),
        **QUIET_ENV,
    }
    done = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    return CliRun(done.returncode, done.stdout, done.stderr)


def run_gemini(prompt: str, *, base_url: str, home: Path, workdir: Path, headers: dict[str, str]) -> CliRun:
    """`gemini -p PROMPT` against `base_url` with an API key (the Gemini API, not Google sign-in), a
    trusted workspace for a headless run, and the user named in GEMINI_CLI_CUSTOM_HEADERS."""
    settings = home / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}},
                                    "privacy": {"usageStatisticsEnabled": False},
                                    "general": {"disableAutoUpdate": True}}))
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "GOOGLE_GEMINI_BASE_URL": base_url,
        "GEMINI_API_KEY": "gemini-test-dummy",
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
        "GEMINI_CLI_CUSTOM_HEADERS": ",".join(f"{name}: {value}" for name, value in headers.items()),
        **QUIET_ENV,
    }
    done = subprocess.run([str(cli_path("gemini")), "-p", prompt], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)
    return CliRun(done.returncode, done.stdout, done.stderr)
