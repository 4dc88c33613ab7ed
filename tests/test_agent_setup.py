"""`memproxy setup claude-code|codex|gemini-cli` on real files in a temporary HOME: what it writes, what it
keeps, running twice, modes, --dry-run, --undo byte for byte, files that cannot be parsed, and
the auth modes where it writes nothing."""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path

import pytest

from proxy.agent_setup import AGENT_NAMES
from proxy.agent_setup.command import AGENTS
from proxy.cli import main

CLAUDE_SETTINGS = b"""{
    "model": "opus",
    "env": {
        "ANTHROPIC_BASE_URL": "https://gateway.example",
        "ANTHROPIC_CUSTOM_HEADERS": "X-Trace: on\\nX-Memory-User: old-me",
        "ANTHROPIC_API_KEY": "sk-ant-api03-Zq8vN2kR7tY4wP1mX6cB9dF3hJ5lS0aE-AbCdEfGh"
    },
    "permissions": {"allow": ["Bash(ls:*)"]}
}
"""

CODEX_CONFIG = b"""# my Codex settings
model = "gpt-5"           # the model I like
model_provider = "openai"

[profiles.fast]
model = "gpt-5-mini"

[model_providers.other]
name = "Other"
base_url = "https://other.example/v1"
"""


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    for name in ("CLAUDE_CONFIG_DIR", "CODEX_HOME", "GEMINI_CLI_HOME", "XDG_STATE_HOME", "MEMPROXY_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    return home


def setup(*args: str) -> int:
    return main(["setup", *args])


def test_every_agent_of_the_help_has_its_module():
    assert tuple(AGENTS) == AGENT_NAMES == ("claude-code", "codex", "gemini-cli")


def test_claude_code_gets_the_base_url_and_the_header_and_keeps_everything_else(home, capsys):
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_bytes(CLAUDE_SETTINGS)
    settings.chmod(0o640)
    assert setup("claude-code", "--user", "alice", "--url", "http://127.0.0.1:8080/") == 0
    out = capsys.readouterr().out
    assert "replacing env.ANTHROPIC_BASE_URL = \"https://gateway.example\"" in out
    written = json.loads(settings.read_bytes())
    original = json.loads(CLAUDE_SETTINGS)
    assert written == {**original, "env": {**original["env"], "ANTHROPIC_BASE_URL": "http://127.0.0.1:8080",
                                           "ANTHROPIC_CUSTOM_HEADERS": "X-Trace: on\nX-Memory-User: alice"}}
    assert list(written) == ["model", "env", "permissions"]  # order and indentation kept
    assert settings.read_text().startswith('{\n    "model": "opus",')
    assert stat.S_IMODE(settings.stat().st_mode) == 0o640
    assert not (home / ".claude.json").exists()  # no --mcp: the MCP list is not touched

    after = settings.read_bytes()
    assert setup("claude-code", "--user", "alice", "--url", "http://127.0.0.1:8080") == 0
    assert "nothing to change" in capsys.readouterr().out
    assert settings.read_bytes() == after

    assert setup("claude-code", "--undo") == 0
    assert settings.read_bytes() == CLAUDE_SETTINGS
    assert stat.S_IMODE(settings.stat().st_mode) == 0o640
    assert list((home / ".local" / "state" / "memproxy" / "setup").iterdir()) == []
    assert setup("claude-code", "--undo") == 0
    assert "nothing to undo" in capsys.readouterr().out


def test_claude_config_dir_is_honoured_and_new_files_are_0600_and_removed_by_undo(home, tmp_path, monkeypatch):
    config = tmp_path / "claude-config"
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(config))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert setup("claude-code", "--user", "bob", "--url", "http://memproxy.internal:9000", "--mcp") == 0
    settings, servers = config / "settings.json", config / ".claude.json"
    assert json.loads(settings.read_bytes()) == {"env": {"ANTHROPIC_BASE_URL": "http://memproxy.internal:9000",
                                                         "ANTHROPIC_CUSTOM_HEADERS": "X-Memory-User: bob"}}
    assert json.loads(servers.read_bytes()) == {"mcpServers": {"memproxy": {
        "type": "http", "url": "http://memproxy.internal:9000/mcp", "headers": {"X-Memory-User": "bob"}}}}
    assert {stat.S_IMODE(p.stat().st_mode) for p in (settings, servers)} == {0o600}
    assert not (home / ".claude").exists() and not (home / ".claude.json").exists()
    assert len(list((tmp_path / "state" / "memproxy" / "setup").iterdir())) == 2
    assert setup("claude-code", "--undo") == 0
    assert not settings.exists() and not servers.exists()


