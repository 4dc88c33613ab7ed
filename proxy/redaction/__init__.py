"""Redaction: secrets found and cut out of text before anything is saved or logged.

`redact` finds them; `secret_shapes` names the kinds; `confusables` and `lookalikes` fold
text written to hide a secret (invisibles, look-alike letters); `json_escapes` reads what
JSON-escaped text says. Pure functions of text, part of the shared layer (memory, the logs,
the memory API and `memproxy setup` all use it): it imports nothing of memproxy above it,
and no I/O (import-linter holds it).
"""
