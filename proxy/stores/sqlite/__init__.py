"""The SQLite store (store.py): one file, one writer thread, reader threads, FTS5 and in-memory postings.

Split by role (store, schema, rows, search, facts, queue, processes, import_records, admin, ...).
It may import the Store protocol and the backend-neutral store modules beside it, and the
shared layer; never the PostgreSQL backend, and only the app and the evaluation import it
(import-linter holds it).
"""
