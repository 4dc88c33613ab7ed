"""The chat endpoint: one request through identity, memory and the provider, on any wire.

`v1` routes each wire's paths and runs a request (scope, recall, forward, relay, save);
`steps` and `tools_step` run tools mode's loop; `ownership` with `provider_objects` keeps
provider objects per user where memproxy's key serves several. It may import every layer
below it (wires, identity, HTTP, memory, the Store protocol); only the app imports it, and it
never imports /mcp or the memory API (import-linter holds it).
"""
