"""`memproxy setup AGENT [--user U] [--url URL] [--mcp] [--project] [--dry-run] [--undo]`.

Every file is read and planned before any is written: a file that cannot be parsed stops
the run with nothing written. A second run with the same flags changes nothing.
"""

from __future__ import annotations

import getpass
import os
import sys
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TextIO

from proxy.agent_setup import AGENT_NAMES
from proxy.agent_setup.agent import Agent, SetupRequest
from proxy.agent_setup.claude_code import ClaudeCode
from proxy.agent_setup.codex import Codex, ProjectUnsupported
from proxy.agent_setup.documents import Unparseable
from proxy.agent_setup.edits import Target, diff, plan
from proxy.agent_setup.gemini_cli import GeminiCli
from proxy.agent_setup.undo import apply, apply_undo, plan_undo, state_dir
from proxy.ids import SCOPE_ID_RULE, is_scope_id
from proxy.settings import Settings

AGENTS: Mapping[str, Agent] = MappingProxyType({agent.name: agent for agent in (ClaudeCode(), Codex(), GeminiCli())})
assert tuple(AGENTS) == AGENT_NAMES, "proxy/agent_setup/__init__.py names the agents for the command line's help"
_ANY_ADDRESS = ("0.0.0.0", "::", "")


class SetupError(ValueError):
    """A flag or a file setup cannot work with; nothing was written."""


def default_url(settings: Settings) -> str:
    """memproxy's root URL from server.host and server.port (a wildcard address is reached on loopback)."""
    host = settings.server.host
    host = "127.0.0.1" if host in _ANY_ADDRESS else f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.server.port}"


def root_url(text: str) -> str:
    """--url checked: http(s)://host[:port] and no path."""
    parts = urllib.parse.urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/") \
            or parts.query or parts.fragment:
        raise SetupError(f"--url must be memproxy's root URL with no path, e.g. http://127.0.0.1:8080 (got {text!r})")
    return f"{parts.scheme}://{parts.netloc}"


def user_id(given: str | None) -> str:
    """--user, or the login name when it is a valid id."""
    user = given if given is not None else getpass.getuser()
    if not is_scope_id(user):
        flag = "--user" if given is not None else "--user is required: the login name is no valid id, and it"
        raise SetupError(f"{flag} must be {SCOPE_ID_RULE} (got {user!r})")
    return user


def run(agent_name: str, settings: Settings, *, user: str | None, url: str | None, mcp: bool, project: bool,
        dry_run: bool, undo: bool, out: TextIO | None = None) -> int:
    """The command; 0 when done (or nothing to do), 1 when the auth mode leaves the agent's keys to the user."""
    agent = AGENTS[agent_name]
    out = out or sys.stdout
    home = Path(os.path.expanduser("~"))
    root = root_url(url) if url is not None else default_url(settings)
    if not undo and settings.auth.mode in ("api-keys", "signed"):
        print(f"memproxy setup: {agent.instead(settings.auth.mode, root)}\nNothing was written.", file=sys.stderr)
        return 1
    request = SetupRequest(user="-" if undo else user_id(user), url=root, mcp=mcp or undo, project=project,
                           env=os.environ, home=home, cwd=Path.cwd())
    try:
        targets = agent.targets(request)
    except ProjectUnsupported as exc:
        raise SetupError(str(exc)) from None
    directory = state_dir(os.environ, home)
    try:
        return _undo(targets, directory, dry_run, out) if undo else _setup(agent, request, targets, directory,
                                                                             dry_run, out)
    except Unparseable as exc:
        raise SetupError(f"{exc}; nothing was written") from None


def _setup(agent: Agent, request: SetupRequest, targets: list[Target], directory: Path, dry_run: bool,
           out: TextIO) -> int:
    edits = [plan(target) for target in targets]
    for note in (note for edit in edits for note in edit.notes):
        print(note, file=out)
    changing = [edit for edit in edits if edit.changes_file]
    if not changing:
        print(f"{agent.name} already goes through memproxy at {request.url} as {request.user}: nothing to change",
              file=out)
        return 0
    if dry_run:
        for edit in changing:
            out.write(diff(edit))
        print("(dry run: nothing was written)", file=out)
        return 0
    try:
        apply(changing, directory, agent.name)
    except OSError as exc:
        raise SetupError(f"cannot write {exc.filename or directory}: {exc.strerror or exc}; nothing was written"
                         ) from None
    for edit in changing:
        print(f"{'created' if edit.before is None else 'updated'} {edit.target.path}", file=out)
    print(f"{agent.name} now goes through memproxy at {request.url} as {request.user}; "
          f"`memproxy setup {agent.name}{' --project' if request.project else ''} --undo` takes it back", file=out)
    return 0


def _undo(targets: list[Target], directory: Path, dry_run: bool, out: TextIO) -> int:
    undos = [plan_undo(target, directory) for target in targets]
    found = [undo for undo in undos if undo.found]
    if not found:
        print("nothing to undo: setup has not changed these files", file=out)
        return 0
    for undo in found:
        for note in undo.notes:
            print(note, file=out)
        what = "" if undo.before is None else "remove" if undo.after is None else "restore"
        if dry_run:
            if what:
                print(f"would {what} {undo.path}", file=out)
            continue
        apply_undo(undo)
        if what:
            print(f"{what}d {undo.path}" if what == "remove" else f"restored {undo.path}", file=out)
    if dry_run:
        print("(dry run: nothing was written)", file=out)
    return 0
