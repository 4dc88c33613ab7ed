"""X-Memory-Scope-Token: an HS256 JWT an application's server signs to name a request's user.

Verification is PyJWT's, pinned to HS256, so a token's own header can never choose another
algorithm (`none`, or RS256 checked against the shared secret as if it were a public key).
Every failure is 401 with a message that says which rule the token broke.

PyJWT reads a time claim with `int()` and a JSON object with its last value for a key, so
a verified token is read once more, strictly: a time claim must be a JSON number (`"exp":
"9999999999"` is a string, whatever it spells), and no object may name a key twice (`"sub":
"alice", "sub": "bob"` names two users, and another reader would take the first).
"""

from __future__ import annotations

import json
import re
from typing import Any

import jwt
from jwt.exceptions import InvalidSubjectError
from jwt.utils import base64url_decode

from proxy.errors import Unauthenticated

ALGORITHM = "HS256"
_REQUIRED = ("exp", "sub")
# Three base64url segments and nothing else: Python's base64 decoder skips characters outside
# its alphabet, so without this `<token>!` or a token with spaces inside would verify.
_COMPACT_JWS = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
_TIMES = ("exp", "nbf", "iat")
_MISSING = {
    "exp": "the scope token needs an exp claim (a time in unix seconds)",
    "sub": "the scope token has no subject",
    "aud": "the scope token needs an aud claim naming auth.token_audience",
}


def verify_scope_token(token: str, secret: bytes, audience: str | None = None) -> dict[str, Any]:
    """The claims of `token`; 401 when it is forged, malformed, expired, not HS256, without
    `exp` or `sub`, or meant for another audience."""
    if not _COMPACT_JWS.fullmatch(token):
        raise Unauthenticated("the scope token is malformed")
    try:
        claims: dict[str, Any] = jwt.decode(
            token, secret, algorithms=[ALGORITHM], audience=audience,
            options={"require": list(_REQUIRED), "strict_aud": False},
        )
    except jwt.MissingRequiredClaimError as exc:
        raise Unauthenticated(_MISSING.get(exc.claim, f"the scope token needs a {exc.claim} claim")) from None
    except jwt.ExpiredSignatureError:
        raise Unauthenticated("the scope token has expired") from None
    except jwt.InvalidSignatureError:
        raise Unauthenticated("the scope token's signature is invalid") from None
    except jwt.InvalidAlgorithmError:
        raise Unauthenticated("the scope token must be an HS256 JWT") from None
    except jwt.InvalidAudienceError:
        raise Unauthenticated("the scope token is meant for another audience (aud)") from None
    except InvalidSubjectError:
        raise Unauthenticated("the scope token's sub claim must be a string") from None
    except jwt.ImmatureSignatureError:
        raise Unauthenticated("the scope token is not valid yet (nbf or iat is in the future)") from None
    except jwt.DecodeError:
        # Also PyJWT's answer to an exp that is not a number (NaN, a list).
        raise Unauthenticated("the scope token is malformed") from None
    except jwt.PyJWTError:
        raise Unauthenticated("the scope token is invalid") from None
    for segment in token.split(".")[:2]:  # its header and its claims, both signed
        json.loads(base64url_decode(segment), object_pairs_hook=_each_key_once)
    for claim in _TIMES:
        if claim in claims and (isinstance(claims[claim], bool) or not isinstance(claims[claim], (int, float))):
            raise Unauthenticated(f"the scope token's {claim} claim must be a number (unix seconds)")
    return claims


def _each_key_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members, unless it names a key twice."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise Unauthenticated(f"the scope token names {key!r} twice")
        seen.add(key)
    return dict(pairs)

