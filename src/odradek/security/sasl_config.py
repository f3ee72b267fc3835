"""A listener's SASL settings from broker properties: which mechanisms, with which users, and the
authenticator's limits — what the network layer needs to build a `SaslServerAuthenticator` per
connection.

| property | meaning |
|---|---|
| `sasl.enabled.mechanisms` (Kafka's default GSSAPI) | comma list; `listener.name.<l>.sasl.enabled.mechanisms` overrides it. PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 are supported; GSSAPI and OAUTHBEARER are refused with a one-line error |
| `listener.name.<l>.plain.sasl.jaas.config` | PLAIN's users (`user_<name>="<password>"`) |
| `listener.name.<l>.scram-sha-256.sasl.jaas.config` | optional for SCRAM (users come from ZooKeeper); the broker's own `username`/`password` live there for inter-broker SASL |
| `connections.max.reauth.ms` (0) | KIP-368; `listener.name.<l>.<mechanism>.connections.max.reauth.ms` overrides it per mechanism |
| `sasl.server.max.receive.size` (524288) | the largest frame accepted before authentication |

Without a listener-prefixed JAAS property, a JAAS file (`java.security.auth.login.config`) section
`<listener lower-case>.KafkaServer` or `KafkaServer` is used, as in Kafka, when the caller passes
the parsed file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from odradek.security.authenticator import DEFAULT_MAX_RECEIVE_SIZE, MechanismFactory
from odradek.security.credential_store import CredentialCache
from odradek.security.errors import SecurityConfigError
from odradek.security.jaas import (
    PLAIN_LOGIN_MODULE,
    JaasEntry,
    login_module,
    parse_jaas_config,
    plain_users,
    server_jaas_property,
)
from odradek.security.sasl_plain import PLAIN, PlainServer, users_verifier
from odradek.security.sasl_scram import ScramServer
from odradek.security.scram import ScramMechanism

SUPPORTED_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True, slots=True)
class ListenerSasl:
    mechanisms: dict[str, MechanismFactory]
    connections_max_reauth_ms: dict[str, int] = field(default_factory=dict)  # per mechanism
    max_receive_size: int = DEFAULT_MAX_RECEIVE_SIZE

    def reauth_ms(self, mechanism: str) -> int:
        return self.connections_max_reauth_ms.get(mechanism, 0)


def _int(value: str, key: str) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise SecurityConfigError(f"{key} must be an integer, not {value!r}") from None


def enabled_mechanisms(properties: Mapping[str, str], listener: str) -> list[str]:
    key = f"listener.name.{listener.lower()}.sasl.enabled.mechanisms"
    value = properties.get(key, properties.get("sasl.enabled.mechanisms", "GSSAPI"))
    mechanisms = [m.strip() for m in str(value).split(",") if m.strip()]
    unsupported = [m for m in mechanisms if m not in SUPPORTED_MECHANISMS]
    if unsupported:
        raise SecurityConfigError(
            f"SASL mechanism(s) {', '.join(unsupported)} not supported on listener {listener} "
            f"(supported: {', '.join(SUPPORTED_MECHANISMS)}); set sasl.enabled.mechanisms"
        )
    if not mechanisms:
        raise SecurityConfigError(f"no SASL mechanism enabled on listener {listener}")
    return mechanisms


def _jaas_entries(
    properties: Mapping[str, str],
    listener: str,
    mechanism: str,
    jaas_file: Mapping[str, list[JaasEntry]] | None,
) -> list[JaasEntry] | None:
    value = server_jaas_property(properties, listener, mechanism)
    if value is not None:
        return parse_jaas_config(value)
    if jaas_file:
        for section in (f"{listener.lower()}.KafkaServer", "KafkaServer"):
            if section in jaas_file:
                return jaas_file[section]
    return None


def _plain_factory(users: Mapping[str, str]) -> MechanismFactory:
    verifier = users_verifier(users)
    return lambda: PlainServer(verifier)


def _scram_factory(mechanism: ScramMechanism, credentials: CredentialCache) -> MechanismFactory:
    lookup = credentials.lookup(mechanism)
    return lambda: ScramServer(mechanism, lookup)


def listener_sasl(
    properties: Mapping[str, str],
    listener: str,
    credentials: CredentialCache,
    jaas_file: Mapping[str, list[JaasEntry]] | None = None,
) -> ListenerSasl:
    """The mechanisms of a SASL_PLAINTEXT / SASL_SSL listener, ready for the authenticator."""
    factories: dict[str, MechanismFactory] = {}
    reauth: dict[str, int] = {}
    default_reauth = _int(
        properties.get("connections.max.reauth.ms", "0"), "connections.max.reauth.ms"
    )
    for mechanism in enabled_mechanisms(properties, listener):
        key = f"listener.name.{listener.lower()}.{mechanism.lower()}.connections.max.reauth.ms"
        reauth[mechanism] = _int(properties[key], key) if key in properties else default_reauth
        if mechanism == PLAIN:
            entries = _jaas_entries(properties, listener, mechanism, jaas_file)
            if entries is None:
                raise SecurityConfigError(
                    f"listener {listener} enables PLAIN but has no "
                    f"listener.name.{listener.lower()}.plain.sasl.jaas.config"
                )
            users = plain_users(login_module(entries, PLAIN_LOGIN_MODULE))
            factories[mechanism] = _plain_factory(users)
        else:
            scram = ScramMechanism.from_name(mechanism)
            if scram is None:  # unreachable: enabled_mechanisms checked the names
                raise SecurityConfigError(f"unknown SCRAM mechanism {mechanism}")
            factories[mechanism] = _scram_factory(scram, credentials)
    max_receive = _int(
        properties.get("sasl.server.max.receive.size", str(DEFAULT_MAX_RECEIVE_SIZE)),
        "sasl.server.max.receive.size",
    )
    return ListenerSasl(factories, reauth, max_receive)
