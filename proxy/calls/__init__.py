"""Calls memproxy makes on its own account, with its own key: the extraction model
(`extraction_model`), a provider's embeddings endpoint (`embeddings`) and HTTP hooks
(`http_hooks`). Each hands memory a plain callable, so memory never imports httpx; this
package joins the two: it imports HTTP and memory, and only the app, the command line and
the evaluation import it (import-linter holds it).
"""
