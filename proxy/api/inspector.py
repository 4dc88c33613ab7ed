"""GET /memory/ui/: the inspector page (docs/inspector.md), static files shipped in the package.

The files hold no data: the page asks the memory API for everything, with the token the
operator types into it, so serving them needs no token. Memory text is hostile input, so
every file goes out under a Content-Security-Policy that allows only this origin's own
files (no inline script, nothing from another origin, no framing). Without a memory API
token the page is for loopback's browser, and a Host or Origin naming another site (a web
page's name rebound to this address) is refused, as the API itself refuses it.
"""

from __future__ import annotations

from importlib import resources

from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope

from proxy.errors import ForeignSite, NotFound
from proxy.http.asgi import send_error
from proxy.identity.rebinding import RebindingGuard

POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self';"
          " object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = (
    (b"content-security-policy", POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
)
FILES = {"": ("index.html", "text/html; charset=utf-8"),
         "inspector.js": ("inspector.js", "text/javascript; charset=utf-8"),
         "inspector.css": ("inspector.css", "text/css; charset=utf-8")}


class Inspector:
    """Pure ASGI: the page's few files, read once from the package when the app is built."""

    def __init__(self, rebinding: RebindingGuard | None) -> None:
        """`rebinding`: the Host and Origin check, where no token guards the API (None: a token does)."""
        self.rebinding = rebinding
        static = resources.files("proxy.api").joinpath("static")
        self.files = {path: (static.joinpath(name).read_bytes(), media)
                      for path, (name, media) in FILES.items()}

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        found = self.files.get(scope["path"].removeprefix(scope.get("root_path", "")).lstrip("/"))
        if found is None or scope["method"] not in ("GET", "HEAD"):
            await send_error(send, NotFound("no such path"))
            return
        refused = self.rebinding.refusal(scope["headers"]) if self.rebinding is not None else None
        if refused is not None:
            await send_error(send, ForeignSite(refused))
            return
        body, media = found
        headers = [(b"content-type", media.encode()), (b"content-length", str(len(body)).encode()), *HEADERS]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})
