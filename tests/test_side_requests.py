"""scope.side_requests: rules on method, path, prompt, headers and body fields; through the proxy."""

from __future__ import annotations

import json

import pytest

from proxy.settings import ConfigError, load_settings
from proxy.identity.side_requests import RequestFacts, SideRequests
from tests.proxy_db import rows

DEFAULTS = SideRequests(load_settings(environ={}).scope.side_requests)


def facts(path: str = "/messages", headers: dict[str, str] | None = None, body: dict | None = None,
          prompt: str | None = None, method: str = "POST") -> RequestFacts:
    raw = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    return RequestFacts(method, path, raw, body if body is not None else {}, prompt)


@pytest.mark.parametrize("case, expected", [
    (facts("/messages/count_tokens", body=None), "count_tokens"),
    (facts("/messages/count_tokens", method="GET"), None),
    (facts("/responses/compact"), "responses_compact"),
    (facts("/responses", {"X-OpenAI-Subagent": "review"}), "openai_subagent"),
    (facts("/responses", {"x-codex-turn-metadata": '{"request_kind": "compact"}'}), "codex_not_a_turn"),
    (facts("/responses", {"x-codex-turn-metadata": '{"request_kind": "turn"}'}), None),
    # As Codex 0.169 sends them (compact JSON): a compaction, a review sub-agent's turn.
    (facts("/responses", {"x-codex-turn-metadata": '{"turn_id":"t1","request_kind":"compaction"}'}),
     "codex_not_a_turn"),
    (facts("/responses", {"x-codex-turn-metadata": '{"request_kind":"turn","subagent_kind":"review"}',
                          "x-openai-subagent": "review"}), "openai_subagent"),
    (facts(body={"max_tokens": 1, "messages": []}), "claude_code_quota"),
    (facts(body={"max_tokens": 10}), None),
    (facts(body={"system": [{"type": "text", "text": "You are an agent for Claude Code, Anthropic's CLI"}]}),
     "claude_code_subagent_prompt"),
    (facts(headers={"x-claude-code-agent-id": "a3acae7158befce4c"}), "claude_code_subagent"),
    (facts(prompt="Your task is to create a detailed summary of the conversation so far"),
     "claude_code_compaction"),
    (facts(prompt="my cat is Tom\nCRITICAL: Respond with TEXT ONLY.\n\nYour task is to create a detailed summary "
                  "of the conversation so far, paying close attention"), "claude_code_compaction"),
    (facts("/chat/completions", body={"max_tokens": 1}), None),
    (facts(prompt="what did we decide about the schema?"), None),
])
def test_default_rules(case, expected):
    assert DEFAULTS.match(case) == expected


def test_body_rules_need_the_body():
    rules = SideRequests([{"name": "r", "body:metadata.kind": "^probe$"}])
    assert rules.match(facts(body={"metadata": {"kind": "probe"}})) == "r"
    assert rules.match(facts(body={"metadata": {"kind": "turn"}})) is None
    assert rules.match(RequestFacts("POST", "/messages", [], None, None)) is None


def test_a_number_in_a_body_field_picks_a_lists_item():
    rules = SideRequests([{"name": "r", "body:system.0.text": "^probe"}])
    assert rules.match(facts(body={"system": [{"text": "probe the quota"}, {"text": "more"}]})) == "r"
    assert rules.match(facts(body={"system": [{"text": "a turn"}, {"text": "probe"}]})) is None
    assert rules.match(facts(body={"system": []})) is None
    assert rules.match(facts(body={"system": {"0": {"text": "probe"}}})) == "r"  # an object's key "0"


@pytest.mark.parametrize("rule, message", [
    ({"path": "/x"}, r"scope\.side_requests\[0\]: every rule needs a name"),
    ({"name": "r", "query": "x"}, r"scope\.side_requests\[0\]\.query: unknown condition"),
    ({"name": "r", "header:x": "("}, r"scope\.side_requests\[0\]\.header:x: invalid regular expression"),
])
def test_bad_rules_stop_start_up(rule, message):
    with pytest.raises(ConfigError, match=message):
        SideRequests([rule])


