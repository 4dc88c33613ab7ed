"""Vectors: embedding texts and searching them.

`local_model` is the embedded default model (weights from its wheel, no network);
`embeddings` is the embedder protocol; `index` holds a user's vectors for the search;
`worker` writes the vectors of newly saved items. It imports the Store protocol and the
shared layer only.
"""
