"""Observability (docs/operations.md): Prometheus metrics, and one structured log line per request that
carries neither message text nor credentials."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from proxy.logs import JsonFormatter
from tests.api_helpers import api_url, chat
from tests.fake_upstream import JsonReply, SSEReply, stream_events

CANARY = "cnrylogtext71c2"
CLIENT_KEY = "sk-proj-" + "Zx81" * 10
API_TOKEN = "memory-api-token-5512"


def samples(client: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def test_metrics_count_requests_latency_memory_and_queues(make_proxy: Any) -> None:
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    with proxy.http() as client:
        client.post(api_url("u1", "memories"), json={"content": "Favourite tea is oolong", "type": "fact"})
        response = chat(client, {"X-Memory-User": "u1"}, "What is my favourite tea?")
        assert response.headers["x-memory-injected"] == "1"
        client.get("/v1/models")
        found = samples(client)
    assert found[("memproxy_requests_total", (("outcome", "status_200"), ("path", "/chat/completions")))] == 1
    assert found[("memproxy_requests_total", (("outcome", "status_200"), ("path", "/models")))] == 1
    assert found[("memproxy_requests_total", (("outcome", "status_201"), ("path", "memory_api")))] == 1
    assert found[("memproxy_upstream_seconds_count", ())] == 2
    for source in ("long-term", "conversation", "cross-session", "reasoning"):
        assert found[("memproxy_retrieval_seconds_count", (("source", source),))] == 1
    assert found[("memproxy_memories_injected_total", ())] == 1
    assert found[("memproxy_persistence_failures_total", ())] == 0
    assert found[("memproxy_extraction_failures_total", ())] == 0
    assert found[("memproxy_writes_dropped_total", ())] == 0
    assert found[("memproxy_queue_depth", (("queue", "writes"),))] >= 0
    assert found[("memproxy_circuit_open", ())] == 0


def test_metrics_count_the_users_searched_from_memory(make_proxy: Any) -> None:
    """A user's first search asks for their postings; once built, /metrics counts them per index."""
    proxy = make_proxy()
    with proxy.http() as client:
        found = samples(client)
        assert found[("memproxy_search_memory_users", (("index", "messages"),))] == 0
        assert found[("memproxy_search_memory_users", (("index", "entities"),))] == 0
        client.post(api_url("u1", "memories"), json={"content": "Favourite tea is oolong", "type": "fact"})
        for n in range(300):  # each recall searches both indexes; the builds run in the background
            chat(client, {"X-Memory-User": "u1", "X-Memory-Persist": "false"}, "What is my favourite tea?")
            found = samples(client)
            if found[("memproxy_search_memory_users", (("index", "entities"),))] == 1 and \
                    found[("memproxy_search_memory_users", (("index", "messages"),))] == 1:
                break
            time.sleep(0.02)
    assert found[("memproxy_search_memory_users", (("index", "messages"),))] == 1
    assert found[("memproxy_search_memory_users", (("index", "entities"),))] == 1


def test_answers_are_counted_by_ending_and_bad_stream_lines_counted(make_proxy: Any, fake: Any) -> None:
    # An unparseable 200 and a stream's bad data lines are counted.
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    events = stream_events("fine answer", pieces=2)
    fake.queue(JsonReply(b"{not json at all", content_type="application/json"),
               SSEReply(events[:2] + [b"data: {not json}\n\n", b"data: [1, 2]\n\n"] + events[2:]),
               JsonReply(b"", status=500))
    memory = {"X-Memory-User": "u1"}
    with proxy.http() as client:
        assert chat(client, memory, "first").content == b"{not json at all"
        with client.stream("POST", "/v1/chat/completions", headers=memory,
                           json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "second"}]}
                           ) as streamed:
            assert b"data: {not json}" in streamed.read()
        assert chat(client, memory, "third").status_code == 500
        found = samples(client)
    endings = {labels[0][1]: value for (name, labels), value in found.items() if name == "memproxy_answers_total"}
    assert endings == {"unparseable": 1, "complete": 1, "upstream_failed": 1}
    assert found[("memproxy_stream_bad_events_total", ())] == 2


def test_request_labels_stay_few_whatever_paths_clients_send(make_proxy: Any, fake: Any) -> None:
    # Item ids and made-up paths, even unauthenticated ones, must not add label values: each
    # is a series and its histogram buckets, kept for the process's life.
    proxy = make_proxy(auth__mode="api-keys", auth__api_keys=[{"key": "k", "user": "u"}])
    with proxy.http() as client:
        for n in range(5):
            assert client.get(f"/v1/files/file-{n}abc").status_code == 401
            assert client.get(f"/v1/made-up-{n}/x").status_code == 401
        found = samples(client)
    paths = {dict(labels).get("path") for name, labels in found if name == "memproxy_requests_total"}
    assert paths == {"/files", "other"}
    assert found[("memproxy_requests_total", (("outcome", "invalid_memory_identity"), ("path", "/files")))] == 5


