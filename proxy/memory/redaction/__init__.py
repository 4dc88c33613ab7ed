"""Redaction: secrets found and cut out of text before anything is saved.

`redact` finds them; `secret_shapes` names the kinds; `confusables` and `lookalikes` fold
text written to hide a secret (invisibles, look-alike letters); `json_escapes` reads what
JSON-escaped text says. Pure functions of text: it imports nothing of memproxy but the
shared layer.
"""
