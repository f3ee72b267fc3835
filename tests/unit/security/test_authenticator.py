"""The SASL connection state machine, fed encoded frames as a connection would."""

from __future__ import annotations

from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from odradek.protocol.build import build
from odradek.protocol.codec import (
    RequestHeader,
    encode_request,
    parse_request_header,
    request_class,
    response_class,
)
from odradek.security.authenticator import (
    Authenticated,
    Close,
    Proceed,
    SaslServerAuthenticator,
    SaslState,
    SendResponse,
    SendToken,
)
from odradek.security.principal import KafkaPrincipal
from odradek.security.sasl_plain import PlainServer, plain_client_message, users_verifier
from odradek.security.sasl_scram import ScramClient, ScramServer
from odradek.security.scram import ScramMechanism, generate_credential

SHA512 = ScramMechanism.SCRAM_SHA_512
USERS = users_verifier({"alice": "alice-pw", "bob": "bob-pw"})
CREDENTIALS = {"alice": generate_credential(SHA512, "alice-pw")}
correlation = iter(range(1, 10_000))


def request_frame(api_key: int, version: int, values: dict[str, Any]) -> bytes:
    body = build(request_class(api_key, version), values)
    return encode_request(api_key, version, next(correlation), "test", body)[4:]


def api_versions(header: RequestHeader, frame: bytes) -> Any:
    del frame
    if header.api_version > 3:
        return build(response_class(18, 0), {"error_code": ErrorCode.unsupported_version})
    return build(response_class(18, header.api_version), {"error_code": ErrorCode.none})


def authenticator(**kwargs: Any) -> SaslServerAuthenticator:
    return SaslServerAuthenticator(
        {
            "PLAIN": lambda: PlainServer(USERS),
            "SCRAM-SHA-512": lambda: ScramServer(SHA512, CREDENTIALS.get),
        },
        api_versions,
        client_address="10.0.0.9",
        **kwargs,
    )


def handshake(mechanism: str, version: int = 1) -> bytes:
    return request_frame(17, version, {"mechanism": mechanism})


def authenticate(token: bytes, version: int = 2) -> bytes:
    return request_frame(36, version, {"auth_bytes": token})


def response_of(actions: list[Any]) -> Any:
    assert isinstance(actions[0], SendResponse)
    return actions[0].response


def test_framed_plain_after_api_versions() -> None:
    auth = authenticator(connections_max_reauth_ms=60_000)
    assert auth.authenticating
    response = response_of(
        auth.receive_frame(
            request_frame(18, 3, {"client_software_name": "x", "client_software_version": "1"}), 0
        )
    )
    assert response.error_code == ErrorCode.none and auth.state is SaslState.HANDSHAKE
    response = response_of(auth.receive_frame(handshake("PLAIN"), 0))
    assert response.error_code == ErrorCode.none and list(response.mechanisms) == [
        "PLAIN",
        "SCRAM-SHA-512",
    ]
    actions = auth.receive_frame(authenticate(plain_client_message("alice", "alice-pw")), 1000)
    assert response_of(actions).error_code == ErrorCode.none
    assert response_of(actions).session_lifetime.total_seconds() == 60
    assert actions[1] == Authenticated(KafkaPrincipal.user("alice"), "PLAIN", 60_000, False)
    assert not auth.authenticating and auth.session_expiry_ms == 61_000


def test_unsupported_api_versions_version_may_be_retried() -> None:
    auth = authenticator()
    response = response_of(auth.receive_frame(_api_versions_v9(), 0))
    assert response.error_code == ErrorCode.unsupported_version
    assert auth.state is SaslState.HANDSHAKE_OR_VERSIONS


def _api_versions_v9() -> bytes:
    # A version no schema has: only the header is parsed, as a real client's newer version would be.
    return b"\x00\x12\x00\x09\x00\x00\x00\x07\xff\xff" + b"\x00" * 4


def test_scram_over_raw_tokens_after_handshake_v0() -> None:
    auth = authenticator()
    response = response_of(auth.receive_frame(handshake("SCRAM-SHA-512", version=0), 0))
    assert response.error_code == ErrorCode.none and auth.state is SaslState.AUTHENTICATE_RAW
    client = ScramClient(SHA512, "alice", "alice-pw")
    (first_reply,) = auth.receive_frame(client.first_message(), 0)
    assert isinstance(first_reply, SendToken)
    final_reply, done = auth.receive_frame(client.final_message(first_reply.token), 0)
    assert isinstance(final_reply, SendToken)
    client.verify_server_final(final_reply.token)
    assert isinstance(done, Authenticated) and done.session_lifetime_ms == 0
    assert auth.session_expiry_ms is None


def test_wrong_password_framed_gets_the_error_then_close() -> None:
    auth = authenticator()
    auth.receive_frame(handshake("PLAIN"), 0)
    actions = auth.receive_frame(authenticate(plain_client_message("alice", "nope")), 0)
    response = response_of(actions)
    assert response.error_code == ErrorCode.sasl_authentication_failed
    assert response.error_message == "Authentication failed: Invalid username or password"
    assert isinstance(actions[1], Close) and auth.state is SaslState.FAILED
    assert isinstance(auth.receive_frame(authenticate(b"again"), 0)[0], Close)


def test_wrong_password_raw_just_closes() -> None:
    auth = authenticator()
    auth.receive_frame(handshake("PLAIN", version=0), 0)
    (action,) = auth.receive_frame(plain_client_message("alice", "nope"), 0)
    assert isinstance(action, Close)


