"""Whether a request's Host and Origin name memproxy: the guard of every surface that trusts a local peer.

A loopback peer is trusted by the memory API without a token, by /mcp and by trusted mode's
scope headers. A browser on the user's machine is such a peer: a page of any site can post
to 127.0.0.1 (no CORS preflight for a form-like request), or resolve its own name to
127.0.0.1 (DNS rebinding) and read the answers as its own origin. Its Host and Origin still
name the page's site, so they are refused. SDKs, CLIs and agents send no Origin; a browser
always sends one with a POST, and with any request to another origin.
"""

from __future__ import annotations

import functools
import re
import socket

from proxy.settings import ServerSettings

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
_ANY_ADDRESS = ("0.0.0.0", "::", "[::]")
# uvicorn prints `http://0.0.0.0:PORT` when bound to every address, and a client on the machine
# may use that URL: allowed always, since a rebound page's Host is its own domain, never these.
_ANY_ADDRESS_HOSTS = ("0.0.0.0", "[::]")
_ROOT_DOT = re.compile(r"\.(?=(:\d*)?$)")


@functools.cache  # getfqdn may ask DNS: once a process, not once for each of the guards built at start
def _machine_names() -> tuple[str, ...]:
    """This machine's hostname and fully qualified name."""
    return tuple(sorted({socket.gethostname(), socket.getfqdn()} - {""}))


class RebindingGuard:
    """The Host and Origin values memproxy answers: loopback, the any-address names, server.host (bound to
    every address: the machine's hostname and FQDN), and server.allowed_* (`*`: any)."""

    def __init__(self, server: ServerSettings) -> None:
        names = [*LOOPBACK_HOSTS, *_ANY_ADDRESS_HOSTS]
        host = server.host
        if host in _ANY_ADDRESS:
            # Clients on the machine reach it by its own name too (it resolves to a loopback address).
            names.extend(_dns_form(name) for name in _machine_names())
        elif host not in names:
            names.append(f"[{host}]" if ":" in host else host)
        self._hosts = frozenset([*names, *(f"{name}:*" for name in names), *map(_dns_form, server.allowed_hosts)])
        self._origins = frozenset([f"{scheme}://{name}{port}" for scheme in ("http", "https") for name in names
                                   for port in ("", ":*")] + [_dns_form(origin) for origin in server.allowed_origins])

    def refusal(self, headers: list[tuple[bytes, bytes]], *, check_host: bool = True) -> str | None:
        """What is wrong with the request's Host or Origin; None when both are allowed.

        `check_host=False`: the Origin only, for a peer reached by names memproxy cannot list
        (auth.trusted_networks: compose service names, a load balancer's).
        """
        host = origin = None
        for name, value in headers:
            lower = name.lower()
            if lower == b"host":
                host = _dns_form(value.decode("latin-1"))
            elif lower == b"origin":
                origin = _dns_form(value.decode("latin-1"))
        # No browser sends a request without Host (an HTTP/1.0 client or a test's may).
        if check_host and host is not None and not _allowed(host, self._hosts):
            return ("the Host header names no address of memproxy (a web page's name rebound to it?); "
                    "add the name clients use to server.allowed_hosts as `name:*` (any port) or `name:port`")
        if origin is not None and not _allowed(origin, self._origins):
            return ("a web page of another origin may not use memproxy through its visitor's browser; "
                    "allow the origin with server.allowed_origins")
        return None


def _dns_form(value: str) -> str:
    """A Host or Origin as DNS reads its name: in any case, and with a root dot (`localhost.`) or without."""
    return _ROOT_DOT.sub("", value.lower())


def _allowed(value: str, allowed: frozenset[str]) -> bool:
    """`value` is an entry, or a `name:port` whose `name:*` is one, or `*` is one."""
    if value in allowed or "*" in allowed:
        return True
    name, colon, port = value.rpartition(":")
    return bool(colon) and port.isdigit() and f"{name}:*" in allowed
