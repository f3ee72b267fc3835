"""TLS: certificates for a local cluster, SSL contexts built from Kafka's ssl.* properties, and
real handshakes on loopback (mTLS with the client's DN as principal)."""

from __future__ import annotations

import asyncio
import datetime
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from odradek.security.certificates import (
    LocalPki,
    certificate_pem,
    create_ca,
    create_local_pki,
    issue_certificate,
    key_pem,
    write_certificate_files,
)
from odradek.security.errors import SslConfigError
from odradek.security.principal import ANONYMOUS, KafkaPrincipal
from odradek.security.principal_mapping import SslPrincipalMapper, principal_from_certificate
from odradek.security.ssl_config import (
    client_context,
    listener_ssl_config,
    openssl_cipher_list,
    server_context,
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPki:
    return create_local_pki(tmp_path_factory.mktemp("pki"), [1, 2])


def broker_config(pki: LocalPki, **extra: str) -> dict[str, str]:
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(pki.brokers[1].keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(pki.ca_certificate),
        **extra,
    }


def client_config(pki: LocalPki, with_certificate: bool = True, **extra: str) -> dict[str, str]:
    config = {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(pki.ca_certificate)}
    if with_certificate:
        assert pki.client is not None
        config.update(
            {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki.client.keystore)}
        )
    config.update(extra)
    return config


def handshake(
    server: ssl.SSLContext, client: ssl.SSLContext, server_hostname: str = "localhost"
) -> tuple[bytes | None, str | None]:
    """Connect over loopback; return (client certificate DER seen by the server, TLS version)."""

    async def go() -> tuple[bytes | None, str | None]:
        seen: asyncio.Future[tuple[bytes | None, str | None]] = (
            asyncio.get_running_loop().create_future()
        )

        async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            ssl_object = writer.get_extra_info("ssl_object")
            if not seen.done():
                seen.set_result((ssl_object.getpeercert(binary_form=True), ssl_object.version()))
            writer.write(await reader.readexactly(4))
            await writer.drain()
            writer.close()

        listener = await asyncio.start_server(on_connection, "127.0.0.1", 0, ssl=server)
        port = listener.sockets[0].getsockname()[1]
        try:
            async with asyncio.timeout(10):
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, ssl=client, server_hostname=server_hostname
                )
                writer.write(b"ping")
                assert await reader.readexactly(4) == b"ping"
                writer.close()
                return await seen
        finally:
            listener.close()

    return asyncio.run(go())


def test_local_pki_files(pki: LocalPki) -> None:
    assert pki.ca_certificate.read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")
    assert set(pki.brokers) == {1, 2}
    assert (pki.brokers[1].key.stat().st_mode & 0o777) == 0o600
    assert pki.brokers[1].keystore.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")


def test_mtls_handshake_with_dn_principal(pki: LocalPki) -> None:
    server = server_context(broker_config(pki, **{"ssl.client.auth": "required"}))
    der, version = handshake(server, client_context(client_config(pki)))
    assert version == "TLSv1.3"
    assert principal_from_certificate(der, SslPrincipalMapper()) == KafkaPrincipal.user(
        "CN=client,OU=clients,O=Odradek"
    )
    mapper = SslPrincipalMapper("RULE:^CN=(.*?),OU=.*$/$1/,DEFAULT")
    assert principal_from_certificate(der, mapper) == KafkaPrincipal.user("client")


def test_broker_to_broker_with_broker_certificates(pki: LocalPki) -> None:
    server = server_context(broker_config(pki, **{"ssl.client.auth": "required"}))
    client = client_context(
        {**broker_config(pki), "ssl.keystore.location": str(pki.brokers[2].keystore)}
    )
    der, _ = handshake(server, client, server_hostname="127.0.0.1")  # IP SAN
    assert principal_from_certificate(der, SslPrincipalMapper()).name == (
        "CN=broker-2,OU=brokers,O=Odradek"
    )