def test_unknown_mechanism_lists_the_enabled_ones_then_closes() -> None:
    auth = authenticator()
    actions = auth.receive_frame(handshake("GSSAPI"), 0)
    response = response_of(actions)
    assert response.error_code == ErrorCode.unsupported_sasl_mechanism
    assert list(response.mechanisms) == ["PLAIN", "SCRAM-SHA-512"]
    assert isinstance(actions[1], Close)


@pytest.mark.parametrize(
    "frame",
    [
        request_frame(3, 1, {"topics": []}),  # Metadata before authentication
        b"\x60\x82garbage",  # a GSSAPI token or garbage
        b"x" * 600_000,  # over sasl.server.max.receive.size
    ],
)
def test_anything_else_before_authentication_closes(frame: bytes) -> None:
    auth = authenticator()
    (action,) = auth.receive_frame(frame, 0)
    assert isinstance(action, Close) and auth.state is SaslState.FAILED


def test_after_api_versions_only_a_handshake() -> None:
    auth = authenticator()
    auth.receive_frame(request_frame(18, 0, {}), 0)
    (action,) = auth.receive_frame(request_frame(18, 0, {}), 0)
    assert isinstance(action, Close)
    auth = authenticator()
    auth.receive_frame(handshake("PLAIN"), 0)
    (action,) = auth.receive_frame(handshake("PLAIN"), 0)  # framed state wants SaslAuthenticate
    assert isinstance(action, Close)


def login(auth: SaslServerAuthenticator, now_ms: int, user: str = "alice") -> None:
    auth.receive_frame(handshake("PLAIN"), now_ms)
    actions = auth.receive_frame(authenticate(plain_client_message(user, f"{user}-pw")), now_ms)
    assert isinstance(actions[-1], Authenticated)


def header_of(frame: bytes) -> RequestHeader:
    return parse_request_header(frame)


def test_authenticated_requests_expiry_and_reauthentication() -> None:
    auth = authenticator(connections_max_reauth_ms=10_000)
    login(auth, 0)
    metadata = request_frame(3, 1, {"topics": []})
    assert auth.on_authenticated_request(header_of(metadata), metadata, 5_000) == [Proceed()]
    # re-authentication before expiry
    hs = handshake("PLAIN")
    assert (
        response_of(auth.on_authenticated_request(header_of(hs), hs, 9_000)).error_code
        == ErrorCode.none
    )
    assert auth.authenticating
    actions = auth.receive_frame(authenticate(plain_client_message("alice", "alice-pw")), 9_000)
    assert actions[1] == Authenticated(KafkaPrincipal.user("alice"), "PLAIN", 10_000, True)
    assert auth.session_expiry_ms == 19_000
    assert auth.on_authenticated_request(header_of(metadata), metadata, 18_999) == [Proceed()]
    (close,) = auth.on_authenticated_request(header_of(metadata), metadata, 19_000)
    assert isinstance(close, Close) and "expired" in close.reason


def test_reauthentication_may_not_change_principal_or_mechanism() -> None:
    auth = authenticator(connections_max_reauth_ms=10_000)
    login(auth, 0)
    hs = handshake("PLAIN")
    auth.on_authenticated_request(header_of(hs), hs, 2_000)
    actions = auth.receive_frame(authenticate(plain_client_message("bob", "bob-pw")), 2_000)
    assert response_of(actions).error_code == ErrorCode.sasl_authentication_failed
    assert "Cannot change principals" in response_of(actions).error_message
    assert isinstance(actions[1], Close)

    auth = authenticator(connections_max_reauth_ms=10_000)
    login(auth, 0)
    hs = handshake("SCRAM-SHA-512")
    actions = auth.on_authenticated_request(header_of(hs), hs, 2_000)
    assert isinstance(actions[-1], Close) and "re-authentication" in actions[-1].reason


def test_sasl_requests_when_reauthentication_is_not_possible() -> None:
    auth = authenticator()  # no connections.max.reauth.ms: no session expiry, no re-authentication
    login(auth, 0)
    hs = handshake("PLAIN")
    assert (
        response_of(auth.on_authenticated_request(header_of(hs), hs, 1)).error_code
        == ErrorCode.illegal_sasl_state
    )
    sa = authenticate(b"x")
    response = response_of(auth.on_authenticated_request(header_of(sa), sa, 1))
    assert response.error_code == ErrorCode.illegal_sasl_state
    # at most one re-authentication start per second
    auth = authenticator(connections_max_reauth_ms=10_000)
    login(auth, 0)
    auth.on_authenticated_request(header_of(hs), hs, 100)
    auth.receive_frame(authenticate(plain_client_message("alice", "alice-pw")), 100)
    hs2 = handshake("PLAIN")
    assert (
        response_of(auth.on_authenticated_request(header_of(hs2), hs2, 600)).error_code
        == ErrorCode.illegal_sasl_state
    )


def test_saslauthenticate_v0_gets_no_lifetime_but_the_session_still_expires() -> None:
    auth = authenticator(connections_max_reauth_ms=5_000)
    auth.receive_frame(handshake("PLAIN"), 0)
    actions = auth.receive_frame(
        authenticate(plain_client_message("alice", "alice-pw"), version=0), 0
    )
    assert not hasattr(response_of(actions), "session_lifetime")
    metadata = request_frame(3, 1, {"topics": []})
    assert isinstance(auth.on_authenticated_request(header_of(metadata), metadata, 5_000)[0], Close)
