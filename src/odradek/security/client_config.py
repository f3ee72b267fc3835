"""The client side of security: how an outgoing connection (a tool's, or a broker's to another broker)
authenticates, from Kafka's client properties.

Tools (`--command-config client.properties`, as Kafka's tools take it) use the client properties:

| property | meaning |
|---|---|
| `security.protocol` | PLAINTEXT (default), SSL, SASL_PLAINTEXT, SASL_SSL |
| `ssl.truststore.*`, `ssl.keystore.*`, `ssl.key.password`, `ssl.endpoint.identification.algorithm`, `ssl.enabled.protocols`, `ssl.cipher.suites` | as for a listener (`odradek.security.ssl_config`); a keystore makes it mutual TLS |
| `sasl.mechanism` | PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (Kafka's default GSSAPI is refused) |
| `sasl.jaas.config` | `...PlainLoginModule required username="alice" password="...";` or the ScramLoginModule equivalent |

A broker reaching another broker (replica fetchers, the controller, controlled shutdown) is a client
of the inter-broker (or control-plane) listener: its security protocol is that listener's, its TLS
settings the listener's `ssl.*` (its own keystore is its client certificate when the listener asks
for one), its mechanism `sasl.mechanism.inter.broker.protocol`, and its credentials the `username`
and `password` options of `listener.name.<l>.<mechanism>.sasl.jaas.config` (`inter_broker_client`).

The SASL exchange (`SaslClientAuthenticator`): SaslHandshake v1 naming the mechanism, then
SaslAuthenticate v2 carrying the mechanism's tokens (one for PLAIN; client-first, client-final for
SCRAM, whose server-final is verified). A refusal raises `SaslAuthenticationFailedError` (a
`NetworkError`: the connection is unusable) with the broker's error message.

Concurrency: `authenticate` runs on the connection's event loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from odradek.errors import NetworkError
from odradek.network.client import PLAINTEXT_CLIENT, BrokerConnection, ClientSecurity
from odradek.protocol.build import build
from odradek.protocol.codec import ApiKey, request_class
from odradek.security.errors import AuthenticationError, SecurityConfigError
from odradek.security.jaas import (
    PLAIN_LOGIN_MODULE,
    SCRAM_LOGIN_MODULE,
    login_module,
    parse_jaas_config,
    server_jaas_property,
)
from odradek.security.sasl_plain import PLAIN, plain_client_message
from odradek.security.sasl_scram import ScramClient
from odradek.security.scram import ScramMechanism
from odradek.security.ssl_config import SSL_DEFAULTS, client_context, listener_ssl_config

SASL_AUTHENTICATE = 36
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
CLIENT_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class SaslAuthenticationFailedError(NetworkError):
    """The broker refused our SASL credentials (or our mechanism)."""


@dataclass(frozen=True, slots=True)
class SaslClientAuthenticator:
    """Runs one SASL exchange on a freshly connected `BrokerConnection`."""

    mechanism: str
    username: str
    password: str

    async def __call__(self, connection: BrokerConnection) -> None:
        handshake = await connection.send(
            ApiKey.SASL_HANDSHAKE,
            1,
            build(request_class(ApiKey.SASL_HANDSHAKE, 1), {"mechanism": self.mechanism}),
        )
        if handshake.error_code != ErrorCode.none:
            raise SaslAuthenticationFailedError(
                f"the broker at {connection.address} does not enable SASL mechanism "
                f"{self.mechanism} (it enables {', '.join(handshake.mechanisms)})"
            )
        if self.mechanism == PLAIN:
            await self._exchange(connection, plain_client_message(self.username, self.password))
            return
        scram = ScramMechanism.from_name(self.mechanism)
        if scram is None:
            raise SecurityConfigError(f"unsupported SASL mechanism {self.mechanism}")
        client = ScramClient(scram, self.username, self.password)
        server_first = await self._exchange(connection, client.first_message())
        try:
            final = client.final_message(server_first)
            server_final = await self._exchange(connection, final)
            client.verify_server_final(server_final)
        except AuthenticationError as e:
            raise SaslAuthenticationFailedError(
                f"SASL authentication with {connection.address} failed: {e}"
            ) from None

    @staticmethod
    async def _exchange(connection: BrokerConnection, token: bytes) -> bytes:
        response = await connection.send(
            SASL_AUTHENTICATE,
            2,
            build(request_class(SASL_AUTHENTICATE, 2), {"auth_bytes": token}),
        )
        if response.error_code != ErrorCode.none:
            raise SaslAuthenticationFailedError(
                f"SASL authentication with {connection.address} failed: "
                f"{response.error_message or ErrorCode(response.error_code).name}"
            )
        return bytes(response.auth_bytes)


def _credentials(jaas: str | None, mechanism: str, where: str) -> tuple[str, str]:
    if not jaas:
        raise SecurityConfigError(f"SASL mechanism {mechanism} needs {where}")
    module = PLAIN_LOGIN_MODULE if mechanism == PLAIN else SCRAM_LOGIN_MODULE
    entry = login_module(parse_jaas_config(jaas), module)
    username, password = entry.options.get("username"), entry.options.get("password")
    if username is None or password is None:
        raise SecurityConfigError(f"{where} must set username and password for {mechanism}")
    return username, password


def _check_mechanism(mechanism: str, key: str) -> str:
    mechanism = mechanism.strip()
    if mechanism not in CLIENT_MECHANISMS:
        raise SecurityConfigError(
            f"{key}={mechanism} is not supported (supported: {', '.join(CLIENT_MECHANISMS)})"
        )
    return mechanism


def _security(
    protocol: str,
    ssl_properties: Mapping[str, str] | None,
    authenticator: SaslClientAuthenticator | None,
) -> ClientSecurity:
    context = client_context(ssl_properties) if ssl_properties is not None else None
    return ClientSecurity(context, authenticator, protocol)


def client_security(properties: Mapping[str, str]) -> ClientSecurity:
    """A tool's security from Kafka client properties (see the module docstring)."""
    protocol = str(properties.get("security.protocol", "PLAINTEXT")).strip().upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise SecurityConfigError(f"invalid security.protocol {protocol!r}")
    if protocol == "PLAINTEXT":
        return PLAINTEXT_CLIENT
    ssl_properties = None
    if protocol in ("SSL", "SASL_SSL"):
        ssl_properties = dict(SSL_DEFAULTS)
        ssl_properties.update({k: v for k, v in properties.items() if k.startswith("ssl.")})
    authenticator = None
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        mechanism = _check_mechanism(properties.get("sasl.mechanism", "GSSAPI"), "sasl.mechanism")
        username, password = _credentials(
            properties.get("sasl.jaas.config"), mechanism, "sasl.jaas.config"
        )
        authenticator = SaslClientAuthenticator(mechanism, username, password)
    return _security(protocol, ssl_properties, authenticator)


def inter_broker_client(
    properties: Mapping[str, str], listener: str, security_protocol: str
) -> ClientSecurity:
    """How this broker connects to other brokers' `listener` (see the module docstring)."""
    protocol = security_protocol.upper()
    if protocol == "PLAINTEXT":
        return PLAINTEXT_CLIENT
    ssl_properties = (
        listener_ssl_config(properties, listener, protocol)
        if protocol in ("SSL", "SASL_SSL")
        else None
    )
    authenticator = None
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        mechanism = _check_mechanism(
            properties.get("sasl.mechanism.inter.broker.protocol", "GSSAPI"),
            "sasl.mechanism.inter.broker.protocol",
        )
        key = f"listener.name.{listener.lower()}.{mechanism.lower()}.sasl.jaas.config"
        username, password = _credentials(
            server_jaas_property(properties, listener, mechanism), mechanism, key
        )
        authenticator = SaslClientAuthenticator(mechanism, username, password)
    return _security(protocol, ssl_properties, authenticator)
