"""The PostgreSQL store (store.py): a connection pool, advisory locks per user, search inside the database."""
