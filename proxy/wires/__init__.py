"""The wire protocols (Chat Completions, Responses, Anthropic Messages, Gemini): pure protocol code.

Each wire is a module that parses a request body into a transcript, puts a memory block into
it, reads the streamed or whole answer, and speaks tools mode's calls (`*_answer`, `*_tools`).
No memory, store, network or server import: the endpoint drives them.
"""
