"""The stores: everything kept, behind one protocol (`base.Store`), on SQLite or PostgreSQL.

`base` is the protocol and the write operations; the backend-neutral modules beside it
(generations, graph merge, provenance, export records, vector SQL, ...) are shared by both
backends, `sqlite/` and `postgres/`, which never import each other. Stores know nothing of
memory, wires, the endpoint or the network.
"""
