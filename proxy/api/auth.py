"""Who may use the memory API (it reads any user's memory): the bearer of memory_api.token, else loopback only.

The API reads and deletes any user's memory, so it is never open: with no token
configured it answers only clients on the loopback interface (a sidecar's own pod), and
with one, only requests that carry it, from anywhere. A browser on the user's machine is
a loopback client too, so without a token a request whose Host or Origin names another
site (a web page's) is refused; with one, a page has no token to send.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import MutableMapping
from typing import Any

from proxy.api.errors import InvalidRequest, MissingToken, NotLoopback
from proxy.errors import ForeignSite
from proxy.identity.rebinding import RebindingGuard
from proxy.identity.scope import DuplicateAuthorization, bearer, is_loopback


class ApiGuard:
    """Checks one request against the memory API's access rule."""

    def __init__(self, token: str | None, rebinding: RebindingGuard) -> None:
        # Compared as digests, so the comparison takes the same time whatever the length.
        self._digest = hashlib.sha256(token.encode()).digest() if token else None
        self._rebinding = rebinding

    def check(self, asgi_scope: MutableMapping[str, Any]) -> None:
        """Return when the request may go on; 401 or 403 otherwise."""
        if self._digest is None:
            if not is_loopback(asgi_scope.get("client")):
                raise NotLoopback("the memory API answers only loopback clients when memory_api.token is not set")
            refused = self._rebinding.refusal(asgi_scope.get("headers", []))
            if refused is not None:
                raise ForeignSite(refused)
            return
        try:
            supplied = bearer(asgi_scope.get("headers", []))
        except DuplicateAuthorization as exc:
            raise InvalidRequest(str(exc), param="Authorization") from None
        if supplied is None:
            raise MissingToken("the memory API needs Authorization: Bearer <memory_api.token>")
        if not hmac.compare_digest(hashlib.sha256(supplied.encode()).digest(), self._digest):
            raise MissingToken("the memory API token is not valid")

