"""X-Memory-Scope-Token: an HS256 JWT an application's server signs to name a request's user.

Verification is PyJWT's, pinned to HS256, so a token's own header can never choose another
algorithm (`none`, or RS256 checked against the shared secret as if it were a public key).
Every failure is 401 with a message that says which rule the token broke.
"""

from __future__ import annotations

import re
from typing import Any

import jwt
from jwt.exceptions import InvalidSubjectError

from proxy.errors import Unauthenticated

ALGORITHM = "HS256"
_REQUIRED = ("exp", "sub")
# Three base64url segments and nothing else: Python's base64 decoder skips characters outside
# its alphabet, so without this `<token>!` or a token with spaces inside would verify.
_COMPACT_JWS = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
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
    return claims

