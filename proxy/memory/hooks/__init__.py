"""Hooks (docs/hooks.md): a deployment's own policies, called at the points of a turn.

`runner` loads and calls the configured handlers; `turn_hooks` calls them at a turn's points
for the pipeline. It may import retrieval's block (to render what a hook sees) and the
Store protocol.
"""
