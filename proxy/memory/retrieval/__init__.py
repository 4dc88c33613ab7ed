"""Retrieval: the sources searched for a query, their fusion, and the block they become.

`retriever` runs the sources in parallel within the budget; `base` holds what a recall is
asked and answers; `sources/` are the five sources, each fusing its lexical hits with the
query's vector (`sources/hybrid`); `fusion` merges the sources' hits by taking turns
within the budget; `keywords`, `sources/time_cues` and `trigger` read the query;
`admission` lets recalls in a few at a time; `exchange` adds a hit's neighbouring turns;
`block` renders the numbered lines. It may import vectors, redaction and extraction's
rules; never learning, hooks, tools or the pipeline (import-linter holds it).
"""