def test_no_client_certificate_is_anonymous_unless_required(pki: LocalPki) -> None:
    anonymous_client = client_context(client_config(pki, with_certificate=False))
    der, _ = handshake(server_context(broker_config(pki)), anonymous_client)
    assert principal_from_certificate(der, SslPrincipalMapper()) == ANONYMOUS
    requested = server_context(broker_config(pki, **{"ssl.client.auth": "requested"}))
    der, _ = handshake(requested, anonymous_client)
    assert der is None
    required = server_context(broker_config(pki, **{"ssl.client.auth": "required"}))
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
        handshake(required, anonymous_client)


def test_untrusted_and_expired_certificates_are_refused(pki: LocalPki, tmp_path: Path) -> None:
    other = create_local_pki(tmp_path / "other", [1])
    server = server_context(broker_config(pki, **{"ssl.client.auth": "required"}))
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
        handshake(server, client_context(client_config(other)))  # client trusts another CA
    # server trusts our CA, client presents a certificate from another CA
    mixed = client_config(pki)
    assert other.client is not None
    mixed["ssl.keystore.location"] = str(other.client.keystore)
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
        handshake(server, client_context(mixed))
    # an expired broker certificate
    ca_cert = ca_of(pki)
    expired_cert, expired_key = issue_certificate(
        ca_cert[0],
        ca_cert[1],
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "expired")]),
        hosts=["localhost"],
        valid_days=1,
        not_before=datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=3),
    )
    files = write_certificate_files(tmp_path, "expired", expired_cert, expired_key, ca_cert[0])
    expired_server = server_context(
        {**broker_config(pki), "ssl.keystore.location": str(files.keystore)}
    )
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(expired_server, client_context(client_config(pki)))


def ca_of(pki: LocalPki) -> tuple[x509.Certificate, Any]:
    certificate = x509.load_pem_x509_certificate(pki.ca_certificate.read_bytes())
    key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), None)
    return certificate, key


def test_hostname_check_is_the_endpoint_identification_algorithm(pki: LocalPki) -> None:
    server = server_context(broker_config(pki))
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server, client_context(client_config(pki)), server_hostname="broker.example")
    relaxed = client_context(client_config(pki, **{"ssl.endpoint.identification.algorithm": ""}))
    handshake(server, relaxed, server_hostname="broker.example")


def test_inline_pem_with_encrypted_key_and_tls12_only(tmp_path: Path) -> None:
    ca, ca_key = create_ca()

    cert, key = issue_certificate(
        ca, ca_key, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "b")]), hosts=["localhost"]
    )
    config = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.certificate.chain": certificate_pem(cert, ca).decode(),
        "ssl.keystore.key": key_pem(key, "k-pass").decode(),
        "ssl.key.password": "k-pass",
        "ssl.enabled.protocols": "TLSv1.2",
        "ssl.cipher.suites": "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    }
    trust = {
        "ssl.truststore.type": "PEM",
        "ssl.truststore.certificates": certificate_pem(ca).decode(),
    }
    _, version = handshake(server_context(config), client_context(trust))
    assert version == "TLSv1.2"
    with pytest.raises(SslConfigError, match=r"ssl.key.password"):
        server_context({**config, "ssl.key.password": "wrong"})
    with pytest.raises(SslConfigError, match="encrypted"):
        server_context({k: v for k, v in config.items() if k != "ssl.key.password"})
    with pytest.raises(SslConfigError, match="password cannot be specified with PEM"):
        server_context({**config, "ssl.keystore.password": "x"})


def test_pkcs12_keystore_and_truststore(pki: LocalPki, tmp_path: Path) -> None:
    certificate, key = ca_of(pki)

    leaf, leaf_key = issue_certificate(
        certificate,
        key,
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "p12")]),
        hosts=["localhost"],
    )
    keystore = tmp_path / "broker.p12"
    keystore.write_bytes(
        pkcs12.serialize_key_and_certificates(
            b"broker",
            leaf_key,
            leaf,
            [certificate],
            serialization.BestAvailableEncryption(b"store-pw"),
        )
    )
    truststore = tmp_path / "trust.p12"
    truststore.write_bytes(
        pkcs12.serialize_key_and_certificates(
            None, None, None, [certificate], serialization.BestAvailableEncryption(b"trust-pw")
        )
    )
    server = server_context(
        {
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(keystore),
            "ssl.keystore.password": "store-pw",
        }
    )
    client = client_context(
        {
            "ssl.truststore.type": "PKCS12",
            "ssl.truststore.location": str(truststore),
            "ssl.truststore.password": "trust-pw",
        }
    )
    handshake(server, client)
    with pytest.raises(SslConfigError, match=r"wrong ssl.keystore.password"):
        server_context(
            {
                "ssl.keystore.type": "PKCS12",
                "ssl.keystore.location": str(keystore),
                "ssl.keystore.password": "no",
            }
        )