def test_undo_after_the_agent_rewrote_its_file_takes_out_only_what_setup_added(home):
    servers = home / ".claude.json"
    servers.write_text('{"numStartups": 3, "mcpServers": {"github": {"type": "http", "url": "https://gh.example"}}}')
    assert setup("claude-code", "--user", "alice", "--mcp") == 0
    # Claude Code rewrites its file as it runs: its own keys change, ours stay.
    doc = json.loads(servers.read_bytes())
    doc["numStartups"] = 4
    servers.write_text(json.dumps(doc, indent=2))
    assert setup("claude-code", "--undo") == 0
    assert json.loads(servers.read_bytes()) == {"numStartups": 4,
                                                "mcpServers": {"github": {"type": "http", "url": "https://gh.example"}}}
    assert not (home / ".claude" / "settings.json").exists()


def test_project_scope_writes_the_projects_local_settings_and_mcp_file(home, capsys):
    project = Path.cwd()
    assert setup("claude-code", "--user", "alice", "--project", "--mcp", "--url", "http://127.0.0.1:8080") == 0
    # The undo it names is the one for these files (without --project it finds nothing to undo).
    assert capsys.readouterr().out.endswith("`memproxy setup claude-code --project --undo` takes it back\n")
    assert json.loads((project / ".claude" / "settings.local.json").read_bytes())["env"]["ANTHROPIC_BASE_URL"] \
        == "http://127.0.0.1:8080"
    assert json.loads((project / ".mcp.json").read_bytes())["mcpServers"]["memproxy"]["url"] \
        == "http://127.0.0.1:8080/mcp"
    assert not (home / ".claude").exists()
    assert setup("claude-code", "--project", "--undo") == 0
    assert not (project / ".mcp.json").exists() and not (project / ".claude" / "settings.local.json").exists()


def test_a_file_that_cannot_be_parsed_is_an_error_and_nothing_is_written(home, capsys):
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text('{"env": {')
    servers = home / ".claude.json"
    servers.write_text("{}")
    assert setup("claude-code", "--user", "alice", "--mcp") == 2
    assert "is not valid JSON" in capsys.readouterr().err
    assert settings.read_text() == '{"env": {' and servers.read_text() == "{}"
    assert not (home / ".local").exists()


def test_a_file_that_cannot_be_written_is_an_error_and_no_other_file_is_written(home, capsys):
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_bytes(CLAUDE_SETTINGS)
    # The server list's file lives where nothing can be created (a directory of /proc): the
    # settings file, planned first, must not be written alone either.
    (home / ".claude.json").symlink_to("/proc/self/memproxy-test/claude.json")
    assert setup("claude-code", "--user", "alice", "--mcp") == 2
    err = capsys.readouterr().err
    assert err.startswith("memproxy setup: cannot write /proc/") and err.endswith("; nothing was written\n")
    assert settings.read_bytes() == CLAUDE_SETTINGS
    assert sorted(p.name for p in settings.parent.iterdir()) == ["settings.json"]  # no temporary file left
    assert not any(path.is_file() for path in (home / ".local").rglob("*"))


@pytest.mark.parametrize(("agent", "name", "content", "message"), [
    ("claude-code", ".claude/settings.json", '{"env": ["A=1"]}', "env must be an object"),
    ("codex", ".codex/config.toml", 'model_providers = "mine"\n', "model_providers must be a table")])
def test_a_value_where_setup_needs_a_table_is_an_error_and_nothing_is_written(home, capsys, agent, name, content,
                                                                                message):
    path = home / name
    path.parent.mkdir()
    path.write_text(content)
    assert setup(agent, "--user", "alice") == 2
    assert capsys.readouterr().err == (f"memproxy setup: {path}: {message} for setup to add its keys there; "
                                       "nothing was written\n")
    assert path.read_text() == content and not (home / ".local").exists()


def test_an_unreadable_undo_state_is_an_error_and_nothing_is_written(home, capsys):
    assert setup("claude-code", "--user", "alice") == 0
    settings = home / ".claude" / "settings.json"
    written = settings.read_bytes()
    (state,) = (home / ".local" / "state" / "memproxy" / "setup").iterdir()
    state.write_text("not json")
    capsys.readouterr()
    for args in (("--undo",), ("--user", "bob")):
        assert setup("claude-code", *args) == 2
        assert capsys.readouterr().err == (f"memproxy setup: {state} is not a memproxy setup state file this version "
                                           "reads; nothing was written\n")
    assert settings.read_bytes() == written and state.read_text() == "not json"


