"""Who may see the dashboard and how a form proves it came from it.

* Access: when a token is configured (``PYALK_DASHBOARD_TOKEN``), every
  request must carry it, as ``Authorization: Bearer <token>`` (Prometheus,
  scripts) or as the password of HTTP basic auth with any user name (a
  browser's login prompt). Without a token the dashboard relies on binding
  127.0.0.1.
* CSRF: a random token in a ``SameSite=Strict`` cookie, echoed in a hidden
  field of every form (double submit); a POST whose field does not match the
  cookie, or whose Origin is another site, is refused with 403.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

CSRF_COOKIE = "pyalk_csrf"
CSRF_FIELD = "csrf"
TOKEN_ENV = "PYALK_DASHBOARD_TOKEN"


def _presented_token(headers: Headers) -> str | None:
    authorization = headers.get("authorization", "")
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2]
    return None


class TokenAuth:
    """ASGI middleware: 401 unless the request carries the token."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        presented = _presented_token(Headers(scope=scope))
        if presented is None or not hmac.compare_digest(presented.encode("utf-8"), self.token):
            response = PlainTextResponse("authentication required", status_code=401,
                                         headers={"WWW-Authenticate": 'Basic realm="pyalk", charset="UTF-8"'})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def new_csrf_token() -> str:
    return secrets.token_urlsafe(32)


def csrf_ok(cookie: str | None, field: str | None) -> bool:
    """The form's field matches the cookie (both present, constant time)."""
    if not cookie or not field:
        return False
    return hmac.compare_digest(cookie.encode("utf-8"), field.encode("utf-8"))


def same_origin(headers: Headers) -> bool:
    """No Origin (or Referer) header, or one naming this host."""
    origin = headers.get("origin") or headers.get("referer")
    if not origin or origin == "null":
        return origin != "null"
    return urlsplit(origin).netloc == headers.get("host", "")
