"""Named listeners, as Kafka configures them (KIP-103, KIP-291).

| property | meaning |
|---|---|
| `listeners` | `NAME://host:port,...`: where the broker listens; an empty host binds every interface |
| `listener.security.protocol.map` | `NAME:PROTOCOL,...`; PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL. The default maps each protocol name to itself, so `SSL://:9093` needs no map |
| `advertised.listeners` | what the broker registers in `/brokers/ids/<id>` and answers in Metadata; defaults to `listeners` (an empty host becomes the machine's name). Every advertised name must be a listener |
| `inter.broker.listener.name` / `security.inter.broker.protocol` | the listener other brokers (replica fetchers, controlled shutdown) reach this broker on; at most one of the two may be set; the protocol form picks the listener named like the protocol (default PLAINTEXT) |
| `control.plane.listener.name` | KIP-291: the listener the controller sends LeaderAndIsr, UpdateMetadata and StopReplica on; unset, the inter-broker listener is used |

Kafka's checks are kept: listener names and ports are unique, every name is in the map, the
inter-broker and control-plane listeners are advertised, the control plane is not the inter-broker
listener, and no advertised host is `0.0.0.0`.

Immutable once parsed; any thread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from odradek.errors import ConfigError

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# Kafka's wire ids (UpdateMetadata's `security_protocol`).
SECURITY_PROTOCOL_IDS = {"PLAINTEXT": 0, "SSL": 1, "SASL_PLAINTEXT": 2, "SASL_SSL": 3}
DEFAULT_PROTOCOL_MAP = ",".join(f"{p}:{p}" for p in SECURITY_PROTOCOLS)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One listener: its name, host, port and security protocol."""

    listener: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.listener}://{host}:{self.port}"

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")


def parse_protocol_map(text: str) -> dict[str, str]:
    """`listener.security.protocol.map` → {LISTENER: PROTOCOL}."""
    mapping: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, protocol = item.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not name or not protocol:
            raise ConfigError(
                f"invalid value {item!r} for listener.security.protocol.map: expected NAME:PROTOCOL"
            )
        if protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(
                f"invalid security protocol {protocol!r} in listener.security.protocol.map "
                f"(one of {', '.join(SECURITY_PROTOCOLS)})"
            )
        if name in mapping:
            raise ConfigError(f"listener {name} appears twice in listener.security.protocol.map")
        mapping[name] = protocol
    return mapping


def parse_listeners(text: str, property_name: str, protocol_map: dict[str, str]) -> list[Endpoint]:
    endpoints = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = re.fullmatch(r"([A-Za-z0-9_]+)://(\[[^\]]*\]|[^:]*):(\d+)", item)
        if not match:
            raise ConfigError(
                f"invalid value {item!r} for {property_name}: expected NAME://host:port"
            )
        name = match.group(1).upper()
        port = int(match.group(3))
        if not 0 <= port <= 65535:
            raise ConfigError(f"invalid value {item!r} for {property_name}: port out of range")
        protocol = protocol_map.get(name)
        if protocol is None:
            raise ConfigError(
                f"invalid value {item!r} for {property_name}: listener {name} is not in "
                f"listener.security.protocol.map ({', '.join(sorted(protocol_map))})"
            )
        endpoints.append(Endpoint(name, match.group(2).strip("[]"), port, protocol))
    if not endpoints:
        raise ConfigError(f"{property_name} is empty")
    names = [e.listener for e in endpoints]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"{property_name} names listener(s) {', '.join(duplicates)} twice")
    return endpoints


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    listeners: tuple[Endpoint, ...]
    advertised: tuple[Endpoint, ...]
    inter_broker_listener: str
    control_plane_listener: str | None

    def listener(self, name: str) -> Endpoint:
        for endpoint in self.listeners:
            if endpoint.listener == name:
                return endpoint
        raise ConfigError(f"no listener named {name}")

    def advertised_endpoint(self, name: str) -> Endpoint:
        for endpoint in self.advertised:
            if endpoint.listener == name:
                return endpoint
        raise ConfigError(f"listener {name} is not advertised")

    @property
    def controller_listener(self) -> str:
        """The listener the controller reaches brokers on."""
        return self.control_plane_listener or self.inter_broker_listener


def listener_config(
    listeners_text: str,
    advertised_text: str | None,
    protocol_map_text: str | None,
    inter_broker_listener_name: str | None,
    security_inter_broker_protocol: str | None,
    control_plane_listener_name: str | None,
    default_host: str,
) -> ListenerConfig:
    """Parse and check the listener properties (Kafka's rules, module docstring)."""
    protocol_map = parse_protocol_map(protocol_map_text or DEFAULT_PROTOCOL_MAP)
    listeners = parse_listeners(listeners_text, "listeners", protocol_map)
    ports = [e.port for e in listeners if e.port != 0]
    duplicates = sorted({p for p in ports if ports.count(p) > 1})
    if duplicates:
        raise ConfigError(f"listeners use port(s) {duplicates} more than once")
    if advertised_text:
        advertised = parse_listeners(advertised_text, "advertised.listeners", protocol_map)
        names = {e.listener for e in listeners}
        for endpoint in advertised:
            if endpoint.listener not in names:
                raise ConfigError(
                    f"advertised listener {endpoint} is not one of the listeners "
                    f"({', '.join(sorted(names))})"
                )
    else:
        advertised = [
            Endpoint(e.listener, e.host or default_host, e.port, e.security_protocol)
            for e in listeners
        ]
    for endpoint in advertised:
        if endpoint.host in ("0.0.0.0", "::"):
            raise ConfigError(
                f"advertised.listeners cannot use the nonroutable meta-address {endpoint.host} "
                f"({endpoint}): set advertised.listeners"
            )
    if inter_broker_listener_name and security_inter_broker_protocol:
        raise ConfigError(
            "only one of inter.broker.listener.name and security.inter.broker.protocol may be set"
        )
    if inter_broker_listener_name:
        inter_broker = inter_broker_listener_name.strip().upper()
    else:
        protocol = (security_inter_broker_protocol or "PLAINTEXT").strip().upper()
        if protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(f"invalid security.inter.broker.protocol {protocol!r}")
        inter_broker = protocol
    advertised_names = {e.listener for e in advertised}
    if inter_broker not in advertised_names:
        raise ConfigError(
            f"inter-broker listener {inter_broker} must be one of the advertised listeners "
            f"({', '.join(sorted(advertised_names))}): set inter.broker.listener.name"
        )
    control_plane = None
    if control_plane_listener_name:
        control_plane = control_plane_listener_name.strip().upper()
        if control_plane not in advertised_names:
            raise ConfigError(
                f"control.plane.listener.name {control_plane} must be an advertised listener"
            )
        if control_plane == inter_broker:
            raise ConfigError(
                "control.plane.listener.name must not be the inter-broker listener "
                f"({inter_broker})"
            )
    return ListenerConfig(tuple(listeners), tuple(advertised), inter_broker, control_plane)
