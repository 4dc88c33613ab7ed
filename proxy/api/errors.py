"""Errors of the memory API, each one status and an OpenAI-style body, so one client handles both."""

from __future__ import annotations

from proxy.errors import ProxyError


class InvalidRequest(ProxyError):
    """A body, query parameter or path id the API cannot accept (400)."""

    status, type, code = 400, "invalid_request_error", "invalid_request"


class MissingToken(ProxyError):
    """No or a wrong memory API token (401)."""

    status, type, code = 401, "authentication_error", "invalid_memory_api_token"


class NotLoopback(ProxyError):
    """No token is configured and the client is not on loopback (403)."""

    status, type, code = 403, "permission_error", "memory_api_loopback_only"


class WriteBlocked(ProxyError):
    """A pre_memory_write hook kept a memory out (or failed, which keeps it out too) (403)."""

    status, type, code = 403, "permission_error", "blocked_by_policy"


class ItemNotFound(ProxyError):
    """The user has no such item (404)."""

    status, type, code = 404, "invalid_request_error", "not_found"


class MethodNotAllowed(ProxyError):
    """The path exists, the method does not (405)."""

    status, type, code = 405, "invalid_request_error", "method_not_allowed"


class Conflict(ProxyError):
    """The change would clash with another item of the user (409)."""

    status, type, code = 409, "invalid_request_error", "conflict"


class PayloadTooLarge(ProxyError):
    """A body over the endpoint's limit (413)."""

    status, type, code = 413, "invalid_request_error", "request_too_large"


class UnsupportedMediaType(ProxyError):
    """A body sent with another Content-Type than the endpoint takes (415)."""

    status, type, code = 415, "invalid_request_error", "unsupported_media_type"


class StoreUnavailable(ProxyError):
    """The store failed; the request can be retried (503)."""

    status, type, code = 503, "server_error", "store_unavailable"
