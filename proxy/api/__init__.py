"""The memory API under /memory/v1: see, correct, export, import and erase a user's memory.

`routes` is the API's ASGI app (access rule, error bodies, one log line a request) over the
Store protocol; `auth` its access rule; `records`, `jsonl`, `cursors` and `schema` the
records, JSON Lines, paging and OpenAPI document; `search`, `injections` and `users` what a
user's memory says; `inspector` the page (files in `static/`). It may import memory,
identity, redaction, HTTP's plumbing and the Store protocol; never a concrete store, the chat
endpoint or /mcp, and only the app and the command line import it (import-linter holds it).
"""
