"""Codex CLI itself against memproxy: the pinned `codex exec`, a custom provider in a
temporary CODEX_HOME whose base_url is memproxy's /v1, and the scripted Responses upstream,
all on loopback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fake_responses import call_item, output, stream
from tests.fake_upstream import SSEReply
from tests.proxy_db import eventually, rows

FACT = "My dog's name is Biscuit-7731"
RUN_TIMEOUT_S = 120


def codex_binary() -> str:
    try:
        from tests.agent_clis import cli_path
    except ImportError:  # before the pinned clients' helper: a codex on PATH, or skip
        found = shutil.which("codex")
        if found is None:
            pytest.skip("codex CLI not installed")
        return found
    return str(cli_path("codex"))


@pytest.fixture
def mem(make_proxy):
    return make_proxy(memory__commit_timeout_ms=5000, extraction__from_roles=[])


def codex_home(tmp_path: Path, proxy: Any, user: str = "alice") -> dict[str, str]:
    """HOME and CODEX_HOME in the test's directory, with memproxy as the only provider."""
    home = tmp_path / "home"
    config = home / ".codex"
    config.mkdir(parents=True, exist_ok=True)
    (config / "config.toml").write_text(f"""
model = "gpt-test"
model_provider = "memproxy"

[model_providers.memproxy]
name = "memproxy"
base_url = "{proxy.url}/v1"
wire_api = "responses"
env_key = "MEMPROXY_TEST_KEY"
supports_websockets = false
request_max_retries = 0
stream_max_retries = 0
http_headers = {{ "X-Memory-User" = "{user}" }}
""")
    return {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "CODEX_HOME": str(config),
            "MEMPROXY_TEST_KEY": "sk-dummy", "NO_COLOR": "1", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}


def codex_exec(env: dict[str, str], workdir: Path, prompt: str) -> subprocess.CompletedProcess[str]:
    workdir.mkdir(exist_ok=True)
    return subprocess.run([codex_binary(), "exec", "--skip-git-repo-check", prompt], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)


def turns(fake) -> list[dict[str, Any]]:
    """The Responses requests that were the user's turns (Codex may make others)."""
    return [r.json() for r in fake.responses_requests()]


def user_texts(body: dict[str, Any]) -> list[str]:
    return [part.get("text", "") for item in body["input"] if item.get("role") == "user"
            for part in item["content"]]


def test_a_fact_told_in_one_run_reaches_the_provider_in_the_next(mem, fake, tmp_path):
    env = codex_home(tmp_path, mem)
    fake.queue(SSEReply(stream(output("Noted."), "resp_1")))
    first = codex_exec(env, tmp_path / "project", FACT)
    assert first.returncode == 0, first.stderr[-2000:]
    fake.queue(SSEReply(stream(output("Your dog is Biscuit-7731."), "resp_2")))
    second = codex_exec(env, tmp_path / "project", "what is my dog's name?")
    assert second.returncode == 0, second.stderr[-2000:]
    assert "Biscuit-7731" in second.stdout
    sent = turns(fake)
    assert len(sent) == 2
    first_texts, second_texts = user_texts(sent[0]), user_texts(sent[1])
    assert any(text.lstrip().startswith("<environment_context>") for text in second_texts)
    # The block is in the prompt's own message, as a new part first; the fact is in it.
    block = second_texts[-2]
    assert block.startswith("Relevant long-term memory") and FACT in block
    assert second_texts[-1] == "what is my dog's name?"
    assert FACT in first_texts and not any("Relevant long-term memory" in t for t in first_texts)
    # Each run's turn saved once, the environment context never as the user's words.
    assert eventually(lambda: rows(mem, "SELECT role, content FROM messages ORDER BY seq") == [
        ("user", FACT), ("assistant", "Noted."), ("user", "what is my dog's name?"),
        ("assistant", "Your dog is Biscuit-7731.")])
    assert len(rows(mem, "SELECT DISTINCT conversation_id FROM messages")) == 2  # one per Codex session


def test_a_run_where_codex_calls_a_tool_saves_one_turn(mem, fake, tmp_path):
    env = codex_home(tmp_path, mem)
    command = json.dumps({"cmd": "echo tool-ran-42"})
    fake.queue(SSEReply(stream([call_item("call_1", "exec_command", command)], "resp_1")),
               SSEReply(stream(output("The command printed tool-ran-42."), "resp_2")))
    done = codex_exec(env, tmp_path / "project", "run echo tool-ran-42 and tell me what it printed")
    assert done.returncode == 0, done.stderr[-2000:]
    sent = turns(fake)
    assert len(sent) == 2
    outputs = [item for item in sent[1]["input"] if item.get("type") == "function_call_output"]
    assert [item["call_id"] for item in outputs] == ["call_1"]
    assert "tool-ran-42" in json.dumps(outputs[0]["output"])
    assert eventually(lambda: rows(mem, "SELECT role, content FROM messages ORDER BY seq") == [
        ("user", "run echo tool-ran-42 and tell me what it printed"),
        ("assistant", "The command printed tool-ran-42.")])
    ((trace,),) = rows(mem, "SELECT steps FROM reasoning")
    assert [step["name"] for step in json.loads(trace)] == ["exec_command"]


def memory_blocks(body: dict[str, Any]) -> list[str]:
    return [text for text in user_texts(body) if text.startswith("Relevant long-term memory")]


