"""Memory: what to recall for a turn, what to save from it, and the policies around both.

`pipeline` is the one entry the endpoint calls (recall before forwarding, save after);
`writer` is the per-process write queue; `tools` is tools mode's two memory tools;
`breaker` and `kept_step` serve the pipeline. Its packages: `retrieval` (sources, fusion,
the block), `vectors` (embeddings and the vector index), `extraction` (entities and
relations out of text, pure), `learning` (extraction run and applied, over the writer),
`redaction` (secrets out before saving) and `hooks` (a deployment's policies). Memory sees transcripts and the Store protocol, never a
wire, the endpoint or the network.
"""
