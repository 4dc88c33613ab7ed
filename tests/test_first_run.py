"""The first ten minutes: what a newcomer running memproxy the README's way sees."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.cli import main
from proxy.errors import Unauthenticated
from proxy.evaluation import report
from proxy.identity.scope import ScopeResolver
from proxy.settings import StoreSettings, load_settings
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[1]


def serve(args: list[str], cwd: Path, stderr: Path, **env: str) -> subprocess.Popen[bytes]:
    """`memproxy serve` in its own process, started from `cwd`, once it says it listens and /healthz answers."""
    port = env["MEMPROXY_SERVER_PORT"]
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    environ.pop("MEMPROXY_CONFIG", None)
    with stderr.open("wb") as output:
        process = subprocess.Popen([sys.executable, "-m", "proxy", "serve", *args], cwd=cwd, env=environ,
                                   stdout=output, stderr=output)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and process.poll() is None:
        # Its own line first: on a shared machine another process may answer on a port we were told is free.
        if f"running on http://127.0.0.1:{port}" in stderr.read_text():
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                return process
        time.sleep(0.05)
    process.kill()
    process.wait(10)  # reaped: an unreaped child warns in a later test
    raise RuntimeError(f"proxy did not start: {stderr.read_text()}")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0


def test_start_up_names_listen_address_upstream_and_the_store_beside_its_config(tmp_path: Path) -> None:
    config_dir, elsewhere = tmp_path / "conf", tmp_path / "elsewhere"
    config_dir.mkdir()
    elsewhere.mkdir()
    (config_dir / "memproxy.yaml").write_text("upstream:\n  base_url: http://127.0.0.1:9/v1\n"
                                              "store:\n  url: sqlite:///./memory.db\n")
    port = str(free_port())
    log = tmp_path / "stderr.log"
    process = serve(["--config", str(config_dir / "memproxy.yaml")], elsewhere, log, MEMPROXY_SERVER_PORT=port)
    stop(process)
    text = log.read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    started = [line for line in lines if line["msg"] == "memproxy starting"]
    assert [(s["logger"], s["listen"], s["upstream"], s["store"]) for s in started] == [
        ("memproxy", f"127.0.0.1:{port}", "http://127.0.0.1:9/v1", f"sqlite {config_dir / 'memory.db'}")]
    # The relative path was read beside the config file, not in the directory memproxy started from.
    assert (config_dir / "memory.db").is_file() and not (elsewhere / "memory.db").exists()
    # uvicorn's own lines are there, without the copy of each message in terminal colours.
    assert any(line["logger"].startswith("uvicorn") for line in lines)
    assert "color_message" not in text and "\\u001b" not in text and "\x1b" not in text


def test_a_store_url_from_the_environment_or_a_flag_stays_relative_to_the_current_directory(tmp_path: Path) -> None:
    config = tmp_path / "conf" / "memproxy.yaml"
    config.parent.mkdir()
    config.write_text("store:\n  url: sqlite:///./from-file.db\n")
    assert load_settings(str(config), environ={}).store.url == f"sqlite:///{tmp_path / 'conf' / 'from-file.db'}"
    from_env = load_settings(str(config), environ={"MEMPROXY_STORE_URL": "sqlite:///./from-env.db"})
    assert from_env.store.url == "sqlite:///./from-env.db"
    assert from_env.store.sqlite_path == Path.cwd() / "from-env.db"
    from_flag = load_settings(str(config), environ={}, overrides={"store.url": "sqlite:///flag.db"})
    assert from_flag.store.url == "sqlite:///flag.db"
    config.write_text(f"store:\n  url: sqlite:///{tmp_path}/absolute.db\n")
    assert load_settings(str(config), environ={}).store.url == f"sqlite:///{tmp_path}/absolute.db"
    config.write_text("store:\n  url: 'sqlite:///:memory:'\n")  # still refused, not made a file beside the config
    with pytest.raises(ValueError, match="store.url: an SQLite store needs a file path"):
        load_settings(str(config), environ={})


def test_the_store_is_described_without_credentials() -> None:
    described = StoreSettings(url="postgresql://memproxy:s3cret-pw@db.internal:5433/memory?sslmode=require").where()
    assert described == "postgresql db.internal:5433/memory"
    assert StoreSettings(url="postgresql://db/memproxy").where() == "postgresql db/memproxy"


def memproxy(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[bytes]:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    environ.pop("MEMPROXY_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "proxy", *args], cwd=cwd, env=environ, capture_output=True,
                          timeout=60, check=False)


def test_exporting_from_a_missing_database_or_for_an_unknown_user_says_so(tmp_path: Path) -> None:
    missing = memproxy(["export", "--user", "alice"], tmp_path, MEMPROXY_STORE_URL="sqlite:///./memproxy.db")
    assert (missing.returncode, missing.stdout, missing.stderr.decode()) == (
        1, b"", f"memproxy: no database at {tmp_path / 'memproxy.db'} (check --config or store.url)\n")
    assert not (tmp_path / "memproxy.db").exists()  # looking did not create an empty one
    records = tmp_path / "bob.jsonl"
    records.write_text(json.dumps({"kind": "conversation", "id": "c1", "created_at": "2026-03-01T00:00:00+00:00",
                                   "last_active_at": "2026-03-01T00:00:00+00:00"}) + "\n")
    assert memproxy(["import", str(records), "--user", "bob"], tmp_path,
                    MEMPROXY_STORE_URL="sqlite:///./memproxy.db").returncode == 0
    unknown = memproxy(["export", "--user", "alice"], tmp_path, MEMPROXY_STORE_URL="sqlite:///./memproxy.db")
    assert (unknown.returncode, unknown.stdout, unknown.stderr.decode()) == (
        1, b"", f"memproxy: nothing stored for user 'alice' in sqlite {tmp_path / 'memproxy.db'}\n")
    known = memproxy(["export", "--user", "bob"], tmp_path, MEMPROXY_STORE_URL="sqlite:///./memproxy.db")
    assert (known.returncode, len(known.stdout.splitlines()), known.stderr) == (0, 1, b"")


def docker_run_environment(page: Path) -> dict[str, str]:
    """The -e NAME=VALUE of the page's `docker run` command, over the Dockerfile's ENV."""
    environ: dict[str, str] = {}
    dockerfile = (ROOT / "Dockerfile").read_text()
    for block in re.findall(r"^ENV ((?:.*\\\n)*.*)$", dockerfile, re.M):
        for pair in shlex.split(block.replace("\\\n", " ")):
            name, _, value = pair.partition("=")
            environ[name] = value
    command = re.search(r"^docker run (?:.*\\\n)*.*$", page.read_text(), re.M)
    assert command is not None, f"{page.name} has no docker run command"
    words = shlex.split(command.group(0).replace("\\\n", " "))
    for flag, value in zip(words, words[1:]):
        if flag == "-e":
            name, _, text = value.partition("=")
            environ[name] = text
    return environ


@pytest.mark.parametrize("page", [ROOT / "README.md", ROOT / "docs" / "deployment.md"], ids=["README", "deployment"])
def test_the_docker_example_trusts_a_request_from_the_host(page: Path) -> None:
    environ = docker_run_environment(page)
    settings = load_settings(environ=environ)
    assert (settings.server.host, settings.store.url) == ("0.0.0.0", "sqlite:////data/memproxy.db")
    # A request from the host reaches the container from the bridge's gateway, not loopback.
    from_the_host = {"client": ("172.17.0.1", 40000), "headers": [(b"x-memory-user", b"alice")]}
    assert ScopeResolver(settings).resolve(from_the_host).scope is not None
    without = {k: v for k, v in environ.items() if k != "MEMPROXY_AUTH_TRUSTED_NETWORKS"}
    with pytest.raises(Unauthenticated):
        ScopeResolver(load_settings(environ=without)).resolve(from_the_host)


def test_the_unreachable_upstream_log_line_names_the_host(make_proxy: Any, caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()  # nothing listens there
    proxy = make_proxy(upstream__base_url=f"http://127.0.0.1:{port}/v1")
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert (response.status_code, response.json()["error"]["code"]) == (502, "upstream_unavailable")
    assert str(port) not in response.text  # the client learns nothing of the upstream's address
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("upstream unreachable: ")]
    assert lines and all(line.startswith(f"upstream unreachable: 127.0.0.1:{port} (") for line in lines), lines


class _File:
    """A stream that is not a terminal, as stderr redirected to a file is."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_progress_is_a_bar_on_a_terminal_and_plain_lines_in_a_file() -> None:
    file = _File()
    progress = report.progress_for(file, json_output=False)  # type: ignore[arg-type]
    assert isinstance(progress, report.ProgressLines)
    for done in range(1, 21):
        progress(done, 20)
    assert file.text == "".join(f"questions: {n}/20 ({n * 5}%)\n" for n in range(2, 21, 2)).replace(
        "questions: 2/20 (10%)\n", "questions: 1/20 (0%)\nquestions: 2/20 (10%)\n")
    assert report.progress_for(file, json_output=True) is None  # type: ignore[arg-type]

    class Terminal(_File):
        def isatty(self) -> bool:
            return True

    assert isinstance(report.progress_for(Terminal(), json_output=True), report.ProgressBar)  # type: ignore[arg-type]


def test_eval_locomo_writes_no_carriage_returns_when_stderr_is_a_file(tmp_path: Path, capfd: pytest.CaptureFixture[str]
                                                                      ) -> None:
    turns = [{"speaker": "Ana" if i % 2 else "Ben", "dia_id": f"D1:{i}", "text": f"I keep bees number {i}."}
             for i in range(1, 13)]
    sample = {"sample_id": "tiny", "conversation": {"session_1": turns, "session_1_date_time": "1:56 pm on 8 May, 2023"},
              "qa": [{"question": f"What about bees number {i}?", "category": 4, "evidence": [f"D1:{i}"]}
                     for i in range(1, 13)]}
    data = tmp_path / "tiny.json"
    data.write_text(json.dumps([sample]))
    assert main(["eval", "locomo", "--data", str(data), "--k", "3"]) == 0
    err = capfd.readouterr().err
    assert "\r" not in err
    assert err.splitlines()[0] == "questions: 1/12 (0%)" and err.splitlines()[-1] == "questions: 12/12 (100%)"
