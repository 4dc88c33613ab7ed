"""The pinned CLIs (tests/clients) against memproxy's MCP endpoint and after `memproxy setup`:
Claude Code calls the memory tool over MCP; a bare `claude -p`, `codex exec` and `gemini -p` in a
fresh HOME go through memproxy once setup has written their settings; `--undo` gives the files back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent_clis import QUIET_ENV, RUN_TIMEOUT_S, cli_path
from tests.fake_anthropic import stream as messages_stream
from tests.fake_gemini import answer, gemini_requests, pieces, sse
from tests.fake_responses import output, stream as responses_stream
from tests.fake_upstream import JsonReply, Received, Reply, SSEReply

FACT = "My dog's name is Biscuit-7731"
QUESTION = "what is my dog's name?"
HEADER = "Relevant long-term memory about this user"


@pytest.fixture
def mem(make_proxy, fake):
    proxy = make_proxy(upstream__anthropic_base_url=fake.url, extraction__from_roles=[])
    stored = httpx.post(proxy.url + "/memory/v1/users/alice/memories", json={"content": FACT, "type": "fact"})
    assert stored.status_code == 201
    return proxy


def run(args: list[str], home: Path, workdir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    workdir.mkdir(exist_ok=True)
    done = subprocess.run(args, cwd=workdir, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          stdin=subprocess.DEVNULL,
                          env={"PATH": os.environ.get("PATH", ""), "HOME": str(home), "NO_PROXY": "127.0.0.1",
                               **QUIET_ENV, **env})
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    return done


def setup(home: Path, *args: str) -> str:
    return run([sys.executable, "-m", "proxy", "setup", *args], home, home).stdout


def texts(body: dict[str, Any]) -> str:
    return json.dumps(body)


def test_claude_calls_the_mcp_tool_and_gets_the_stored_fact(mem, fake, tmp_path):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"memproxy": {
        "type": "http", "url": mem.url + "/mcp", "headers": {"X-Memory-User": "alice"}}}}))
    tool = {"id": "toolu_01", "name": "mcp__memproxy__query_memory", "input": {"query": "dog's name"}}
    fake.queue(SSEReply(messages_stream("Let me look.", tool_uses=[tool])), SSEReply(messages_stream("Biscuit-7731.")))
    (tmp_path / "home").mkdir()
    # The model calls go through memproxy with no user (a pure pass-through, no block): the fact
    # can only come from the tool.
    done = run([str(cli_path("claude")), "-p", QUESTION, "--mcp-config", str(config),
                "--allowedTools", "mcp__memproxy__query_memory"], tmp_path / "home", tmp_path / "work",
               ANTHROPIC_BASE_URL=mem.url, ANTHROPIC_API_KEY="sk-ant-test-dummy")
    assert "Biscuit-7731." in done.stdout
    first, second = fake.messages_requests()
    offered = [t["name"] for t in first.json()["tools"] if t["name"].startswith("mcp__memproxy__")]
    assert offered == ["mcp__memproxy__query_memory", "mcp__memproxy__store_memory"]
    assert HEADER not in texts(first.json())
    (result,) = [b for m in second.json()["messages"] if isinstance(m["content"], list) for b in m["content"]
                 if b.get("type") == "tool_result"]
    assert result["tool_use_id"] == "toolu_01"
    assert result["content"][0]["text"].endswith(f"\n1. [long-term] {FACT}")


@pytest.fixture
def claude_home(tmp_path) -> Path:
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    (home / ".claude" / "settings.json").write_bytes(b'{\n\t"cleanupPeriodDays": 30\n}')
    return home


def test_after_setup_a_bare_claude_goes_through_memproxy_and_undo_gives_the_file_back(claude_home, mem, fake):
    home = claude_home
    settings = home / ".claude" / "settings.json"
    original = settings.read_bytes()
    assert "updated" in setup(home, "claude-code", "--user", "alice", "--url", mem.url)
    done = run([str(cli_path("claude")), "-p", QUESTION], home, home / "work", ANTHROPIC_API_KEY="sk-ant-test-dummy")
    assert "Hello from Claude" in done.stdout
    (request,) = fake.messages_requests()
    assert f"[long-term] {FACT}" in texts(request.json())
    assert "restored" in setup(home, "claude-code", "--undo")
    assert settings.read_bytes() == original


def test_after_setup_a_bare_codex_exec_goes_through_memproxy_and_undo_gives_the_file_back(mem, fake, tmp_path):
    home = tmp_path / "home"
    config = home / ".codex" / "config.toml"
    config.parent.mkdir(parents=True)
    original = b'# mine\nmodel = "gpt-test"  # keep\n\n[profiles.x]\nmodel = "other"\n'
    config.write_bytes(original)
    assert "updated" in setup(home, "codex", "--user", "alice", "--url", mem.url)
    fake.queue(SSEReply(responses_stream(output("Your dog is Biscuit-7731."), "resp_1")))
    done = run([str(cli_path("codex")), "exec", "--skip-git-repo-check", QUESTION], home, home / "work",
               OPENAI_API_KEY="sk-dummy", NO_COLOR="1")
    assert "Biscuit-7731" in done.stdout
    (request,) = fake.responses_requests()
    assert request.header("x-memory-user") is None  # memproxy's own header never goes upstream
    assert f"[long-term] {FACT}" in texts(request.json())
    assert "restored" in setup(home, "codex", "--undo")
    assert config.read_bytes() == original


@pytest.mark.parametrize("providers", [
    b'model_providers.openrouter.base_url = "https://openrouter.ai/api/v1"\nmodel_providers.openrouter.name = "OpenRouter"\n',
    b'model_providers = { local = { name = "Local", base_url = "http://localhost:11434/v1" } }\n'],
    ids=["dotted-keys", "inline-table"])
def test_after_setup_codex_with_another_provider_in_tomls_other_spellings_goes_through_memproxy(mem, fake, tmp_path,
                                                                                                providers):
    home = tmp_path / "home"
    config = home / ".codex" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_bytes(b'model = "gpt-test"\n' + providers)
    assert "now goes through memproxy" in setup(home, "codex", "--user", "alice", "--url", mem.url)
    fake.queue(SSEReply(responses_stream(output("Your dog is Biscuit-7731."), "resp_1")))
    # Codex's built-in provider is pointed at the upstream itself: a request that bypassed memproxy
    # would reach it without memory.
    run([str(cli_path("codex")), "exec", "--skip-git-repo-check", QUESTION], home, home / "work",
        OPENAI_API_KEY="sk-dummy", OPENAI_BASE_URL=fake.url, NO_COLOR="1")
    (request,) = fake.responses_requests()
    assert f"[long-term] {FACT}" in texts(request.json())


def test_setup_codex_mcp_over_an_earlier_stdio_memproxy_server_leaves_a_config_codex_loads(mem, fake, tmp_path):
    home = tmp_path / "home"
    config = home / ".codex" / "config.toml"
    config.parent.mkdir(parents=True)
    # memproxy's MCP endpoint reached through a stdio bridge, as clients without HTTP MCP did it.
    config.write_bytes(b'[mcp_servers.memproxy]\ncommand = "npx"\nargs = ["mcp-remote", "http://127.0.0.1:8080/mcp"]\n')
    assert "now goes through memproxy" in setup(home, "codex", "--user", "alice", "--url", mem.url, "--mcp")
    fake.queue(SSEReply(responses_stream(output("Your dog is Biscuit-7731."), "resp_1")))
    # Codex refuses to start on a server with both a command and a url.
    run([str(cli_path("codex")), "exec", "--skip-git-repo-check", QUESTION], home, home / "work",
        OPENAI_API_KEY="sk-dummy", NO_COLOR="1")
    (request,) = fake.responses_requests()
    assert f"[long-term] {FACT}" in texts(request.json())


def gemini_reply(request: Received) -> Reply:
    """Gemini CLI's model router gets its JSON, the turn a streamed answer."""
    if "You are a specialized Task Routing AI" in json.dumps(request.json().get("systemInstruction")):
        return JsonReply(answer(json.dumps({"complexity_reasoning": "simple", "complexity_score": 10})))
    return SSEReply(sse(pieces("Your dog is Biscuit-7731.")))


