"""HTTP plumbing between clients, memproxy and the provider: no memory in it.

It owns the connection cap and the body deadline (`connections`, `body_deadline`), the
upstream connection pool and its credentials (`upstream`, `transport`), relaying a provider
answer to the client as it arrives (`relay`, `responses`). It may import the shared layer
(settings, models, errors, ids, metrics, logs) and the wires; never memory, the stores, the
endpoint or the API.
"""
