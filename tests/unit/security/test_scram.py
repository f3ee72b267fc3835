"""SCRAM: RFC 7677's test vector, Kafka's credential string and kafka-configs syntax, the server's
refusals, and client/server round trips for both mechanisms."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odradek.security.errors import AuthenticationError, InvalidScramCredentialError
from odradek.security.sasl_scram import (
    ScramClient,
    ScramServer,
    ScramServerState,
    sasl_name,
    username_from_sasl_name,
)
from odradek.security.scram import (
    ScramCredential,
    ScramMechanism,
    credential_from_config_value,
    generate_credential,
    parse_add_config,
    scram_configs_from_add_config,
)

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512

# RFC 7677 §3
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def rfc_credential() -> ScramCredential:
    return generate_credential(SHA256, "pencil", 4096, RFC_SALT)


def test_rfc7677_server_side() -> None:
    server = ScramServer(SHA256, {"user": rfc_credential()}.get, lambda: RFC_SERVER_NONCE)
    assert server.evaluate(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert server.evaluate(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.complete and server.authorization_id == "user"


def test_rfc7677_client_side() -> None:
    client = ScramClient(SHA256, "user", "pencil", nonce=RFC_CLIENT_NONCE)
    assert client.first_message() == RFC_CLIENT_FIRST
    assert client.final_message(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.verify_server_final(RFC_SERVER_FINAL)
    with pytest.raises(AuthenticationError):
        client.verify_server_final(b"v=" + base64.b64encode(b"x" * 32))


def exchange(server: ScramServer, client: ScramClient) -> None:
    final = client.final_message(server.evaluate(client.first_message()))
    client.verify_server_final(server.evaluate(final))


@pytest.mark.parametrize("mechanism", [SHA256, SHA512])
def test_round_trip(mechanism: ScramMechanism) -> None:
    credential = generate_credential(mechanism, "s3cret", 4096)
    server = ScramServer(mechanism, {"alice,=x": credential}.get)
    exchange(server, ScramClient(mechanism, "alice,=x", "s3cret"))
    assert server.authorization_id == "alice,=x"


@pytest.mark.parametrize("mechanism", [SHA256, SHA512])
def test_wrong_password_and_unknown_user_fail_alike_at_the_proof(mechanism: ScramMechanism) -> None:
    credentials = {"alice": generate_credential(mechanism, "right", 4096)}.get
    for user, password in (("alice", "wrong"), ("mallory", "anything")):
        server = ScramServer(mechanism, credentials)
        client = ScramClient(mechanism, user, password)
        server_first = server.evaluate(client.first_message())  # no refusal yet
        with pytest.raises(AuthenticationError) as refused:
            server.evaluate(client.final_message(server_first))
        assert str(refused.value) == "Authentication failed: Invalid user credentials"
        assert server.state is ScramServerState.FAILED
    # an unknown user's decoy salt is stable, so probing twice reveals nothing
    first = [ScramServer(mechanism, credentials).evaluate(b"n,,n=mallory,r=abc") for _ in "ab"]
    assert first[0].split(b",")[1] == first[1].split(b",")[1]


@pytest.mark.parametrize(
    "message",
    [
        b"p=tls-unique,,n=user,r=abc",  # channel binding: not offered
        b"n,,m=ext,n=user,r=abc",  # reserved extension
        b"n,,n=user,r=abc,tokenauth=true",  # delegation tokens
        b"n,,n=us=er,r=abc",  # bad saslname escape
        b"n,a=bob,n=user,r=abc",  # authzid different from user
        b"n,,n=user",  # no nonce
        b"\xff\xfe",
    ],
)
def test_client_first_refusals(message: bytes) -> None:
    server = ScramServer(SHA256, {"user": rfc_credential()}.get)
    with pytest.raises(AuthenticationError):
        server.evaluate(message)
    with pytest.raises(AuthenticationError):  # FAILED is final
        server.evaluate(RFC_CLIENT_FIRST)


def test_client_final_refusals() -> None:
    def fresh() -> ScramServer:
        server = ScramServer(SHA256, {"user": rfc_credential()}.get, lambda: RFC_SERVER_NONCE)
        server.evaluate(RFC_CLIENT_FIRST)
        return server

    good = RFC_CLIENT_FINAL.decode()
    for bad in (
        good.replace("c=biws", "c=eSws"),  # channel binding data is not the gs2 header
        good.replace("k0,p=", "k1,p="),  # someone else's nonce
        good.replace("p=dHzb", "p=eHzb"),  # forged proof
        good[: good.index(",p=")],  # no proof
    ):
        with pytest.raises(AuthenticationError):
            fresh().evaluate(bad.encode())


def test_client_nonce_repeated_in_front_is_accepted_as_kafka_does() -> None:
    """librdkafka <= 2.0 (Debian's kcat) repeats its nonce in front of the combined one; Kafka 3.x
    accepts a client-final nonce that ends with the server's. The proof covers the message as
    sent."""
    mechanism = SHA256
    credential = generate_credential(mechanism, "pencil", 4096, salt=b"salty")
    server = ScramServer(mechanism, {"user": credential}.get, lambda: "SERVERNONCE")
    server.evaluate(b"n,,n=user,r=CLIENTNONCE")
    combined = "CLIENTNONCE" + "SERVERNONCE"
    without_proof = f"c=biws,r=CLIENTNONCE{combined}"
    auth_message = f"n=user,r=CLIENTNONCE,r={combined},s={base64.b64encode(b'salty').decode()}"
    auth_message += f",i=4096,{without_proof}"
    salted = mechanism.salted_password("pencil", b"salty", 4096)
    client_key = mechanism.client_key(salted)
    signature = mechanism.hmac(mechanism.hash(client_key), auth_message.encode())
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    final = f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
    assert server.evaluate(final).startswith(b"v=")
    assert server.authorization_id == "user"


def test_extensions_other_than_tokenauth_are_ignored() -> None:
    server = ScramServer(SHA256, {"user": rfc_credential()}.get, lambda: RFC_SERVER_NONCE)
    reply = server.evaluate(RFC_CLIENT_FIRST + b",foo=bar")
    assert reply == RFC_SERVER_FIRST


def test_too_few_stored_iterations_are_refused() -> None:
    weak = ScramCredential(b"s", b"k", b"k", 1000)
    server = ScramServer(SHA256, {"user": weak}.get)
    with pytest.raises(AuthenticationError, match="Invalid user credentials"):
        server.evaluate(RFC_CLIENT_FIRST)


def test_credential_string_is_kafkas() -> None:
    credential = ScramCredential(b"salt", b"stored", b"server", 8192)
    text = credential.to_string()
    assert text == "salt=c2FsdA==,stored_key=c3RvcmVk,server_key=c2VydmVy,iterations=8192"
    assert ScramCredential.from_string(text) == credential
    shuffled = "iterations=8192,server_key=c2VydmVy,salt=c2FsdA==,stored_key=c3RvcmVk"
    assert ScramCredential.from_string(shuffled) == credential
    for bad in ("salt=c2FsdA==", text + ",extra=1", text.replace("8192", "x"), "junk"):
        with pytest.raises(InvalidScramCredentialError):
            ScramCredential.from_string(bad)
    assert "stored" not in repr(credential)


def test_kafka_configs_add_config_syntax() -> None:
    assert parse_add_config(
        "SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=x,y]"
    ) == {
        "SCRAM-SHA-256": "iterations=8192,password=alice-secret",
        "SCRAM-SHA-512": "password=x,y",
    }
    assert parse_add_config("a = 1, b=") == {"a": "1", "b": ""}
    with pytest.raises(InvalidScramCredentialError):
        parse_add_config("novalue")
    credential = credential_from_config_value(SHA512, "iterations=8192,password=pw", b"salt")
    assert credential == generate_credential(SHA512, "pw", 8192, b"salt")
    assert credential_from_config_value(SHA256, "password=pw").iterations == 4096
    assert credential_from_config_value(SHA256, "iterations=-1,password=pw").iterations == 4096
    with pytest.raises(InvalidScramCredentialError, match="less than the minimum 4096"):
        credential_from_config_value(SHA256, "iterations=100,password=pw")
    with pytest.raises(InvalidScramCredentialError):
        credential_from_config_value(SHA256, "pw")
    configs = scram_configs_from_add_config("SCRAM-SHA-256=[password=pw],consumer_byte_rate=10")
    assert configs["consumer_byte_rate"] == "10"
    stored = ScramCredential.from_string(configs["SCRAM-SHA-256"])
    server = ScramServer(SHA256, {"bob": stored}.get)
    exchange(server, ScramClient(SHA256, "bob", "pw"))


@settings(max_examples=30, deadline=None)
@given(st.text(min_size=1, max_size=12))
def test_sasl_name_round_trip(name: str) -> None:
    assert username_from_sasl_name(sasl_name(name)) == name
    assert "," not in sasl_name(name)