def _lines(caplog: Any) -> list[dict[str, Any]]:
    formatter = JsonFormatter()
    return [json.loads(formatter.format(record)) for record in caplog.records]


def test_one_log_line_per_request_without_text_or_credentials(make_proxy: Any, caplog: Any) -> None:
    caplog.set_level(logging.INFO)
    proxy = make_proxy(memory__commit_timeout_ms=5000, memory_api__token=API_TOKEN)
    auth = {"Authorization": f"Bearer {API_TOKEN}"}
    with proxy.http() as client:
        headers = {"X-Memory-User": "logged-user", "Authorization": f"Bearer {CLIENT_KEY}"}
        chat(client, headers, f"My locker code is {CANARY}, key {CLIENT_KEY}")
        chat(client, headers, f"What is my locker code {CANARY}?", stream=True)
        client.get("/v1/models", headers={"Authorization": f"Bearer {CLIENT_KEY}"})
        client.post(api_url("logged-user", "search"), json={"query": f"locker {CANARY}"}, headers=auth)
        client.get(api_url("logged-user", "memories"), headers={"Authorization": "Bearer wrong-token"})
    lines = _lines(caplog)
    text = "\n".join(json.dumps(line) for line in lines)
    for secret in (CANARY, CLIENT_KEY, API_TOKEN, "wrong-token"):
        assert secret not in text
    requests = [(line["path"], line["method"], line["outcome"], line["memory"]) for line in lines
                if line["msg"] == "request"]
    assert requests == [("/chat/completions", "POST", "status_200", "ok"),
                        ("/chat/completions", "POST", "status_200", "ok"), ("/models", "GET", "status_200", None)]
    api = [(line["route"], line["method"], line["outcome"]) for line in lines if line["msg"] == "memory api request"]
    assert api == [("/users/{user}/search", "POST", "status_200"), ("/users/{user}/memories", "GET", "status_401")]
    for line in lines:
        if line["msg"] in ("request", "memory api request"):
            assert set(line) - {"path", "route", "memory"} == {"ts", "level", "logger", "msg", "method", "outcome",
                                                               "ms"}
            assert "logged-user" not in json.dumps(line)


def test_the_formatter_redacts_what_code_might_log() -> None:
    record = logging.LogRecord("memproxy.test", logging.WARNING, __file__, 1, "store said %s", (CLIENT_KEY,), None)
    record.authorization = "Bearer abc.def"
    record.password = "hunter2-hunter2"
    record.detail = {"url": "postgres://app:s3cretpass@db.internal/mem", "n": 3}
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "store said [REDACTED:openai_key]"
    assert (line["authorization"], line["password"]) == ("[REDACTED:authorization]", "[REDACTED:password]")
    assert line["detail"] == {"url": "postgres://app:[REDACTED:password]@db.internal/mem", "n": 3}


def test_memory_off_says_why_in_the_status_and_the_log_line(make_proxy: Any, fake: Any, caplog: Any) -> None:
    caplog.set_level(logging.INFO)
    proxy = make_proxy()
    turn = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}
    with proxy.http() as client:
        statuses = [
            client.post("/v1/chat/completions", json=turn).headers["x-memory-status"],
            client.post("/v1/chat/completions", json=turn, headers={"X-Memory-Usr": "alice"}).headers["x-memory-status"],
            client.post("/v1/chat/completions", json=turn,
                        headers={"X-Memory-User": "alice", "X-Memory-Mode": "off"}).headers["x-memory-status"],
            client.post("/v1/chat/completions", content=b"{not json",
                        headers={"X-Memory-User": "alice"}).headers["x-memory-status"],
            client.get("/v1/chat/completions", headers={"X-Memory-User": "alice"}).headers["x-memory-status"],
        ]
    assert statuses == ["off: no user", "off: no user", "off: mode off", "off: not a turn", "off: not a turn"]
    logged = [line["memory"] for line in _lines(caplog) if line["msg"] == "request"]
    assert logged == statuses


def test_a_404_on_a_chat_path_names_the_base_url_setting_once(make_proxy: Any, fake: Any, caplog: Any) -> None:
    caplog.set_level(logging.INFO)
    proxy = make_proxy()
    not_found = {"error": {"message": "Not found", "type": "invalid_request_error", "param": None, "code": None}}
    for _ in range(2):
        fake.queue(JsonReply(not_found, status=404))
    with proxy.http() as client:
        for _ in range(2):
            answer = client.post("/v1/chat/completions", headers={"X-Memory-User": "alice"},
                                 json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
            assert (answer.status_code, answer.json()) == (404, not_found)  # the provider's answer, unchanged
    hints = [line["msg"] for line in _lines(caplog) if line["logger"] == "memproxy.request" and "404" in line["msg"]]
    assert hints == [f"the provider answered 404 on a chat path ({fake.url}/chat/completions); upstream.base_url "
                     "must include the provider's version prefix, for example https://api.openai.com/v1"]
