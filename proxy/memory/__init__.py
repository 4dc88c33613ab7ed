"""Memory: what to recall for a turn, what to save from it, and the policies around both.

`pipeline` is the one entry the endpoint calls (recall before forwarding, save after),
through `chat_memory`'s contract; `turns` names the turn a request continues (a retry, a
tool loop's next step, a new turn); `writer` is the per-process write queue; `tools` is
tools mode's two memory tools; `breaker` and `kept_step` serve the pipeline;
`background_task` starts and stops a background loop. Its
packages: `retrieval` (sources, fusion, the block), `vectors` (embeddings and the vector
index), `extraction` (entities and relations out of text, pure), `learning` (extraction
run and applied, over the writer) and `hooks` (a deployment's policies).

Memory may import identity (the request's scope), redaction, the Store protocol and the
shared layer; never a wire, HTTP, a concrete store, the endpoint or the network. Its
packages are layered: pipeline, chat_memory, tools, hooks, then retrieval, learning and
turns side by side, then extraction, then vectors, the writer, the breaker and kept steps,
then `background_task` (the start and stop the extraction worker and the vector filler share)
(import-linter holds both).
"""