def test_after_setup_a_bare_gemini_goes_through_memproxy_and_undo_gives_the_files_back(make_proxy, fake, tmp_path):
    proxy = make_proxy(upstream__gemini_base_url=fake.url.removesuffix("/v1"), extraction__from_roles=[])
    stored = httpx.post(proxy.url + "/memory/v1/users/alice/memories", json={"content": FACT, "type": "fact"})
    assert stored.status_code == 201
    home = tmp_path / "home"
    settings = home / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True)
    # Gemini CLI strips comments before it parses its settings: setup keeps them.
    original = (b'{\n\t// mine\n\t"privacy": {"usageStatisticsEnabled": false},\n'
                b'\t"general": {"enableAutoUpdate": false} /* no updates in tests */\n}')
    settings.write_bytes(original)
    assert "created" in setup(home, "gemini-cli", "--user", "alice", "--url", proxy.url)
    fake.queue(*[gemini_reply] * 4)
    # The user's own key, and the trust a headless run needs in a folder never trusted before.
    done = run([str(cli_path("gemini")), "-p", QUESTION], home, home / "work", GEMINI_API_KEY="gemini-test-dummy",
               GEMINI_CLI_TRUST_WORKSPACE="true")
    fake.clear_queue()
    assert "Biscuit-7731" in done.stdout
    requests = gemini_requests(fake.received)
    assert requests and all(r.header("x-memory-user") is None for r in requests)
    (turn,) = [r for r in requests if r.target.split("?")[0].endswith(":streamGenerateContent")]
    assert f"[long-term] {FACT}" in texts(turn.json())
    assert "restored" in setup(home, "gemini-cli", "--undo")
    assert settings.read_bytes() == original and not (home / ".gemini" / ".env").exists()
