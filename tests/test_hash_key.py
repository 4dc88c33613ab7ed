"""The digests kept of text before redaction give no secret away (docs/security.md): the
answer's, the history's (and the turn key and conversation id made from it), a Gemini call's
id made from its arguments. Each is sealed with a key the store does not hold, and every
process and replica on one store seals with the same key, so retries and tool loops still
find their turn wherever they land."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import stat
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from proxy.ids import derived_id, id_time_ns
from proxy.models import Scope
from proxy.settings import ConfigError, load_settings
from proxy.stores.base import FinishTurn, StartTurn, text_hash
from proxy.stores.hash_key import KEY_FILE_SUFFIX, load_hash_key
from proxy.stores.sqlite.store import SQLiteStore
from tests.conftest import free_port
from tests.fake_gemini import answer, function_call, response
from tests.fake_upstream import FakeUpstream, JsonReply, completion
from tests.proxy_db import eventually
from tests.store_backends import PostgresBackend, SQLiteBackend

# A word list any cracking run starts with; the password is in it.
WORDS = ["123456", "password", "letmein", "qwerty", "sunshine1", "dragon", "monkey"]
PROMPT = "Set the wifi password=sunshine1 on the router"
ANSWER = "Done: the router now uses password=sunshine1 for wifi."
ALICE = {"X-Memory-User": "alice"}


@dataclass
class Shared:
    """One store several proxies use, and raw SQL on it."""

    url: str
    backend: SQLiteBackend | PostgresBackend

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return asyncio.run(self.backend.sql(sql))


@pytest.fixture(params=["sqlite", "postgres"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Shared:
    if request.param == "sqlite":
        return Shared(f"sqlite:///{tmp_path}/memproxy.db", SQLiteBackend(tmp_path / "memproxy.db"))
    url = request.getfixturevalue("pg_url")
    return Shared(url, PostgresBackend(url))


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def guessed(redacted: str, kind: str = "password") -> list[tuple[str, str]]:
    """(word, the text it restores) for each word of the list."""
    return [(word, redacted.replace(f"[REDACTED:{kind}]", word)) for word in WORDS]


def test_a_redacted_password_cannot_be_recovered_from_the_digests_kept_beside_it(
        shared: Shared, make_proxy: Any, fake: FakeUpstream) -> None:
    proxy = make_proxy(store__url=shared.url, memory__commit_timeout_ms=5000, extraction__from_roles=[])
    fake.queue(JsonReply(completion(ANSWER)))
    sent = proxy.client(**ALICE).chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPT}])
    assert sent.choices[0].message.content == ANSWER
    assert eventually(lambda: len(shared.rows("SELECT 1 FROM messages")) == 2)
    ((saved_answer, answer_hash, conversation),) = shared.rows(
        "SELECT content, content_hash, conversation_id FROM messages WHERE role = 'assistant'")
    ((saved_prompt,),) = shared.rows("SELECT content FROM messages WHERE role = 'user'")
    ((history_hash, turn_key),) = shared.rows("SELECT history_hash, turn_key FROM turns")
    assert "sunshine1" not in saved_answer + saved_prompt  # saved redacted
    start_ns = id_time_ns(turn_key)  # the start of the retry window the turn began in
    found = []
    for word, answer_text in guessed(saved_answer):
        if sha(answer_text) == answer_hash:
            found.append(("answer", word))
    for word, prompt in guessed(saved_prompt):
        digest = sha(json.dumps(["alice", "", "", [["user", prompt]]], ensure_ascii=False))
        if digest == history_hash:
            found.append(("history", word))
        if derived_id(f"turn {digest} {start_ns}", start_ns) == turn_key:
            found.append(("turn key", word))
        if derived_id(f"conversation {digest} {start_ns}", start_ns) == conversation:
            found.append(("conversation", word))
    assert found == []
    # The answer's digest is still the one the conversation is found by: the client sends the
    # answer back as it received it, and the next turn continues the same conversation.
    fake.queue(JsonReply(completion("Noted.")))
    proxy.client(**ALICE).chat.completions.create(model="m", messages=[
        {"role": "user", "content": PROMPT}, {"role": "assistant", "content": ANSWER},
        {"role": "user", "content": "And the guest network?"}])
    assert eventually(lambda: len(shared.rows("SELECT 1 FROM messages")) == 4)
    assert shared.rows("SELECT DISTINCT conversation_id FROM messages") == [(conversation,)]


def test_a_retry_on_another_replica_is_the_same_turn_and_saved_once(
        shared: Shared, make_proxy: Any, fake: FakeUpstream) -> None:
    first, second = (make_proxy(store__url=shared.url, memory__commit_timeout_ms=5000, extraction__from_roles=[])
                     for _ in range(2))
    turns = []
    for proxy in (first, second):
        fake.queue(JsonReply(completion(ANSWER)))
        raw = proxy.client(**ALICE).chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": PROMPT}])
        turns.append(raw.headers["x-memory-turn"])
    assert turns[0] == turns[1]
    assert shared.rows("SELECT count(*) FROM messages WHERE role = 'user'") == [(1,)]


def test_a_gemini_calls_id_gives_away_no_argument_and_its_loop_goes_on_on_another_replica(
        shared: Shared, make_proxy: Any, fake: FakeUpstream) -> None:
    first, second = (make_proxy(store__url=shared.url, upstream__gemini_base_url=fake.url.removesuffix("/v1"),
                                memory__commit_timeout_ms=5000, extraction__from_roles=[]) for _ in range(2))
    call = function_call("login", {"user": "db", "password": "sunshine1"})
    fake.queue(JsonReply(response([call])), JsonReply(answer("Logged in.")))
    path = "/v1beta/models/gemini-test:generateContent"
    contents = [{"role": "user", "parts": [{"text": "Log in to the db"}]}]
    headers = {**ALICE, "x-goog-api-key": "client-key"}
    with first.http() as http:
        step = http.post(path, headers=headers, json={"contents": contents})
        assert step.status_code == 200, step.text
    assert eventually(lambda: len(shared.rows("SELECT 1 FROM turn_tool_calls")) == 1)
    ((call_id, arguments),) = shared.rows("SELECT call_id, arguments FROM turn_tool_calls")
    assert "sunshine1" not in arguments  # saved redacted
    ids = {word: sha(json.dumps(["login", json.dumps(json.loads(restored), ensure_ascii=False, sort_keys=True), 0]))
           for word, restored in guessed(arguments)}  # the id each guess would make
    recovered = [word for word, made in ids.items() if made[:16] in call_id]
    assert recovered == []
    # The loop's next step, on the other replica, is the same turn.
    contents += [{"role": "model", "parts": [call]},
                 {"role": "user", "parts": [{"functionResponse": {"name": "login", "response": {"ok": True}}}]}]
    with second.http() as http:
        final = http.post(path, headers=headers, json={"contents": contents})
        assert final.status_code == 200, final.text
    assert final.headers["x-memory-turn"] == step.headers["x-memory-turn"]
    assert eventually(lambda: shared.rows("SELECT count(*), min(status) FROM turns") == [(1, "complete")])
    assert shared.rows("SELECT count(*) FROM messages WHERE role = 'user'") == [(1,)]


def test_a_conversation_saved_before_digests_were_keyed_is_still_continued(
        tmp_path: Path, make_proxy: Any, fake: FakeUpstream) -> None:
    """An upgrade keeps conversations: the answer saved by the version before (its plain sha256)
    is still found when the client sends it back."""
    db = tmp_path / "memproxy.db"
    at = datetime.now(timezone.utc)

    async def saved_by_the_version_before() -> None:
        store = SQLiteStore(str(db))
        await store.open()
        try:
            alice = Scope("alice")
            await store.apply([StartTurn(alice, "t-old", "c-old", sha("old history"), at, "What is my router?"),
                               FinishTurn(alice, "t-old", "c-old", "It is the blue one.", at,
                                          answer_hash=text_hash("It is the blue one."))])
        finally:
            await store.close()

    asyncio.run(saved_by_the_version_before())
    proxy = make_proxy(store__url=f"sqlite:///{db}", memory__commit_timeout_ms=5000, extraction__from_roles=[])
    fake.queue(JsonReply(completion("Noted.")))
    proxy.client(**ALICE).chat.completions.create(model="m", messages=[
        {"role": "user", "content": "What is my router?"}, {"role": "assistant", "content": "It is the blue one."},
        {"role": "user", "content": "Paint it red."}])
    saved = Shared(f"sqlite:///{db}", SQLiteBackend(db))
    assert eventually(lambda: saved.rows("SELECT count(*) FROM messages") == [(4,)])
    assert saved.rows("SELECT DISTINCT conversation_id FROM messages") == [("c-old",)]


def test_the_key_file_is_made_once_beside_the_database_private_and_shared_by_its_processes(tmp_path: Path) -> None:
    db = tmp_path / "data" / "memproxy.db"
    db.parent.mkdir()
    script = ("import sys; from proxy.settings import load_settings; from proxy.stores.hash_key import load_hash_key;"
              " print(load_hash_key(load_settings(environ={}, overrides={'store.url': sys.argv[1]}).store).seal('x'))")
    starting = [subprocess.Popen([sys.executable, "-c", script, f"sqlite:///{db}"], stdout=subprocess.PIPE, text=True)
                for _ in range(4)]
    sealed = {process.communicate(timeout=60)[0].strip() for process in starting}
    key_file = Path(f"{db}{KEY_FILE_SUFFIX}")
    key = bytes.fromhex(key_file.read_text().strip())
    assert len(key) == 32 and sealed == {hmac.new(key, b"x", hashlib.sha256).hexdigest()}
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert sorted(path.name for path in key_file.parent.iterdir()) == ["memproxy.db.key"]  # no draft left behind


def test_a_key_file_whose_directory_is_not_there_yet_is_made_once_it_is(tmp_path: Path) -> None:
    """The store cannot open either (memory is degraded, writes wait): meanwhile each digest is
    random, matching nothing and telling nothing; then the key is made and kept."""
    settings = load_settings(environ={}, overrides={"store.url": f"sqlite:///{tmp_path}/later/m.db"})
    key = load_hash_key(settings.store)
    assert key.seal("digest") != key.seal("digest")
    (tmp_path / "later").mkdir()
    sealed = key.seal("digest")
    assert sealed == key.seal("digest") == load_hash_key(settings.store).seal("digest")
    assert Path(f"{tmp_path}/later/m.db{KEY_FILE_SUFFIX}").is_file()


def test_a_damaged_key_file_stops_start_up_naming_it(tmp_path: Path) -> None:
    Path(f"{tmp_path}/m.db{KEY_FILE_SUFFIX}").write_text("not a key\n")
    settings = load_settings(environ={}, overrides={"store.url": f"sqlite:///{tmp_path}/m.db"})
    with pytest.raises(ConfigError, match=r"^store.hash_key: .*m\.db\.key does not hold a key"):
        load_hash_key(settings.store)


def test_a_postgres_store_needs_a_hash_key_of_32_bytes() -> None:
    missing = load_settings(environ={"MEMPROXY_STORE_URL": "postgresql://db/memproxy"})
    with pytest.raises(ConfigError, match=r"^store.hash_key: a PostgreSQL store needs one, the same on every "
                                          r"replica \(MEMPROXY_STORE_HASH_KEY"):
        load_hash_key(missing.store)
    with pytest.raises(ConfigError, match=r"^store.hash_key: must be at least 32 bytes"):
        load_settings(environ={"MEMPROXY_STORE_URL": "postgresql://db/memproxy", "MEMPROXY_STORE_HASH_KEY": "short"})


def memproxy(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The console command on a PostgreSQL store given no hash key (nothing listens on its port)."""
    config = tmp_path / "postgres.yaml"
    config.write_text("store:\n  url: postgresql://memproxy:memproxy@127.0.0.1:1/memproxy\n")
    return subprocess.run([sys.executable, "-m", "proxy", *args, "--config", str(config)], capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, timeout=60)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_on_postgres_without_the_hash_key_stops_naming_it(tmp_path: Path, workers: str) -> None:
    done = memproxy(tmp_path, "serve", "--port", str(free_port()), "--workers", workers)
    assert (done.returncode, done.stderr) == (2, (
        "memproxy: configuration error: store.hash_key: a PostgreSQL store needs one, the same on every replica "
        "(MEMPROXY_STORE_HASH_KEY; for example the output of `openssl rand -hex 32`): the digests kept of text "
        "before redaction are keyed with it (docs/security.md)\n"))


@pytest.mark.parametrize("command", [["export", "--user", "alice"], ["delete", "--user", "alice"]])
def test_admin_commands_on_postgres_run_without_the_hash_key_they_never_use(tmp_path: Path, command: list[str]) -> None:
    """An admin's export or GDPR deletion seals nothing: it needs no copy of the replicas' secret
    and goes on to the database (here, none listens: the store's error, not the key's)."""
    done = memproxy(tmp_path, *command)
    assert done.returncode == 1
    assert done.stderr.startswith("memproxy: store error: cannot open postgresql://memproxy:***@127.0.0.1:1/memproxy"), \
        done.stderr