def test_dry_run_prints_the_change_with_keys_masked_and_writes_nothing(home, capsys):
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_bytes(CLAUDE_SETTINGS)
    assert setup("claude-code", "--user", "alice", "--dry-run") == 0
    out = capsys.readouterr().out
    assert '+        "ANTHROPIC_BASE_URL": "http://127.0.0.1:8080",' in out
    assert '"ANTHROPIC_API_KEY": "****"' in out and "sk-ant-api03" not in out
    assert settings.read_bytes() == CLAUDE_SETTINGS and not (home / ".local").exists()


def test_dry_run_masks_keys_under_any_spelling_of_their_name(home, capsys):
    # Values no secret pattern knows (a gateway's own keys), under names written as headers are.
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(json.dumps({"env": {"ANTHROPIC_CUSTOM_HEADERS": "x-api-key: gatewaysecret\nX-Trace: on"}}))
    assert setup("claude-code", "--user", "alice", "--dry-run") == 0
    out = capsys.readouterr().out
    assert '"ANTHROPIC_CUSTOM_HEADERS": "x-api-key: ****\\nX-Trace: on\\nX-Memory-User: alice"' in out
    config = home / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text('model_provider = "azure"\n\n[model_providers.azure]\n'
                      'http_headers = { "api-key" = "azuresecret" }\n')
    assert setup("codex", "--user", "alice", "--dry-run") == 0
    out = capsys.readouterr().out
    assert ' http_headers = { "api-key" = "****" }' in out
    assert "gatewaysecret" not in out and "azuresecret" not in out


def test_codex_gets_its_provider_with_the_rest_of_the_file_kept(home, capsys):
    config = home / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_bytes(CODEX_CONFIG)
    config.chmod(0o644)
    assert setup("codex", "--user", "alice", "--url", "http://127.0.0.1:8080") == 0
    assert 'replacing model_provider = "openai"' in capsys.readouterr().out
    text = config.read_text()
    assert text.startswith('# my Codex settings\nmodel = "gpt-5"           # the model I like\n')
    doc = tomllib.loads(text)
    assert doc["model_provider"] == "memproxy" and doc["profiles"] == {"fast": {"model": "gpt-5-mini"}}
    assert doc["model_providers"] == {
        "other": {"name": "Other", "base_url": "https://other.example/v1"},
        "memproxy": {"name": "memproxy", "base_url": "http://127.0.0.1:8080/v1", "wire_api": "responses",
                     "env_key": "OPENAI_API_KEY", "supports_websockets": False,
                     "http_headers": {"X-Memory-User": "alice"}}}
    assert stat.S_IMODE(config.stat().st_mode) == 0o644
    written = config.read_bytes()
    assert setup("codex", "--user", "alice", "--url", "http://127.0.0.1:8080") == 0
    assert config.read_bytes() == written
    assert setup("codex", "--undo") == 0
    assert config.read_bytes() == CODEX_CONFIG


def test_codex_home_is_honoured_and_mcp_registers_the_server(home, tmp_path, monkeypatch):
    codex_home = tmp_path / "codex-home"
    monkeypatch.setenv("CODEX_HOME", str(codex_home))
    assert setup("codex", "--user", "alice", "--mcp") == 0
    doc = tomllib.loads((codex_home / "config.toml").read_text())
    assert doc["mcp_servers"] == {"memproxy": {"url": "http://127.0.0.1:8080/mcp",
                                               "http_headers": {"X-Memory-User": "alice"}}}
    assert stat.S_IMODE((codex_home / "config.toml").stat().st_mode) == 0o600
    assert setup("codex", "--project") == 2  # Codex has no project-level provider
    assert setup("codex", "--undo") == 0
    assert not (codex_home / "config.toml").exists()


