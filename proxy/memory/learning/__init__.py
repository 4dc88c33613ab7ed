"""What memory learns from a saved turn: extraction run and applied.

`worker` applies the extraction queue (claims leased to one process at a time);
`inline_facts` applies the rules' facts of a turn right after its commit, and
`pending_facts` lets a request wait briefly for its user's facts still being applied;
`facts` turns an extraction into the store's write; `extractors` picks the rules or the
model. The rules themselves are `extraction/` (pure functions of text); this package is
the async plumbing around them. It may import extraction, the writer, redaction and the
Store protocol; never retrieval, hooks or the pipeline (import-linter holds it).
"""
