"""Who is asking: the scope a request names, and whether it is a side request.

`scope` resolves the request's user, agent, session and memory mode from its headers and the
auth mode (a proxy key, a signed token); `scope_token` verifies signed scope tokens;
`side_requests` tells a coding agent's side requests (titles, summaries, quota checks)
from its turns. It may import the shared layer and the wires' parsed shapes (`models`);
never memory, the stores, HTTP or anything above them (import-linter holds it).
"""