def test_codex_compaction_gets_no_block_and_saves_nothing(mem, fake, tmp_path):
    # Codex 0.169 compacts before a turn when the last response's usage passes
    # model_auto_compact_token_limit; towards a custom provider it sends the compaction as a
    # plain POST /responses whose x-codex-turn-metadata says request_kind "compaction".
    env = codex_home(tmp_path, mem)
    big = {"input_tokens": 50_000, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 10,
           "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 50_010}
    fake.queue(SSEReply(stream(output("Noted."), "resp_1", usage=big)),
               SSEReply(stream(output("SUMMARY: the user has a dog."), "resp_2")),
               SSEReply(stream(output("Your dog is Biscuit-7731."), "resp_3")))
    first = codex_exec(env, tmp_path / "project", FACT)
    assert first.returncode == 0, first.stderr[-2000:]
    second = subprocess.run([codex_binary(), "exec", "--skip-git-repo-check", "-c",
                             "model_auto_compact_token_limit=1000", "resume", "--last", "what is my dog's name?"],
                            cwd=tmp_path / "project", env=env, capture_output=True, text=True,
                            timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert second.returncode == 0, second.stderr[-2000:]
    sent = fake.responses_requests()
    kinds = [json.loads(r.header("x-codex-turn-metadata"))["request_kind"] for r in sent]
    assert kinds == ["turn", "compaction", "turn"]
    compaction = sent[1].json()
    assert user_texts(compaction)[-1].startswith("You are performing a CONTEXT CHECKPOINT COMPACTION")
    assert memory_blocks(compaction) == []
    # The turn after it carries the summary bridge and the earlier prompt in the user's role;
    # its own prompt is still the last user message.
    assert user_texts(sent[2].json())[-1] == "what is my dog's name?"
    # The summary is not an answer: only the two turns are saved.
    assert eventually(lambda: rows(mem, "SELECT role, content FROM messages ORDER BY seq") == [
        ("user", FACT), ("assistant", "Noted."), ("user", "what is my dog's name?"),
        ("assistant", "Your dog is Biscuit-7731.")])
    assert 'memproxy_side_requests_total{rule="codex_not_a_turn",wire="openai_responses"} 1.0' in metrics(mem)


def test_codex_review_gets_no_block_and_saves_nothing(mem, fake, tmp_path):
    # `codex exec review` runs a review sub-agent: request_kind "turn", but x-openai-subagent: review.
    env = codex_home(tmp_path, mem)
    project = tmp_path / "project"
    fake.queue(SSEReply(stream(output("Noted."), "resp_1")))
    first = codex_exec(env, project, FACT)
    assert first.returncode == 0, first.stderr[-2000:]
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    (project / "app.py").write_text("print(1)\n")
    for args in (["init", "-q"], ["add", "app.py"], ["commit", "-qm", "init"]):
        subprocess.run(git + args, cwd=project, check=True, env=env)
    (project / "app.py").write_text("print(2)\n")
    fake.queue(SSEReply(stream(output("No issues found."), "resp_2")))
    review = subprocess.run([codex_binary(), "exec", "review", "--uncommitted"], cwd=project, env=env,
                            capture_output=True, text=True, timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert review.returncode == 0, review.stderr[-2000:]
    sent = fake.responses_requests()
    assert len(sent) == 2 and sent[1].header("x-openai-subagent") == "review"
    assert memory_blocks(sent[1].json()) == []
    assert user_texts(sent[1].json())[-1].startswith("Review the current code changes")
    assert eventually(lambda: rows(mem, "SELECT role, content FROM messages ORDER BY seq") == [
        ("user", FACT), ("assistant", "Noted.")])
    assert 'memproxy_side_requests_total{rule="openai_subagent",wire="openai_responses"} 1.0' in metrics(mem)


def metrics(proxy: Any) -> str:
    with proxy.http() as http:
        return http.get("/metrics").text


def test_a_codex_profile_gives_a_project_its_own_memory(make_proxy, fake, tmp_path):
    # Codex ignores provider settings in a project's .codex/config.toml; a profile
    # ($CODEX_HOME/<name>.config.toml, `codex -p <name>`) is how a project names its agent.
    mem = make_proxy(memory__commit_timeout_ms=5000, extraction__from_roles=[], scope__isolation="agent")
    env = codex_home(tmp_path, mem)
    for project in ("billing", "web"):
        (Path(env["CODEX_HOME"]) / f"{project}.config.toml").write_text(
            "[model_providers.memproxy]\n"
            f'http_headers = {{ "X-Memory-User" = "alice", "X-Memory-Agent" = "project-{project}" }}\n')
    fake.queue(SSEReply(stream(output("Noted."), "resp_1")),
               SSEReply(stream(output("I don't know."), "resp_2")),
               SSEReply(stream(output("Your dog is Biscuit-7731."), "resp_3")))
    question = "what is my dog's name?"
    for args in (["-p", "billing", FACT], ["-p", "web", question], ["-p", "billing", question]):
        done = subprocess.run([codex_binary(), "exec", "--skip-git-repo-check", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr[-2000:]
    sent = [r.json() for r in fake.responses_requests()]
    assert memory_blocks(sent[1]) == []  # the other project does not see the fact
    assert FACT in memory_blocks(sent[2])[0]
    assert eventually(lambda: rows(mem, "SELECT agent_id, content FROM messages ORDER BY seq") == [
        ("project-billing", FACT), ("project-billing", "Noted."), ("project-web", question),
        ("project-web", "I don't know."), ("project-billing", question),
        ("project-billing", "Your dog is Biscuit-7731.")])
