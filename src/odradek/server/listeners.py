"""A broker's listeners, secured as their security protocols say: what `Broker.startup` hands the socket
servers, and how the broker itself reaches other brokers.

| protocol | transport | principal |
|---|---|---|
| PLAINTEXT | TCP | `User:ANONYMOUS` |
| SSL | TLS (`listener.name.<l>.ssl.*` over `ssl.*`) | the client certificate's DN mapped by `ssl.principal.mapping.rules`, or `User:ANONYMOUS` without one (`ssl.client.auth=none|requested`) |
| SASL_PLAINTEXT | TCP, then SASL | `User:<SASL user>` |
| SASL_SSL | TLS, then SASL | `User:<SASL user>` (as in Kafka, a client certificate is only asked for when `listener.name.<l>.ssl.client.auth` says so, and never gives the principal) |

The SASL side of a connection is `odradek.security.authenticator.SaslServerAuthenticator`; the
`_SaslSessionAdapter` here translates its actions into the socket server's
(`odradek.network.listener_security`), since the network layer sits below the security package.

Everything is built once at start-up; a bad `ssl.*`/`sasl.*` setting is a one-line `ConfigError`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from odradek.network.client import ClientSecurity
from odradek.network.listener_security import PROCEED as NETWORK_PROCEED
from odradek.network.listener_security import (
    Action,
    AuthenticationRefused,
    Close,
    ListenerSecurity,
    Reply,
    ReplyRaw,
    SetPrincipal,
)
from odradek.network.quotas import ConnectionQuotas, MemoryPool, parse_overrides
from odradek.protocol.codec import RequestHeader
from odradek.security import authenticator as sasl
from odradek.security.client_config import inter_broker_client
from odradek.security.credential_store import CredentialCache
from odradek.security.errors import NoMatchingRuleError
from odradek.security.principal_mapping import SslPrincipalMapper, principal_from_certificate
from odradek.security.sasl_config import listener_sasl
from odradek.security.ssl_config import listener_ssl_config, server_context
from odradek.server.config import KafkaConfig
from odradek.server.listener_config import Endpoint

ApiVersionsResponder = Callable[[RequestHeader, bytes], Any]


class _SaslSessionAdapter:
    """A `SaslServerAuthenticator` seen as the network layer's `SaslSession`."""

    __slots__ = ("_authenticator",)

    def __init__(self, authenticator: sasl.SaslServerAuthenticator) -> None:
        self._authenticator = authenticator

    @property
    def authenticating(self) -> bool:
        return self._authenticator.authenticating

    @property
    def max_receive_size(self) -> int:
        return self._authenticator.max_receive_size

    def receive_frame(self, frame: bytes, now_ms: int) -> list[Action]:
        return _translate(self._authenticator.receive_frame(frame, now_ms))

    def on_request(self, header: RequestHeader, frame: bytes, now_ms: int) -> list[Action]:
        actions = self._authenticator.on_authenticated_request(header, frame, now_ms)
        if len(actions) == 1 and isinstance(actions[0], sasl.Proceed):
            return [NETWORK_PROCEED]  # the common case, without building a list per request
        return _translate(actions)


def _translate(actions: Sequence[sasl.Action]) -> list[Action]:
    translated: list[Action] = []
    for action in actions:
        if isinstance(action, sasl.SendResponse):
            translated.append(Reply(action.header, action.response))
        elif isinstance(action, sasl.SendToken):
            translated.append(ReplyRaw(action.token))
        elif isinstance(action, sasl.Authenticated):
            translated.append(SetPrincipal(str(action.principal)))
        elif isinstance(action, sasl.Proceed):
            translated.append(NETWORK_PROCEED)
        elif isinstance(action, sasl.Close):
            translated.append(Close(action.reason))
    return translated


def _certificate_principal(mapper: SslPrincipalMapper, der: bytes | None) -> str:
    try:
        return str(principal_from_certificate(der, mapper))
    except NoMatchingRuleError as e:
        raise AuthenticationRefused(str(e)) from None


def listener_security(
    config: KafkaConfig,
    endpoint: Endpoint,
    credentials: CredentialCache,
    api_versions: ApiVersionsResponder,
) -> ListenerSecurity:
    """The socket server's view of one listener (see the module docstring)."""
    properties = config.originals
    name, protocol = endpoint.listener, endpoint.security_protocol
    ssl_context = None
    principal_for_certificate = None
    if endpoint.uses_tls:
        ssl_settings = listener_ssl_config(properties, name, protocol)
        ssl_context = server_context(ssl_settings)
        if protocol == "SSL":
            mapper = SslPrincipalMapper(ssl_settings.get("ssl.principal.mapping.rules"))
            principal_for_certificate = functools.partial(_certificate_principal, mapper)
    new_session = None
    if endpoint.uses_sasl:
        settings = listener_sasl(properties, name, credentials)

        def new_session(client_address: str) -> _SaslSessionAdapter:
            # connections.max.reauth.ms may differ per mechanism; the authenticator takes one
            # value, so use the largest until the mechanism is known (0 = no expiry wins).
            lifetimes = list(settings.connections_max_reauth_ms.values())
            lifetime = 0 if not lifetimes or 0 in lifetimes else max(lifetimes)
            return _SaslSessionAdapter(
                sasl.SaslServerAuthenticator(
                    settings.mechanisms,
                    api_versions,
                    client_address=client_address,
                    connections_max_reauth_ms=lifetime,
                    max_receive_size=settings.max_receive_size,
                )
            )

    return ListenerSecurity(
        listener=name,
        security_protocol=protocol,
        ssl_context=ssl_context,
        principal_for_certificate=principal_for_certificate,
        new_sasl_session=new_session,
    )


def connection_quotas(config: KafkaConfig) -> ConnectionQuotas:
    listener_limits = {}
    for endpoint in config.listeners:
        key = f"listener.name.{endpoint.listener.lower()}.max.connections"
        if key in config.originals:
            try:
                listener_limits[endpoint.listener] = int(config.originals[key])
            except ValueError:
                from odradek.errors import ConfigError

                raise ConfigError(f"invalid value {config.originals[key]!r} for {key}") from None
    return ConnectionQuotas(
        max_connections=config["max.connections"],
        max_connections_per_ip=config["max.connections.per.ip"],
        per_ip_overrides=parse_overrides(config["max.connections.per.ip.overrides"]),
        listener_limits=listener_limits,
        protected_listener=config.listener_config.inter_broker_listener,
    )


def memory_pool(config: KafkaConfig) -> MemoryPool:
    return MemoryPool(int(config["queued.max.request.bytes"]))


def broker_client_security(config: KafkaConfig, listener: str) -> ClientSecurity:
    """How this broker connects to another broker's `listener` (the same settings on every broker
    of a cluster, as Kafka assumes)."""
    endpoint = config.listener_config.listener(listener)
    return inter_broker_client(config.originals, listener, endpoint.security_protocol)


def endpoint_map(endpoints: Sequence[Any]) -> Mapping[str, tuple[str, int]]:
    return {e.listener_name: (e.host, e.port) for e in endpoints}
