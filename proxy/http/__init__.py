"""HTTP plumbing between clients, memproxy and the provider: no memory in it.

It owns the connection cap and the body deadline (`connections`, `body_deadline`), ASGI
plumbing (`asgi`: bounded body reads, error answers, the disconnect watch), the upstream
connection pool and its credentials (`upstream`, `transport`), and relaying a provider's
answer to the client as it arrives (`responses`). It may import the shared layer (settings,
models, errors, ids, metrics) and the wires; never memory, the stores, identity, the logs or
anything above them (import-linter holds it).
"""
