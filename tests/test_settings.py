"""Settings: file, environment, flags, and errors that name the key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from proxy.settings import ConfigError, Settings, describe, load_settings

ROOT = Path(__file__).resolve().parent.parent


def test_full_example_lists_every_key_with_its_default():
    example = yaml.safe_load((ROOT / "config" / "full.yaml").read_text())
    assert example.pop("hooks") == []  # a list, not a section of keys (docs/hooks.md)
    listed = {f"{section}.{key}": value for section, values in example.items() for key, value in values.items()}
    documented = {key: default for key, default, _ in describe()}
    assert set(listed) == set(documented)
    loaded = load_settings(str(ROOT / "config" / "full.yaml"), environ={})
    # The file's relative SQLite path is read beside the file; every other value is the default.
    assert loaded.store.url == f"sqlite:///{ROOT / 'config' / 'memproxy.db'}"
    assert replace(loaded, store=replace(loaded.store, url=Settings().store.url)) == Settings()


def test_every_setting_has_help_text():
    assert all(help_text for _, _, help_text in describe())


def test_minimal_example_loads():
    settings = load_settings(str(ROOT / "config" / "minimal.yaml"), environ={})
    assert settings.upstream.base_url == "https://api.openai.com/v1"


def test_precedence_flag_env_file_default(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("server:\n  port: 7000\n  host: 0.0.0.0\nmemory:\n  max_memories: 4\n")
    env = {"MEMPROXY_SERVER_PORT": "7100", "MEMPROXY_MEMORY_API_TOKEN": "tok",
           "MEMPROXY_AUTH_TRUSTED_NETWORKS": '["10.0.0.0/8"]', "MEMPROXY_MEMORY_PERSIST_INTERACTIONS": "false"}
    settings = load_settings(str(config), environ=env, overrides={"server.port": 7200})
    assert settings.server.port == 7200
    assert settings.server.host == "0.0.0.0"
    assert settings.memory.max_memories == 4
    assert settings.memory.persist_interactions is False
    assert settings.memory_api.token == "tok"
    assert settings.auth.trusted_networks == ["10.0.0.0/8"]
    assert load_settings(str(config), environ=env).server.port == 7100


@pytest.mark.parametrize("text,message", [
    ("bogus:\n  x: 1\n", "bogus: unknown section"),
    ("server:\n  prot: 1\n", "server.prot: unknown key"),
    ("server:\n  port: eighty\n", "server.port: expected an integer"),
    ("server:\n  port: 70000\n", "server.port: must be at most 65535"),
    ("server:\n  header_timeout_s: 0\n", "server.header_timeout_s: must be greater than 0"),
    ("server:\n  max_connections: 0\n", "server.max_connections: must be greater than 0"),
    ("server:\n  max_header_bytes: 0\n", "server.max_header_bytes: must be greater than 0"),
    ("memory:\n  max_tokens: 0\n", "memory.max_tokens: must be greater than 0"),
    ("memory:\n  persist_interactions: sometimes\n", "memory.persist_interactions: expected true or false"),
    ("scope:\n  conversation: newest\n", "scope.conversation: must be one of history, latest"),
    ("upstream:\n  base_url: ftp://x\n", "upstream.base_url: must start with http"),
    ("store:\n  url: mysql://x\n", "store.url: must be sqlite"),
    ("auth:\n  trusted_networks: [not-a-net]\n", "auth.trusted_networks[0]"),
    ("auth:\n  mode: api-keys\n", "auth.api_keys: auth.mode api-keys needs"),
    ("auth:\n  mode: signed\n", "auth.signing_secret"),
    ("auth:\n  api_keys: [{key: k}]\n", "auth.api_keys[0]"),
    ("- a list\n", "expected a mapping of sections"),
    ("server: [1, 2]\n", "server: expected a mapping"),
    ("memory:\n  retry_window_s: .nan\n", "memory.retry_window_s: expected a finite number"),
    ("memory:\n  retry_window_s: .inf\n", "memory.retry_window_s: expected a finite number"),
    ("memory:\n  retry_window_s: 1e300\n", "memory.retry_window_s: must be at most 86400"),
    ("memory:\n  relevance_floor: .nan\n", "memory.relevance_floor: expected a finite number"),
    ("server:\n  grace_period_s: .inf\n", "server.grace_period_s: expected a finite number"),
    ("server:\n  host: ''\n", "server.host: must not be empty"),
    ("memory:\n  block_header: '  '\n", "memory.block_header: must not be empty"),
    ("auth:\n  token_audience: ''\n", "auth.token_audience: must not be empty"),
    ("store:\n  url: 'sqlite:///:memory:'\n", "store.url: an SQLite store needs a file path"),
    ("store:\n  url: 'sqlite:///'\n", "store.url: an SQLite store needs a file path"),
    ("server:\n  allowed_origins: ['https://ide.example/']\n", "server.allowed_origins[0]: must be http:// or https://"),
    ("server:\n  allowed_origins: [ide.example]\n", "server.allowed_origins[0]: must be http:// or https://"),
])
def test_bad_config_names_the_key(tmp_path, text, message):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_settings(str(config), environ={})


@pytest.mark.parametrize("user", ["*", "..", ".", "a b/c", "\u0430lice", "", "x" * 257, "alice\n"])
def test_an_api_key_user_the_headers_could_not_name_stops_start_up(tmp_path, user):
    # Rows saved under such a user could never be exported or deleted through the API or CLI.
    config = tmp_path / "keys.yaml"
    config.write_text(json.dumps({"auth": {"mode": "api-keys", "api_keys": [
        {"key": "k0", "user": "alice"}, {"key": "k1", "user": user}]}}))
    expected = (r"auth\.api_keys\[1\]: expected \{key, user\} with non-empty values" if user == "" else
                r"auth\.api_keys\[1\]\.user: must be 1-256 characters of ASCII letters, digits and \._:@\+-, got ")
    with pytest.raises(ConfigError, match=expected):
        load_settings(str(config), environ={})


def test_an_invalid_api_key_user_from_the_environment_stops_serve(tmp_path):
    env = {**os.environ, "MEMPROXY_AUTH_MODE": "api-keys",
           "MEMPROXY_AUTH_API_KEYS": json.dumps([{"key": "k1", "user": "*"}]),
           "MEMPROXY_STORE_URL": f"sqlite:///{tmp_path}/m.db"}
    run = subprocess.run([sys.executable, "-m", "proxy", "serve"], capture_output=True, text=True, timeout=30,
                         env=env)
    assert run.returncode == 2
    assert "auth.api_keys[0].user: must be 1-256 characters of ASCII letters, digits and ._:@+-, got '*'" in run.stderr


def test_the_largest_valid_api_key_user_loads():
    settings = load_settings(environ={}, overrides={"auth.mode": "api-keys", "auth.api_keys": [
        {"key": "k1", "user": "A-z0.9_:@+" + "u" * 246}]})
    assert len(settings.auth.api_keys[0]["user"]) == 256


def test_bad_environment_value_names_the_key_nan_and_empty_host_too():
    for env, message in (({"MEMPROXY_MEMORY_RETRY_WINDOW_S": "nan"}, "memory.retry_window_s: expected a finite"),
                         ({"MEMPROXY_SERVER_HOST": ""}, "server.host: must not be empty")):
        with pytest.raises(ConfigError, match=message):
            load_settings(environ=env)


def test_bad_environment_value_names_the_key():
    with pytest.raises(ConfigError, match="memory.retrieval_timeout_ms: expected an integer"):
        load_settings(environ={"MEMPROXY_MEMORY_RETRIEVAL_TIMEOUT_MS": "fast"})
    with pytest.raises(ConfigError, match="auth.api_keys: expected JSON"):
        load_settings(environ={"MEMPROXY_AUTH_API_KEYS": "[{oops"})


def test_cli_help_lists_commands_and_config_errors_exit_2(tmp_path):
    out = subprocess.run([sys.executable, "-m", "proxy", "--help"], capture_output=True, text=True, check=True)
    assert "serve" in out.stdout and "export" in out.stdout
    config = tmp_path / "bad.yaml"
    config.write_text("memory:\n  max_tokns: 5\n")
    run = subprocess.run([sys.executable, "-m", "proxy", "serve", "--config", str(config)],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 2
    assert "memory.max_tokns: unknown key" in run.stderr
