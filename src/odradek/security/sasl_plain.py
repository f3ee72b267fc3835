"""SASL/PLAIN (RFC 4616), server and client, sans-I/O, with Kafka's PlainSaslServer behaviour.

One message from the client, UTF-8:

    message = [authzid] NUL authcid NUL passwd

Kafka splits on NUL into exactly three tokens (more or fewer: "Invalid SASL/PLAIN response:
expected 3 tokens, got N"), refuses an empty user name or password, checks the password against
the listener's JAAS `user_<name>="<password>"` options, and requires a non-empty authzid to equal
the user name. The server's answer is empty. Passwords are compared in constant time (on their
UTF-8 bytes), and an unknown user costs the same comparison as a wrong password.

PLAIN sends the password itself: use it only over TLS (SASL_SSL), as Kafka's documentation says.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping

from odradek.security.errors import AuthenticationError

PLAIN = "PLAIN"

# A password verifier: (user, password) -> accepted. Built from JAAS users by `users_verifier`.
PasswordVerifier = Callable[[str, str], bool]


def users_verifier(users: Mapping[str, str]) -> PasswordVerifier:
    """Check passwords against a fixed user → password map (the JAAS `user_*` options)."""
    encoded = {user: password.encode("utf-8") for user, password in users.items()}
    decoy = b"\0" * 32

    def verify(user: str, password: str) -> bool:
        expected = encoded.get(user)
        matches = hmac.compare_digest(password.encode("utf-8"), expected if expected else decoy)
        return expected is not None and matches

    return verify


class PlainServer:
    """One server-side PLAIN exchange: a single `evaluate` completes it or raises."""

    mechanism_name = PLAIN

    def __init__(self, verifier: PasswordVerifier) -> None:
        self._verify = verifier
        self._complete = False
        self._failed = False
        self.username = ""

    @property
    def complete(self) -> bool:
        return self._complete

    @property
    def authorization_id(self) -> str:
        if not self._complete:
            raise AuthenticationError("Authentication exchange has not completed")
        return self.username

    def evaluate(self, token: bytes) -> bytes:
        if self._complete or self._failed:
            raise AuthenticationError(
                "Authentication failed: unexpected SASL/PLAIN message",
                log_detail="PLAIN token after the exchange ended",
            )
        try:
            return self._evaluate(token)
        except AuthenticationError:
            self._failed = True
            raise

    def _evaluate(self, token: bytes) -> bytes:
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationError(
                "Invalid SASL/PLAIN response: not UTF-8", log_detail="PLAIN token is not UTF-8"
            ) from None
        tokens = text.split("\0", 3)
        if len(tokens) != 3:
            raise AuthenticationError(
                f"Invalid SASL/PLAIN response: expected 3 tokens, got {min(len(tokens), 4)}"
            )
        authzid, username, password = tokens
        if not username:
            raise AuthenticationError("Authentication failed: username not specified")
        if not password:
            raise AuthenticationError("Authentication failed: password not specified")
        if not self._verify(username, password):
            raise AuthenticationError(
                "Authentication failed: Invalid username or password",
                log_detail=f"PLAIN authentication of {username!r} failed",
            )
        if authzid and authzid != username:
            raise AuthenticationError(
                "Authentication failed: Client requested an authorization id that is different "
                "from username"
            )
        self.username = username
        self._complete = True
        return b""


def plain_client_message(username: str, password: str, authzid: str = "") -> bytes:
    """The client's one message."""
    return f"{authzid}\0{username}\0{password}".encode()
