"""The PostgreSQL store (store.py): a connection pool, advisory locks per user, search inside the database.

Split by role as the SQLite store is. It may import the Store protocol and the
backend-neutral store modules beside it, and the shared layer; never the SQLite backend,
and only the app imports it (import-linter holds it).
"""
