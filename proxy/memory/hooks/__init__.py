"""Hooks (docs/hooks.md): a deployment's own policies, called at the points of a turn.

`runner` loads and calls the configured handlers; `turn_hooks` calls them at a turn's points
for the pipeline. It may import retrieval (the block and what a recall answers, to show a
hook what it would inject), redaction, the Store protocol and the shared layer; never the
pipeline or tools mode, which call it.
"""
