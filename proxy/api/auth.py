"""Who may use the memory API (it reads any user's memory): the bearer of memory_api.token, else loopback only.

The API reads and deletes any user's memory, so it is never open: with no token
configured it answers only clients on the loopback interface (a sidecar's own pod), and
with one, only requests that carry it, from anywhere.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import MutableMapping
from typing import Any

from proxy.api.errors import InvalidRequest, MissingToken, NotLoopback
from proxy.identity.scope import DuplicateAuthorization, bearer


class ApiGuard:
    """Checks one request against the memory API's access rule."""

    def __init__(self, token: str | None) -> None:
        # Compared as digests, so the comparison takes the same time whatever the length.
        self._digest = hashlib.sha256(token.encode()).digest() if token else None

    def check(self, asgi_scope: MutableMapping[str, Any]) -> None:
        """Return when the request may go on; 401 or 403 otherwise."""
        if self._digest is None:
            if not is_loopback(asgi_scope.get("client")):
                raise NotLoopback("the memory API answers only loopback clients when memory_api.token is not set")
            return
        try:
            supplied = bearer(asgi_scope.get("headers", []))
        except DuplicateAuthorization as exc:
            raise InvalidRequest(str(exc), param="Authorization") from None
        if supplied is None:
            raise MissingToken("the memory API needs Authorization: Bearer <memory_api.token>")
        if not hmac.compare_digest(hashlib.sha256(supplied.encode()).digest(), self._digest):
            raise MissingToken("the memory API token is not valid")


def is_loopback(client: tuple[str, int] | list[Any] | None) -> bool:
    """True for a client address on the loopback interface (127.0.0.0/8, ::1)."""
    if not client:
        return False
    try:
        address = ipaddress.ip_address(str(client[0]))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # a dual-stack socket's view of an IPv4 client
    return address.is_loopback
