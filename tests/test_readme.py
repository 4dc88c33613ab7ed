"""The README's tour is what `memproxy demo` prints on a fresh run, and its commands are the ones CI runs."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import anthropic
import httpx
import openai

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DAY = re.compile(r"\(\d{4}-\d{2}-\d{2}\)")


def _fenced_after(marker: str, language: str) -> str:
    """The first ```language block after `marker` in the README."""
    after = README[README.index(marker):]
    start = after.index(f"```{language}\n") + len(language) + 4
    return after[start:after.index("\n```", start)]


def test_the_tour_in_the_readme_is_what_the_demo_prints() -> None:
    port = free_port()
    run = subprocess.run([sys.executable, "-m", "proxy", "demo", "--port", str(port)], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    printed = DAY.sub("(DAY)", run.stdout.replace(f"127.0.0.1:{port}", "127.0.0.1:8080")).rstrip("\n")
    shown = DAY.sub("(DAY)", _fenced_after("## A 60-second tour", "text"))
    assert printed == shown
    assert "X-Memory-Injected: 2" in printed and "internal-hbr-2291.example — Our staging host" in printed


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    command = _fenced_after("## Run the tests", "bash")
    assert command == ("python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && "
                       ".venv/bin/python -m pytest -q")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "python -m pip install --quiet -e '.[test]'" in ci and ci.rstrip().endswith("python -m pytest -q")


def test_the_demo_keeps_serving_both_wires_until_sigterm(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "demo.out"
    with out.open("w") as sink:
        process = subprocess.Popen([sys.executable, "-m", "proxy", "demo", "--port", str(port), "--serve"],
                                   stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while "keeps serving" not in out.read_text() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        headers = {"X-Memory-User": "alice"}
        chat = openai.OpenAI(base_url=url + "/v1", api_key="none", default_headers=headers, max_retries=0)
        streamed = chat.chat.completions.create(model="echo", stream=True, messages=[
            {"role": "user", "content": "Where is our staging host?"}])
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == \
            "(echo provider) Your message reached me with memproxy's memory block in front of it."
        claude = anthropic.Anthropic(base_url=url, api_key="none", default_headers=headers, max_retries=0)
        with claude.messages.stream(model="echo", max_tokens=50, messages=[
                {"role": "user", "content": "Which staging host is ours?"}]) as answer:
            assert answer.get_final_text() == \
                "(echo provider) Your message reached me with memproxy's memory block in front of it."
        memories = httpx.get(f"{url}/memory/v1/users/alice/memories").json()["data"]
        assert any("internal-hbr-2291.example" in m["content"] for m in memories)
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
