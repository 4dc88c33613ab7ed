"""The memory tools over MCP at /mcp: `endpoint` mounts the streamable-HTTP transport behind
memproxy's own identity and host checks; `tools_server` declares the tools (the MCP SDK is
imported only when /mcp is first used). It may import memory, identity, redaction and HTTP's
ASGI plumbing; only the app mounts it, and it never imports the chat endpoint or the memory
API (import-linter holds both).
"""
