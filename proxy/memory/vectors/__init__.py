"""Vectors: embedding texts and searching them.

`local_model` is the embedded default model (weights from its wheel, no network);
`embedder` is the embedder protocol; `query` embeds one request's query, once, for every
source; `index` holds a user's vectors for the search; `filler` writes the vectors of
newly saved items. It imports the Store protocol, the shared layer and memory's
`background_task` only: nothing else of memory (import-linter holds it).
"""
