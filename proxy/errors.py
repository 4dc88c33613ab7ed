"""Errors memproxy makes itself; each maps to one status and an OpenAI-style body."""

from __future__ import annotations

import json


class ClientGone(Exception):
    """The client disconnected before the response was complete (not an error to answer)."""


class ProxyError(Exception):
    """An error answered by memproxy itself, never by the provider."""

    status = 500
    type = "server_error"
    code = "internal_error"
    headers: dict[str, str] = {}

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def body(self) -> bytes:
        """The OpenAI error body the SDK parses into its exception classes."""
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return json.dumps({"error": error}).encode()


class BadScope(ProxyError):
    """A malformed X-Memory-* header or id (400, the SDK does not retry)."""

    status, type, code = 400, "invalid_request_error", "invalid_memory_header"


class UnsupportedInToolsMode(ProxyError):
    """A request tools mode cannot serve (400, the SDK does not retry)."""

    status, type, code = 400, "invalid_request_error", "unsupported_in_tools_mode"


class Unauthenticated(ProxyError):
    """Missing or invalid identity (401)."""

    status, type, code = 401, "authentication_error", "invalid_memory_identity"


class Forbidden(ProxyError):
    """A scope claim that the authenticated identity does not allow (403)."""

    status, type, code = 403, "permission_error", "memory_scope_forbidden"


class ForeignSite(ProxyError):
    """A request trusted for coming from a local peer whose Host or Origin names another site: a web
    page in the user's browser (403)."""

    status, type, code = 403, "permission_error", "foreign_site"


class PolicyBlocked(ProxyError):
    """A user_prompt_submit hook refused the turn (403): a deployment's policy, never a fault."""

    status, type, code = 403, "permission_error", "blocked_by_policy"


class NotFound(ProxyError):
    """A path memproxy does not serve (404)."""

    status, type, code = 404, "invalid_request_error", "not_found"


class ProviderObjectNotFound(ProxyError):
    """A provider object another user created through memproxy, or one memproxy never saw
    created (404, as the provider answers an id it does not know)."""

    status, type, code = 404, "invalid_request_error", "provider_object_not_found"


class ProviderObjectsUnattributed(ProxyError):
    """An endpoint whose objects memproxy cannot tell apart by user, where they are kept per user (403)."""

    status, type, code = 403, "permission_error", "provider_objects_per_user"


class UnreadableReferences(ProxyError):
    """A body that may name provider objects but is no JSON memproxy can read, where objects are kept per user."""

    status, type, code = 400, "invalid_request_error", "unreadable_body"


class OwnershipUnavailable(ProxyError):
    """Who owns a named provider object cannot be read now (the store does not answer): 503, retried."""

    status, type, code = 503, "server_error", "provider_objects_unavailable"


# The rest of such a request's body is never read, so the connection cannot carry another.
_CLOSE = {"connection": "close"}


class RequestTimeout(ProxyError):
    """A request body that stopped arriving for server.body_timeout_s (408; the SDK retries)."""

    status, type, code = 408, "invalid_request_error", "request_timeout"
    headers = _CLOSE


class BodyTooLarge(ProxyError):
    """A request body over server.max_body_bytes (413, read no further)."""

    status, type, code = 413, "invalid_request_error", "request_too_large"
    headers = _CLOSE


class ShuttingDown(ProxyError):
    """The server stopped at the end of its grace period before this request was answered (503;
    the SDK retries, on another replica or the restarted one)."""

    status, type, code = 503, "server_error", "server_shutting_down"


class MemoryUnavailable(ProxyError):
    """memory.required is set and memory could not answer (503; the SDK retries)."""

    status, type, code = 503, "server_error", "memory_unavailable"


class UpstreamUnavailable(ProxyError):
    """The provider could not be reached (502; the SDK retries)."""

    status, type, code = 502, "upstream_error", "upstream_unavailable"


class UpstreamTimeout(ProxyError):
    """The provider did not answer in time (504; the SDK retries)."""

    status, type, code = 504, "upstream_error", "upstream_timeout"


class UpstreamConnectTimeout(ProxyError):
    """No connection to the provider within upstream.connect_timeout_s (504; the SDK retries)."""

    status, type, code = 504, "upstream_error", "upstream_connect_timeout"


class UpstreamProtocolError(ProxyError):
    """The provider's connection reset, closed or sent no HTTP before its headers (502; the SDK retries)."""

    status, type, code = 502, "upstream_error", "upstream_protocol_error"