def test_undo_after_the_user_edited_config_toml_keeps_the_users_edits(home, capsys):
    config = home / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_bytes(CODEX_CONFIG)
    assert setup("codex", "--user", "alice", "--mcp") == 0
    # The user changes a value setup wrote and adds a comment at the end (under setup's last table).
    edited = config.read_text().replace('wire_api = "responses"', 'wire_api = "chat"') + "\n# keep: mine\n"
    config.write_text(edited)
    assert setup("codex", "--undo") == 0
    assert "model_providers.memproxy.wire_api was changed since setup; left as it is" in capsys.readouterr().out
    undone = config.read_text()
    assert undone.endswith("# keep: mine\n")
    providers = {"other": {"name": "Other", "base_url": "https://other.example/v1"}, "memproxy": {"wire_api": "chat"}}
    assert tomllib.loads(undone) == {**tomllib.loads(CODEX_CONFIG.decode()), "model_providers": providers}


@pytest.mark.parametrize("mode", ["api-keys", "signed"])
def test_in_api_keys_or_signed_mode_setup_explains_and_writes_nothing(home, monkeypatch, capsys, mode):
    monkeypatch.setenv("MEMPROXY_AUTH_MODE", mode)
    monkeypatch.setenv("MEMPROXY_AUTH_SIGNING_SECRET", "s" * 40)
    monkeypatch.setenv("MEMPROXY_AUTH_API_KEYS", '[{"key": "k-1234567890", "user": "alice"}]')
    for agent in ("claude-code", "codex", "gemini-cli"):
        assert setup(agent, "--user", "alice", "--mcp") == 1
        err = capsys.readouterr().err
        assert f"auth.mode: {mode}" in err and "Nothing was written." in err
        assert ("memproxy key" if mode == "api-keys" else "X-Memory-Scope-Token") in err
    assert os.listdir(home) == []


def test_a_url_with_a_path_is_refused(home, capsys):
    assert setup("claude-code", "--user", "alice", "--url", "http://127.0.0.1:8080/v1") == 2
    assert "root URL with no path" in capsys.readouterr().err
    assert setup("claude-code", "--user", "no/such user") == 2
    assert os.listdir(home) == []


GEMINI_ENV = b"""# my Gemini CLI
export GOOGLE_GEMINI_BASE_URL=https://gateway.example  # the team's gateway
GEMINI_API_KEY=AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW
GEMINI_CLI_CUSTOM_HEADERS="X-Trace: on, X-Memory-User: old-me"
"""


def gemini_env(text: bytes) -> dict[str, str]:
    """The variables a `.env` file gives, read the way Gemini CLI's dotenv reads these lines."""
    found = {}
    for line in text.decode().splitlines():
        if line.strip() and not line.startswith("#"):
            name, value = line.removeprefix("export ").split("=", 1)
            found[name] = value.split("  #")[0].strip().strip('"')
    return found


def test_gemini_cli_gets_its_env_file_and_the_api_key_auth_and_keeps_everything_else(home, capsys):
    folder = home / ".gemini"
    folder.mkdir()
    (folder / ".env").write_bytes(GEMINI_ENV)
    (folder / ".env").chmod(0o640)
    settings = b'{\n  "security": {"auth": {"selectedType": "oauth-personal"}},\n  "ui": {"theme": "Dracula"}\n}\n'
    (folder / "settings.json").write_bytes(settings)
    assert setup("gemini-cli", "--user", "alice", "--url", "http://127.0.0.1:8080") == 0
    out = capsys.readouterr().out
    assert 'replacing GOOGLE_GEMINI_BASE_URL = "https://gateway.example"' in out
    assert 'replacing security.auth.selectedType = "oauth-personal"' in out
    written = (folder / ".env").read_bytes()
    assert written == (b"# my Gemini CLI\nexport GOOGLE_GEMINI_BASE_URL=\"http://127.0.0.1:8080\"\n"
                       b"GEMINI_API_KEY=AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW\n"
                       b'GEMINI_CLI_CUSTOM_HEADERS="X-Trace: on, X-Memory-User: alice"\n')
    assert gemini_env(written)["GEMINI_CLI_CUSTOM_HEADERS"] == "X-Trace: on, X-Memory-User: alice"
    assert stat.S_IMODE((folder / ".env").stat().st_mode) == 0o640
    assert json.loads((folder / "settings.json").read_bytes()) == {
        "security": {"auth": {"selectedType": "gemini-api-key"}}, "ui": {"theme": "Dracula"}}
    assert setup("gemini-cli", "--user", "alice", "--url", "http://127.0.0.1:8080") == 0
    assert "nothing to change" in capsys.readouterr().out
    assert setup("gemini-cli", "--undo") == 0
    assert (folder / ".env").read_bytes() == GEMINI_ENV and (folder / "settings.json").read_bytes() == settings