def test_a_side_request_gets_no_block_saves_nothing_and_is_counted(make_proxy, fake):
    proxy = make_proxy(upstream__anthropic_base_url=fake.url, memory__commit_timeout_ms=5000)
    user = {"X-Memory-User": "alice"}
    with proxy.http() as http:
        http.post("/v1/messages", headers=user, json={
            "model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "My dog is called Rex"}]})
        probe = http.post("/v1/messages", headers=user, json={
            "model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "what is my dog called"}]})
        metrics = http.get("/metrics").text
    assert probe.status_code == 200 and probe.headers["x-memory-status"] == "off: side request"
    assert fake.messages_requests()[-1].json()["messages"][0]["content"] == "what is my dog called"
    assert rows(proxy, "SELECT content FROM messages ORDER BY seq") == [("My dog is called Rex",),
                                                                         ("Hello from Claude",)]
    assert 'memproxy_side_requests_total{rule="claude_code_quota",wire="anthropic_messages"} 1.0' in metrics


def test_claude_codes_compaction_request_as_recorded_gets_no_block_and_saves_nothing(make_proxy, fake):
    # The shape Claude Code 2.1.197 sent for `/compact`: its instructions appended after the
    # user's last text, in the same message, beside /compact's own command-tag messages.
    proxy = make_proxy(upstream__anthropic_base_url=fake.url, memory__commit_timeout_ms=5000)
    user = {"X-Memory-User": "alice", "X-Claude-Code-Session-Id": "s-1"}
    reminder = {"type": "text", "text": "<system-reminder>\nToday's date is 2026-12-03.\n</system-reminder>"}
    instructions = ("CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\nYour task is to create a detailed "
                    "summary of the conversation so far, paying close attention to the user's explicit requests.")
    with proxy.http() as http:
        http.post("/v1/messages?beta=true", headers=user, json={
            "model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": [
                reminder, {"type": "text", "text": "my cat is Tom", "cache_control": {"type": "ephemeral"}}]}]})
        compaction = {"model": "m", "max_tokens": 64000, "stream": False, "messages": [
            {"role": "user", "content": [reminder, {"type": "text", "text": "my cat is Tom"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello from Claude"}]},
            {"role": "user", "content": [
                {"type": "text", "text": "<local-command-caveat>Caveat: generated by local commands.</local-command-caveat>"}]},
            {"role": "user", "content": [{"type": "text", "text": "<command-name>/compact</command-name>"}]},
            {"role": "user", "content": [{"type": "text", "text": "my cat is Tom\n"},
                                         {"type": "text", "text": instructions, "cache_control": {"type": "ephemeral"}}]},
        ]}
        answered = http.post("/v1/messages?beta=true", headers=user, json=compaction)
        metrics = http.get("/metrics").text
    assert answered.status_code == 200 and answered.headers["x-memory-status"] == "off: side request"
    assert fake.messages_requests()[-1].json() == compaction  # forwarded as sent, no block
    assert rows(proxy, "SELECT role, content FROM messages ORDER BY seq") == [("user", "my cat is Tom"),
                                                                             ("assistant", "Hello from Claude")]
    assert 'memproxy_side_requests_total{rule="claude_code_compaction",wire="anthropic_messages"} 1.0' in metrics


CODEX_SESSION = "01a23c06-fee1-7af1-879a-a177bc555be4"
CODEX_ENVIRONMENT = ("<environment_context>\n  <cwd>/tmp/project</cwd>\n  <shell>bash</shell>\n"
                     "</environment_context>")


def codex_headers(request_kind: str, **extra: str) -> dict[str, str]:
    """The headers Codex CLI 0.169 sends to a custom provider (ids and workspace trimmed)."""
    metadata = {"session_id": CODEX_SESSION, "thread_id": CODEX_SESSION, "turn_id": "01a23c07-011b",
                "request_kind": request_kind, "thread_source": "user", "turn_trigger": "exec"}
    return {"X-Memory-User": "alice", "session-id": CODEX_SESSION, "thread-id": CODEX_SESSION,
            "originator": "codex_exec", "x-codex-beta-features": "remote_compaction_v2",
            "x-codex-turn-metadata": json.dumps(metadata, separators=(",", ":")), **extra}


def codex_body(*user_texts: str, history: list[dict] | None = None) -> dict:
    """A Codex request body: developer instructions, the environment context, then the history and prompt."""
    def message(role: str, kind: str, text: str) -> dict:
        return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}

    return {"model": "gpt-test", "stream": True, "store": False, "tool_choice": "auto", "parallel_tool_calls": False,
            "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": CODEX_SESSION, "tools": [],
            "input": [message("developer", "input_text", "You are a coding agent running in the Codex CLI."),
                      message("user", "input_text", CODEX_ENVIRONMENT), *(history or []),
                      *(message("user", "input_text", text) for text in user_texts)]}


COMPACTION_PROMPT = ("You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another LLM "
                     "that will resume the task.")
REVIEW_PROMPT = ("Review the current code changes (staged, unstaged, and untracked files) and provide prioritized "
                 "findings.")

CONSOLIDATION_PROMPT = ("Consolidate the supplied rollout summaries into `memory_summary.md` so another agent "
                        "understands the user, finds relevant prior work, and continues correctly.")


@pytest.mark.parametrize("kind, extra, body, rule", [
    ("compaction", {}, codex_body(COMPACTION_PROMPT, history=[
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "my dog is Rex"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello from Responses",
                                                              "annotations": []}]}]), "codex_not_a_turn"),
    ("turn", {"x-openai-subagent": "review", "x-codex-parent-thread-id": CODEX_SESSION},
     codex_body(REVIEW_PROMPT), "openai_subagent"),
    ("turn", {"x-openai-subagent": "memory_consolidation", "x-openai-memgen-request": "true"},
     codex_body(CONSOLIDATION_PROMPT), "openai_subagent"),
], ids=["compaction", "review", "memory-consolidation"])
def test_codex_side_requests_as_recorded_get_no_block_and_save_nothing(make_proxy, fake, kind, extra, body, rule):
    # The shapes Codex CLI 0.169 sent to a recording upstream: `codex exec resume` past
    # model_auto_compact_token_limit (a compaction), `codex exec review --uncommitted`, and
    # `codex exec --enable memories` consolidating earlier sessions.
    proxy = make_proxy(memory__commit_timeout_ms=5000, extraction__from_roles=[])
    with proxy.http() as http:
        turn = http.post("/v1/responses", headers=codex_headers("turn"), json=codex_body("my dog is Rex"))
        side = http.post("/v1/responses", headers=codex_headers(kind, **extra), json=body)
        metrics = http.get("/metrics").text
    assert turn.headers["x-memory-status"] == "ok"
    assert side.status_code == 200 and side.headers["x-memory-status"] == "off: side request"
    assert "event: response.completed" in side.text
    assert fake.responses_requests()[-1].json() == body  # forwarded as sent, no block
    assert rows(proxy, "SELECT role, content FROM messages ORDER BY seq") == [("user", "my dog is Rex"),
                                                                             ("assistant", "Hello from Responses")]
    assert f'memproxy_side_requests_total{{rule="{rule}",wire="openai_responses"}} 1.0' in metrics


GEMINI = "/models/gemini-3.5-flash-lite:generateContent"


def system_instruction(text: str) -> dict:
    return {"systemInstruction": {"role": "user", "parts": [{"text": text}]}, "contents": []}


# Gemini CLI 0.61's utility calls, their system instructions and prompts as its bundle writes them.
@pytest.mark.parametrize("case, expected", [
    (facts(GEMINI, body=system_instruction("\nYou are a specialized Task Routing AI. Your sole function is to "
                                           "analyze the user's request and assign a **Complexity Score**")),
     "gemini_cli_router"),
    # Only an instruction that begins with the router's words is the router's: one quoting them is a turn.
    (facts(GEMINI, body=system_instruction("You review prompts. Critique this one: 'You are a specialized Task "
                                           "Routing AI.'"), prompt="Is it too short?"), None),
    (facts(GEMINI, body={"systemInstruction": {"parts": [{"text": "Be brief."}, {
        "text": "You are a specialized Task Routing AI"}]}, "contents": []}), None),
    (facts(GEMINI, body=system_instruction("\nYou are a specialized system component responsible for distilling "
                                           "chat history into a structured XML <state_snapshot>.")),
     "gemini_cli_compression"),
    (facts(GEMINI, prompt="### State Update: Agent Continuity\n\nThe conversation history has been truncated."),
     "gemini_cli_history_summary"),
    (facts(GEMINI, body=system_instruction(
        "You are a diagnostic agent that determines whether a conversational AI assistant is stuck in an "
        "unproductive loop. Analyze the conversation history")), "gemini_cli_loop_detection"),
    (facts(GEMINI, body=system_instruction("\nYou are an expert code-editing assistant specializing in debugging "
                                           "and correcting failed search-and-replace operations.")),
     "gemini_cli_edit_corrector"),
    (facts(GEMINI, body=system_instruction("You are an expert code-editing assistant. Your task is to analyze a "
                                           "failed edit attempt and provide a corrected version of the text "
                                           "snippets.")), "gemini_cli_edit_corrector"),
    # An application may call its own assistant that too: only the corrector's own sentences are the CLI's.
    (facts(GEMINI, body=system_instruction("You are an expert code-editing assistant. Refactor the user's code "
                                           "to idiomatic Go."), prompt="my service is called ledgerd"), None),
    (facts(GEMINI, prompt="Analyze *only* the content and structure of your immediately preceding response (your "
                          "last turn in the conversation history)."), "gemini_cli_next_speaker"),
    (facts(GEMINI, prompt="Summarize the following tool output to be a maximum of 2000 tokens."),
     "gemini_cli_tool_summary"),
    (facts(GEMINI, prompt="Summarize the user's primary intent or goal in this conversation in ONE sentence (max "
                          "80 characters)."), "gemini_cli_session_summary"),
    # An application's own request for JSON output is a turn: asking for JSON says nothing of who asks.
    (facts(GEMINI, body={**system_instruction("Answer as JSON."),
                         "generationConfig": {"responseMimeType": "application/json"}},
           prompt="List my three favourite films"), None),
    (facts(GEMINI, prompt="please summarize the following tool output for me"), None),
])
def test_gemini_cli_rules(case, expected):
    assert DEFAULTS.match(case) == expected
