"""Retrieval benchmarks run through the proxy's own store, extraction and retrieval."""
