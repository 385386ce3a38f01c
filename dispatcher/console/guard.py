"""Who may act: the console's token, its session cookie, and the CSRF checks on every write.

Without a token the console is read-only: every action is refused. With one,
a person signs in by typing it; the console then sets two cookies, both
``SameSite=Strict``: an HttpOnly session (a random nonce and its HMAC under a
key made at start, so nothing is stored and a restart signs everyone out) and
a CSRF token bound to that session, which the page echoes in the
``X-Console-CSRF`` header of each action (a signed double submit). Every POST
must also come from the console's own origin (``Origin`` names the host the
request was sent to). Pure functions of the request's headers and cookies.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

__all__ = ["CSRF_COOKIE", "CSRF_HEADER", "SESSION_COOKIE", "Guard", "Refused"]

SESSION_COOKIE = "console_session"
CSRF_COOKIE = "console_csrf"
CSRF_HEADER = "X-Console-CSRF"


class Refused(Exception):
    """A request the guard turns away; the message is safe to show (it names no secret)."""

    def __init__(self, message: str, *, status: int = 403) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Guard:
    token: str | None
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    @property
    def read_only(self) -> bool:
        return not self.token

    def _sign(self, purpose: str, nonce: str) -> str:
        return hmac.new(self.key, f"{purpose}:{nonce}".encode(), hashlib.sha256).hexdigest()

    def sign_in(self, offered: str) -> tuple[str, str]:
        """The session and CSRF cookie values for a correct token; ``Refused`` otherwise."""
        if self.token is None:
            raise Refused("this console is read-only: start it with --token to allow actions")
        if not hmac.compare_digest(offered.encode(), self.token.encode()):
            raise Refused("wrong token", status=401)
        nonce = secrets.token_hex(16)
        return f"{nonce}.{self._sign('session', nonce)}", self._sign("csrf", nonce)

    def _nonce(self, session: str | None) -> str | None:
        nonce, _, mac = (session or "").partition(".")
        if nonce and hmac.compare_digest(mac, self._sign("session", nonce)):
            return nonce
        return None

    def signed_in(self, cookies: Mapping[str, str]) -> bool:
        return not self.read_only and self._nonce(cookies.get(SESSION_COOKIE)) is not None

    def check_origin(self, headers: Mapping[str, str]) -> None:
        """A write must come from a page of this console: ``Origin`` names our own host."""
        origin, host = headers.get("Origin"), headers.get("Host")
        if not origin or not host:
            raise Refused("refused: the request carries no Origin (send it from the console)")
        if urlsplit(origin).netloc.lower() != host.lower():
            raise Refused("refused: cross-origin request")

    def check_action(self, headers: Mapping[str, str], cookies: Mapping[str, str]) -> None:
        """An action: our origin, a valid session, and its CSRF token echoed in the header."""
        if self.read_only:
            raise Refused("this console is read-only: start it with --token to allow actions")
        self.check_origin(headers)
        nonce = self._nonce(cookies.get(SESSION_COOKIE))
        if nonce is None:
            raise Refused("sign in with the console's token first", status=401)
        echoed = headers.get(CSRF_HEADER, "")
        expected = self._sign("csrf", nonce)
        if not (
            hmac.compare_digest(echoed, expected)
            and hmac.compare_digest(cookies.get(CSRF_COOKIE, ""), expected)
        ):
            raise Refused("refused: missing or wrong CSRF token (reload the page)")
