"""Retrieval: the sources searched for a query, their fusion, and the block they become.

`retriever` runs the sources in parallel within the budget; `sources/` are the five sources;
`hybrid` and `fusion` mix lexical and vector scores; `keywords`, `time_cues` and `trigger`
read the query; `admission` lets recalls in a few at a time; `exchange` adds a hit's
neighbouring turns; `block` renders the numbered lines. It may import vectors, redaction and extraction's
rules; never learning, hooks, tools or the pipeline.
"""
