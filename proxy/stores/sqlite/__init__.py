"""The SQLite store (store.py): one file, one writer thread, reader threads, FTS5 and in-memory postings."""
