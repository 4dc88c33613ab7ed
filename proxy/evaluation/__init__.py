"""Retrieval benchmarks (LoCoMo) run through the proxy's own store, extraction and retrieval.

It builds the parts the app builds (a SQLite store, the writer, extraction, vectors, the
retriever) for each conversation, asks the questions, and scores the blocks. It may import
memory, the SQLite store and memproxy's own calls (embeddings); only the command line
imports it (import-linter holds it).
"""
