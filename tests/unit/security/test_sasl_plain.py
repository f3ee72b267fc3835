"""SASL/PLAIN with Kafka's PlainSaslServer rules."""

from __future__ import annotations

import pytest

from odradek.security.errors import AuthenticationError
from odradek.security.sasl_plain import PlainServer, plain_client_message, users_verifier

USERS = users_verifier({"admin": "admin-secret", "alice": "alice-secret"})


def test_success_with_and_without_authzid() -> None:
    for message in (b"\0alice\0alice-secret", b"alice\0alice\0alice-secret"):
        server = PlainServer(USERS)
        assert server.evaluate(message) == b""
        assert server.complete and server.authorization_id == "alice"
    assert plain_client_message("alice", "pw") == b"\0alice\0pw"


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (b"alice\0alice-secret", "expected 3 tokens, got 2"),
        (b"\0alice\0alice-secret\0x", "expected 3 tokens, got 4"),
        (b"\0\0pw", "username not specified"),
        (b"\0alice\0", "password not specified"),
        (b"\0alice\0wrong", "Invalid username or password"),
        (b"\0mallory\0alice-secret", "Invalid username or password"),
        (b"bob\0alice\0alice-secret", "authorization id that is different"),
        (b"\0\xff\0x", "not UTF-8"),
    ],
)
def test_refusals(message: bytes, error: str) -> None:
    server = PlainServer(USERS)
    with pytest.raises(AuthenticationError, match=error):
        server.evaluate(message)
    assert not server.complete
    with pytest.raises(AuthenticationError):
        server.evaluate(b"\0alice\0alice-secret")
