"""`memproxy demo`: memory seen working with no provider key.

It owns a small echo provider (an upstream that answers with what it received, so the block
memproxy injected is visible) and the tour that talks to memproxy through it. It imports
the app and settings like the command line does, and retrieval's block (the echo provider
finds it in what it received); only the command line imports it (import-linter holds it).
"""
