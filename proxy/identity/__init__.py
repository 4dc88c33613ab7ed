"""Who is asking, and which turn a request is.

`scope` resolves the request's user, agent, session and memory mode from its headers and the
auth mode; `scope_token` verifies signed scope tokens; `side_requests` tells a coding
agent's side requests (titles, summaries, quota checks) from its turns; `turns` names the
turn a request continues (a retry, a tool loop's next step, a new turn). It may import the
shared layer and the wires' parsed shapes; never memory, the stores, the endpoint or HTTP.
"""