def test_jks_and_other_mistakes_are_one_line_errors(pki: LocalPki) -> None:
    with pytest.raises(SslConfigError, match=r"JKS is not supported.*use PEM or PKCS12"):
        server_context({"ssl.keystore.location": "/x/broker.jks"})  # JKS is Kafka's default type
    with pytest.raises(SslConfigError, match="needs a keystore"):
        server_context({})
    with pytest.raises(SslConfigError, match="gap"):
        server_context(broker_config(pki, **{"ssl.enabled.protocols": "TLSv1,TLSv1.2"}))
    with pytest.raises(SslConfigError, match="SSLv3"):
        server_context(broker_config(pki, **{"ssl.enabled.protocols": "SSLv3"}))
    with pytest.raises(SslConfigError, match=r"ssl.client.auth"):
        server_context(broker_config(pki, **{"ssl.client.auth": "maybe"}))
    with pytest.raises(SslConfigError, match="cannot read"):
        server_context(broker_config(pki, **{"ssl.keystore.location": "/nonexistent.pem"}))
    with pytest.raises(SslConfigError, match="endpoint"):
        client_context(client_config(pki, **{"ssl.endpoint.identification.algorithm": "ldap"}))


def test_cipher_suite_names() -> None:
    assert openssl_cipher_list("") == (None, True)
    assert openssl_cipher_list(
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"
    ) == ("ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305", False)
    both = openssl_cipher_list(
        "TLS_AES_128_GCM_SHA256,TLS_AES_256_GCM_SHA384,TLS_CHACHA20_POLY1305_SHA256,"
        "TLS_EMPTY_RENEGOTIATION_INFO_SCSV,ECDHE-RSA-AES128-GCM-SHA256"
    )
    assert both == ("ECDHE-RSA-AES128-GCM-SHA256", True)
    with pytest.raises(SslConfigError, match="cannot be restricted"):
        openssl_cipher_list("TLS_AES_128_GCM_SHA256")
    with pytest.raises(SslConfigError, match="TLS_AES_128_CCM_SHA256"):
        openssl_cipher_list("TLS_AES_128_CCM_SHA256")
    with pytest.raises(SslConfigError, match="TLS_RSA_WITH_RC4_128_SHA"):
        openssl_cipher_list("TLS_RSA_WITH_RC4_128_SHA")


def test_listener_prefixed_overrides() -> None:
    properties = {
        "ssl.keystore.location": "/a.pem",
        "ssl.client.auth": "required",
        "listener.name.internal.ssl.keystore.location": "/internal.pem",
        "listener.name.sasl_ssl.ssl.truststore.location": "/t.pem",
        "listener.name.mtls_sasl.ssl.client.auth": "requested",
    }
    internal = listener_ssl_config(properties, "INTERNAL", "SSL")
    assert internal["ssl.keystore.location"] == "/internal.pem"
    assert internal["ssl.client.auth"] == "required"
    assert internal["ssl.protocol"] == "TLSv1.3"  # Kafka's defaults filled in
    sasl = listener_ssl_config(properties, "SASL_SSL", "SASL_SSL")
    assert sasl["ssl.truststore.location"] == "/t.pem"
    assert sasl["ssl.client.auth"] == "none"  # KIP-684: broker-wide client auth is SSL-only
    assert (
        listener_ssl_config(properties, "MTLS_SASL", "SASL_SSL")["ssl.client.auth"] == "requested"
    )
