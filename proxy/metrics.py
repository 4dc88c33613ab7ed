"""Prometheus metrics, one registry per app (no module-level state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


# The provider API's top-level routes: a request is counted under its route, so any number of
# item ids or made-up paths (from anyone, before authentication) adds no label value.
_ROUTES = frozenset({
    "assistants", "audio", "batches", "chat", "completions", "containers", "conversations", "embeddings",
    "evals", "files", "fine_tuning", "images", "messages", "models", "moderations", "organization", "realtime",
    "responses", "threads", "uploads", "vector_stores",
})
_OWN_LABELS = frozenset({"memory_api", "mcp", "other"})


def route_label(path: str) -> str:
    """The bounded label of a path after /v1: `/chat/completions` whole, else its first segment."""
    if path in _OWN_LABELS or path == "/chat/completions":
        return path
    first = path.lstrip("/").split("/", 1)[0]
    return f"/{first}" if first in _ROUTES else "other"


class Metrics:
    """The counters and histograms of /metrics (docs/operations.md)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("memproxy_requests", "Proxied requests by path and outcome",
                                ["path", "outcome"], registry=r)
        self.request_seconds = Histogram("memproxy_request_seconds", "Time to handle a proxied request",
                                         ["path"], buckets=_LATENCY_BUCKETS, registry=r)
        self.upstream_seconds = Histogram("memproxy_upstream_seconds",
                                          "Time from sending a request to the provider to its response headers",
                                          buckets=_LATENCY_BUCKETS, registry=r)
        self.retrieval_seconds = Histogram("memproxy_retrieval_seconds", "Retrieval time per source",
                                           ["source"], buckets=_LATENCY_BUCKETS, registry=r)
        self.injected = Counter("memproxy_memories_injected", "Memories injected into requests", registry=r)
        self.answers = Counter("memproxy_answers", "How each step of a turn with memory on ended: complete, "
                               "tool_calls, or why no answer was saved (upstream_failed, truncated, too_large, "
                               "client_aborted, unparseable, interrupted)", ["ending"], registry=r)
        self.stream_bad_events = Counter("memproxy_stream_bad_events", "Data lines of streamed answers that were "
                                         "not JSON: forwarded as they came, left out of the saved answer",
                                         registry=r)
        self.side_requests = Counter("memproxy_side_requests", "Requests matched by a scope.side_requests rule "
                                     "(no block, nothing saved), by rule and wire", ["rule", "wire"], registry=r)
        self.degraded = Counter("memproxy_memory_degraded", "Requests sent without memory because of a fault",
                                ["reason"], registry=r)
        self.write_failures = Counter("memproxy_persistence_failures", "Failed write batches, and database files "
                                      "found deleted or replaced under the store", registry=r)
        self.writes_dropped = Counter("memproxy_writes_dropped", "Writes dropped because the queue was full",
                                      registry=r)
        self.turns_dropped = Counter("memproxy_turns_dropped", "Turns that lost at least one write to a full "
                                     "queue (each counted once)", registry=r)
        self.extraction_failures = Counter("memproxy_extraction_failures", "Failed extraction attempts",
                                           registry=r)
        self.extraction_fallbacks = Counter("memproxy_extraction_fallbacks",
                                            "Model extractions that failed (timeout, error, bad answer): the rules' "
                                            "result was kept", registry=r)
        self.embedding_calls = Counter("memproxy_embedding_calls", "Calls to the embeddings endpoint by purpose "
                                       "(background, query) and outcome (ok, failed, skipped)",
                                       ["purpose", "outcome"], registry=r)
        self.embedded = Counter("memproxy_embedded_items", "Vectors saved by the background worker", registry=r)
        self.hook_failures = Counter("memproxy_hook_failures", "Hooks that raised, answered garbage, could not be "
                                     "reached or timed out (skipped; a failed pre_memory_write drops its save), "
                                     "by event and reason", ["event", "reason"], registry=r)
        self.mcp_calls = Counter("memproxy_mcp_calls", "Memory tool calls over /mcp by tool and outcome (ok, error, "
                                 "no_identity, unknown_tool, rebinding_refused)", ["tool", "outcome"], registry=r)
        self.queue_depth = Gauge("memproxy_queue_depth", "Pending items per queue", ["queue"], registry=r)
        self.circuit_open = Gauge("memproxy_circuit_open", "1 while the store circuit breaker is open",
                                  registry=r)
        self.searched_in_memory = Gauge("memproxy_search_memory_users",
                                        "Users whose searches of an index are answered from memory", ["index"],
                                        registry=r)

    def request_done(self, path: str, outcome: str, seconds: float) -> None:
        """Count one request under its route (`/files`, not `/files/file-abc`: labels must stay few)."""
        path = route_label(path)
        self.requests.labels(path, outcome).inc()
        self.request_seconds.labels(path).observe(seconds)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
