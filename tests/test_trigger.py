"""The identifier trigger."""

from __future__ import annotations

import pytest

from proxy.memory.retrieval.trigger import identifiers, promote, unseen_identifiers
from proxy.models import Hit


@pytest.mark.parametrize(
    ("text", "found"),
    [
        # URLs, with their host, trailing punctuation left out
        ("see https://internal-hbr-2291.example/path?x=1).", ["https://internal-hbr-2291.example/path?x=1", "internal-hbr-2291.example"]),
        ("ws://localhost:8080/feed", ["ws://localhost:8080/feed"]),
        ("broken http://[abc/x", ["http://[abc/x"]),
        # hostnames and dotted file names
        ("the staging host is internal-hbr-2291.example.", ["internal-hbr-2291.example"]),
        ("api.acme.io and config.yaml and Node.js", ["api.acme.io", "config.yaml", "Node.js"]),
        ("mail alice@example.com today", ["alice@example.com"]),
        # paths
        ("edit /etc/hosts now", ["/etc/hosts"]),
        ("run ./scripts/deploy.sh or ../up or ~/notes", ["./scripts/deploy.sh", "../up", "~/notes"]),
        ("open C:\\x and C:\\Users\\al\\file.txt", ["C:\\x", "C:\\Users\\al\\file.txt"]),
        ("src/app.py and proxy/memory/block", ["src/app.py", "proxy/memory/block"]),
        # snake, camel, Pascal
        ("set MAX_TOKENS and max_tokens", ["MAX_TOKENS", "max_tokens"]),
        ("call getUserName on PostgreSQL via HTTPServer from my iPhone", ["getUserName", "PostgreSQL", "HTTPServer", "iPhone"]),
        # long kebab-case
        ("the my-cool-app repo", ["my-cool-app"]),
        # codes and hex
        ("ticket AB-1234 and key x7k2m9q and abc12", ["AB-1234", "x7k2m9q", "abc12"]),
        ("commit deadbeef, 0x1f2e3d4c and a1b2c3d4e5", ["deadbeef", "0x1f2e3d4c", "a1b2c3d4e5"]),
        ("order 12345678", ["12345678"]),
        # each once, in order
        ("AB-1234 then ab-1234 then AB-1234", ["AB-1234", "ab-1234"]),
    ],
)
def test_identifiers_found(text: str, found: list[str]) -> None:
    assert identifiers(text) == found


@pytest.mark.parametrize(
    "text",
    [
        "Where does my sister work these days?",
        "I think it is OK, thanks!",
        "Back in 2024 and in the 1990s, the 100th time at 1080p",
        "e.g. the U.S. and i.e. Python 3.11 at 5 p.m.",
        "and/or km/h 24/7 TCP/IP",
        "an up-to-date, state-of-the-art, end-to-end plan",
        "on 2024-01-15 call 555-123-4567",
        "kebab-case file names",
        "APIs URLs NASA GPUs",
        "Hello World. Then again",
        "1_000_000 and 3.5x",
        "",
    ],
)
def test_no_identifiers(text: str) -> None:
    assert identifiers(text) == []


def test_unseen_identifiers_ignore_what_the_transcript_shows() -> None:
    user = "is internal-hbr-2291.example still behind vpn-gw-7 with code ZQ7X4M2K?"
    transcript = ["We moved VPN-GW-7 last week.", "ok"]
    assert unseen_identifiers(user, transcript) == ["internal-hbr-2291.example", "ZQ7X4M2K"]
    assert unseen_identifiers(user, []) == ["internal-hbr-2291.example", "vpn-gw-7", "ZQ7X4M2K"]
    assert unseen_identifiers("where do I work?", ["anything"]) == []


def test_promote_moves_matching_hits_first_keeping_order() -> None:
    hits = [
        Hit("conversation", "a", "lunch plans"),
        Hit("conversation", "b", "the staging host is INTERNAL-HBR-2291.example"),
        Hit("conversation", "c", "weather"),
        Hit("conversation", "d", "build ZQ7X4M2K shipped", parts={"lexical": 4}),
    ]
    promoted = promote(hits, ["internal-hbr-2291.example", "zq7x4m2k"])
    assert [h.id for h in promoted] == ["b", "d", "a", "c"]
    assert [h.reason for h in promoted] == ["identifier trigger", "identifier trigger", "rank", "rank"]
    assert promoted[1].parts == {"lexical": 4, "identifier": "zq7x4m2k"}
    assert promoted[2:] == [hits[0], hits[2]]


def test_promote_keeps_each_source_in_its_own_order() -> None:
    hits = [Hit("graph", "g1", "x"), Hit("long-term", "l1", "y"), Hit("graph", "g2", "has AB-1234"), Hit("long-term", "l2", "ab-1234")]
    promoted = promote(hits, ["AB-1234"])
    assert [h.id for h in promoted if h.source == "graph"] == ["g2", "g1"]
    assert [h.id for h in promoted if h.source == "long-term"] == ["l2", "l1"]


def test_promote_without_identifiers_changes_nothing() -> None:
    hits = [Hit("graph", "g1", "x"), Hit("graph", "g2", "y")]
    assert promote(hits, []) == hits
    assert promote(hits, [""]) == hits
