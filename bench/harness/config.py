"""The config file a benchmark's memproxy runs with."""

from __future__ import annotations

from typing import Any

import yaml


def memproxy_config(upstream: str, log_level: str, store_url: str, hooks: list[dict[str, Any]] | None = None,
                    gemini: bool = False) -> str:
    """YAML for memproxy serving `store_url`, logging at `log_level`, with the mock at `upstream` (a `/v1`
    base) for every wire: the Messages wire's upstream is the same server; with `gemini`, the Gemini
    wire's too (without `/v1`; a memproxy from before that wire has no such key, hence only on demand).
    `hooks`: the `hooks:` list (docs/hooks.md)."""
    wires: dict[str, str] = {"anthropic_base_url": upstream}
    if gemini:
        wires["gemini_base_url"] = upstream.removesuffix("/v1")
    config: dict[str, Any] = {"server": {"log_level": log_level}, "store": {"url": store_url}, "upstream": wires}
    if hooks:
        config["hooks"] = hooks
    return yaml.safe_dump(config, sort_keys=False)