def test_gemini_cli_home_is_honoured_new_files_are_0600_and_mcp_uses_http_url(home, tmp_path, monkeypatch):
    elsewhere = tmp_path / "gemini-home"
    monkeypatch.setenv("GEMINI_CLI_HOME", str(elsewhere))
    assert setup("gemini-cli", "--user", "alice", "--url", "http://127.0.0.1:9000", "--mcp") == 0
    env_file, settings = elsewhere / ".gemini" / ".env", elsewhere / ".gemini" / "settings.json"
    assert env_file.read_text() == ('GOOGLE_GEMINI_BASE_URL="http://127.0.0.1:9000"\n'
                                    'GEMINI_CLI_CUSTOM_HEADERS="X-Memory-User: alice"\n')
    assert json.loads(settings.read_text()) == {
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "mcpServers": {"memproxy": {"httpUrl": "http://127.0.0.1:9000/mcp", "headers": {"X-Memory-User": "alice"}}}}
    assert {stat.S_IMODE(p.stat().st_mode) for p in (env_file, settings)} == {0o600}
    assert not (home / ".gemini").exists()
    assert setup("gemini-cli", "--undo") == 0
    assert os.listdir(elsewhere / ".gemini") == []


def test_gemini_cli_project_scope_writes_the_projects_gemini_folder(home):
    assert setup("gemini-cli", "--user", "alice", "--project") == 0
    project = Path.cwd() / ".gemini"
    assert gemini_env((project / ".env").read_bytes()) == {
        "GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:8080", "GEMINI_CLI_CUSTOM_HEADERS": "X-Memory-User: alice"}
    assert json.loads((project / "settings.json").read_text())["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert not (home / ".gemini").exists()


def test_a_gemini_env_file_that_cannot_be_parsed_is_an_error_and_nothing_is_written(home, capsys):
    folder = home / ".gemini"
    folder.mkdir()
    (folder / ".env").write_text('GEMINI_CLI_CUSTOM_HEADERS="X-Trace: on,\nX-Other: 1"\n')
    assert setup("gemini-cli", "--user", "alice") == 2
    assert "is not a valid .env file (line 1 is not NAME=value)" in capsys.readouterr().err
    assert os.listdir(folder) == [".env"] and not (home / ".local").exists()


def test_gemini_cli_dry_run_masks_the_api_key_and_writes_nothing(home, capsys):
    folder = home / ".gemini"
    folder.mkdir()
    (folder / ".env").write_bytes(GEMINI_ENV)
    assert setup("gemini-cli", "--user", "alice", "--dry-run") == 0
    out = capsys.readouterr().out
    assert '+export GOOGLE_GEMINI_BASE_URL="http://127.0.0.1:8080"' in out
    assert " GEMINI_API_KEY=****" in out and "AIzaSy" not in out
    assert (folder / ".env").read_bytes() == GEMINI_ENV and os.listdir(folder) == [".env"]


def test_a_gemini_env_file_with_crlf_duplicates_and_no_final_newline_comes_back_byte_for_byte(home):
    env_file = home / ".gemini" / ".env"
    env_file.parent.mkdir()
    original = b"GOOGLE_GEMINI_BASE_URL=https://a.example\r\nDEBUG=1\r\nGOOGLE_GEMINI_BASE_URL='https://b.example'"
    env_file.write_bytes(original)
    assert setup("gemini-cli", "--user", "alice") == 0
    # The last assignment is the one dotenv keeps, so it is the one set; the file's line ending stays.
    assert env_file.read_bytes() == (b"GOOGLE_GEMINI_BASE_URL=https://a.example\r\nDEBUG=1\r\n"
                                     b'GOOGLE_GEMINI_BASE_URL="http://127.0.0.1:8080"\r\n'
                                     b'GEMINI_CLI_CUSTOM_HEADERS="X-Memory-User: alice"\r\n')
    assert setup("gemini-cli", "--undo") == 0
    assert env_file.read_bytes() == original


def test_a_provider_declared_with_a_dotted_key_still_gets_a_top_level_model_provider(home):
    # Another provider written as dotted keys, as TOML allows: the table setup adds goes after them, under
    # its own header, so neither model_provider nor the user's keys end up inside it.
    config = home / ".codex" / "config.toml"
    config.parent.mkdir()
    original = ('model = "gpt-5"\nmodel_providers.openrouter.base_url = "https://openrouter.ai/api/v1"\n'
                'model_providers.openrouter.name = "OpenRouter"\n\n[profiles.fast]\nmodel = "gpt-5-mini"\n')
    config.write_text(original)
    assert setup("codex", "--user", "alice", "--url", "http://127.0.0.1:8080") == 0
    assert config.read_text() == (
        'model = "gpt-5"\nmodel_providers.openrouter.base_url = "https://openrouter.ai/api/v1"\n'
        'model_providers.openrouter.name = "OpenRouter"\nmodel_provider = "memproxy"\n\n'
        '[profiles.fast]\nmodel = "gpt-5-mini"\n\n'
        '[model_providers.memproxy]\nname = "memproxy"\nbase_url = "http://127.0.0.1:8080/v1"\n'
        'wire_api = "responses"\nenv_key = "OPENAI_API_KEY"\nsupports_websockets = false\n'
        'http_headers = {X-Memory-User = "alice"}\n')
    doc = tomllib.loads(config.read_text())
    assert doc["model_provider"] == "memproxy"
    assert doc["model_providers"]["openrouter"] == {"base_url": "https://openrouter.ai/api/v1", "name": "OpenRouter"}
    written = config.read_bytes()
    assert setup("codex", "--user", "alice", "--url", "http://127.0.0.1:8080") == 0
    assert config.read_bytes() == written  # run twice, nothing changes
    assert setup("codex", "--undo") == 0
    assert config.read_text() == original


def test_a_providers_inline_table_gets_the_memproxy_provider_inline(home):
    # An inline table is closed: a [model_providers.memproxy] header after it would be invalid TOML.
    config = home / ".codex" / "config.toml"
    config.parent.mkdir()
    original = 'model_providers = { local = { base_url = "http://localhost:11434/v1" } }\n'
    config.write_text(original)
    assert setup("codex", "--user", "alice", "--url", "http://127.0.0.1:8080") == 0
    doc = tomllib.loads(config.read_text())
    assert doc == {"model_provider": "memproxy", "model_providers": {
        "local": {"base_url": "http://localhost:11434/v1"},
        "memproxy": {"name": "memproxy", "base_url": "http://127.0.0.1:8080/v1", "wire_api": "responses",
                     "env_key": "OPENAI_API_KEY", "supports_websockets": False,
                     "http_headers": {"X-Memory-User": "alice"}}}}
    assert config.read_text().startswith("model_providers = { local = ")
    written = config.read_bytes()
    assert setup("codex", "--user", "alice", "--url", "http://127.0.0.1:8080") == 0
    assert config.read_bytes() == written
    assert setup("codex", "--undo") == 0
    assert config.read_text() == original


STDIO_SERVER = (b'[mcp_servers.memproxy]\ncommand = "npx"\nargs = ["mcp-remote", "http://127.0.0.1:8080/mcp"]\n\n'
                b'[mcp_servers.github]\nurl = "https://gh.example/mcp"\n')


def test_setup_codex_mcp_replaces_an_earlier_stdio_memproxy_server_whole(home, capsys):
    config = home / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_bytes(STDIO_SERVER)
    assert setup("codex", "--user", "alice", "--mcp") == 0
    assert (f'{config}: replacing mcp_servers.memproxy = {{"command": "npx", "args": ["mcp-remote", '
            '"http://127.0.0.1:8080/mcp"]} (--undo restores it)') in capsys.readouterr().out
    # Codex refuses a server with both a command and a url.
    assert tomllib.loads(config.read_text())["mcp_servers"] == {
        "github": {"url": "https://gh.example/mcp"},
        "memproxy": {"url": "http://127.0.0.1:8080/mcp", "http_headers": {"X-Memory-User": "alice"}}}
    written = config.read_bytes()
    assert setup("codex", "--user", "alice", "--mcp") == 0
    assert config.read_bytes() == written
    assert setup("codex", "--undo") == 0
    assert config.read_bytes() == STDIO_SERVER


def test_undo_after_the_user_edited_config_toml_gives_the_stdio_server_back(home):
    config = home / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_bytes(STDIO_SERVER)
    assert setup("codex", "--user", "alice", "--mcp") == 0
    config.write_text("# mine\n" + config.read_text())
    assert setup("codex", "--undo") == 0
    assert config.read_text().startswith("# mine\n")
    assert tomllib.loads(config.read_text()) == tomllib.loads(STDIO_SERVER.decode())


GEMINI_SETTINGS_WITH_COMMENTS = b"""{
  // my theme
  "ui": {"theme": "GitHub"}, /* the one I like */
  "general": {
    "vimMode": true // since 2025
  }
}
"""


def test_gemini_clis_settings_with_comments_which_gemini_cli_reads_are_edited(home, capsys):
    # Gemini CLI reads settings.json through strip-json-comments: comments are valid there, and kept.
    settings = home / ".gemini" / "settings.json"
    settings.parent.mkdir()
    settings.write_bytes(GEMINI_SETTINGS_WITH_COMMENTS)
    assert setup("gemini-cli", "--user", "alice", "--mcp") == 0
    assert settings.read_text() == """{
  // my theme
  "ui": {"theme": "GitHub"}, /* the one I like */
  "general": {
    "vimMode": true // since 2025
  },
  "security": {
    "auth": {
      "selectedType": "gemini-api-key"
    }
  },
  "mcpServers": {
    "memproxy": {
      "httpUrl": "http://127.0.0.1:8080/mcp",
      "headers": {
        "X-Memory-User": "alice"
      }
    }
  }
}
"""
    written = settings.read_bytes()
    assert setup("gemini-cli", "--user", "alice", "--mcp") == 0
    assert settings.read_bytes() == written
    assert setup("gemini-cli", "--undo") == 0
    assert settings.read_bytes() == GEMINI_SETTINGS_WITH_COMMENTS


def test_undo_after_gemini_cli_rewrote_its_settings_keeps_the_comments(home):
    settings = home / ".gemini" / "settings.json"
    settings.parent.mkdir()
    settings.write_bytes(GEMINI_SETTINGS_WITH_COMMENTS)
    assert setup("gemini-cli", "--user", "alice") == 0
    settings.write_text(settings.read_text().replace('"GitHub"', '"Dracula"'))
    assert setup("gemini-cli", "--undo") == 0
    assert settings.read_bytes() == GEMINI_SETTINGS_WITH_COMMENTS.replace(b'"GitHub"', b'"Dracula"')


def test_claude_codes_settings_with_a_comment_are_not_json_and_nothing_is_written(home, capsys):
    # Claude Code reads its settings as plain JSON: a comment there is an error setup reports.
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text('{\n  // mine\n  "model": "opus"\n}\n')
    assert setup("claude-code", "--user", "alice") == 2
    assert f"memproxy setup: {settings} is not valid JSON (" in capsys.readouterr().err
    assert settings.read_text() == '{\n  // mine\n  "model": "opus"\n}\n' and not (home / ".local").exists()


def test_a_number_too_large_for_a_float_is_written_back_as_it_was(home):
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text('{"cleanupPeriodDays": 1e999, "feedbackSurveyRate": 0.10}\n')
    assert setup("claude-code", "--user", "alice") == 0
    assert settings.read_text() == ('{"cleanupPeriodDays": 1e999, "feedbackSurveyRate": 0.10, "env": '
                                    '{"ANTHROPIC_BASE_URL": "http://127.0.0.1:8080", '
                                    '"ANTHROPIC_CUSTOM_HEADERS": "X-Memory-User: alice"}}\n')


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_or_infinity_which_json_parse_refuses_is_an_error_and_nothing_is_written(home, capsys, constant):
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(f'{{"cleanupPeriodDays": {constant}}}\n')
    assert setup("claude-code", "--user", "alice") == 2
    assert capsys.readouterr().err == (f"memproxy setup: {settings} is not valid JSON ({constant} is no JSON number); "
                                       "nothing was written\n")
    assert settings.read_text() == f'{{"cleanupPeriodDays": {constant}}}\n' and not (home / ".local").exists()


def test_claude_codes_settings_keep_their_formatting_beside_setups_keys(home):
    # Only the members setup sets are written: an object kept on one line stays on one line.
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text('{\n  "permissions": {"allow": ["Bash(ls:*)"]},\n  "env": {"DEBUG": "1"}\n}\n')
    assert setup("claude-code", "--user", "alice") == 0
    assert settings.read_text() == ('{\n  "permissions": {"allow": ["Bash(ls:*)"]},\n  "env": {"DEBUG": "1", '
                                    '"ANTHROPIC_BASE_URL": "http://127.0.0.1:8080", '
                                    '"ANTHROPIC_CUSTOM_HEADERS": "X-Memory-User: alice"}\n}\n')
