"""Broker registration (`/brokers/ids/<id>`, its endpoints and rack) and the cluster id (`/cluster/id`).

See the package docstring for the conventions every class here follows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from odradek.zk.errors import InvalidZNodeDataError
from odradek.zk.znodes._common import _dumps, _field, _int, _loads, _now_ms, _object, _str

# Brokers


@dataclass(frozen=True, slots=True)
class EndPoint:
    """One advertised listener: `LISTENER_NAME://host:port` plus its security protocol."""

    listener_name: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"

    @classmethod
    def plaintext(cls, host: str, port: int) -> EndPoint:
        return cls("PLAINTEXT", host, port, "PLAINTEXT")

    @property
    def connection_string(self) -> str:
        # IPv6 literals are bracketed so the last colon still separates the port.
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.listener_name}://{host}:{self.port}"

    @classmethod
    def parse(
        cls, connection_string: str, protocol_map: Mapping[str, str] | None, where: str
    ) -> EndPoint:
        """Parse `NAME://host:port`; the security protocol comes from the listener map.

        Without a map (registrations older than version 4), the listener name must itself be a
        security protocol name, as in Kafka.
        """
        name, sep, rest = connection_string.partition("://")
        host, colon, port_text = rest.rpartition(":")
        if not sep or not name or not colon:
            raise InvalidZNodeDataError(f"{where}: bad endpoint {connection_string!r}", path=where)
        try:
            port = int(port_text)
        except ValueError:
            raise InvalidZNodeDataError(
                f"{where}: bad port in endpoint {connection_string!r}", path=where
            ) from None
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        protocol = protocol_map.get(name) if protocol_map is not None else name
        if protocol is None:
            raise InvalidZNodeDataError(
                f"{where}: listener {name!r} missing from listener_security_protocol_map",
                path=where,
            )
        return cls(name, host, port, protocol)


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """A decoded `/brokers/ids/<id>` registration.

    `broker_epoch` is the registration znode's czxid: it grows every time the broker registers
    again (after a restart or a session expiry), so the controller can refuse requests meant for a
    previous incarnation of the broker.
    """

    id: int
    host: str | None
    port: int
    endpoints: tuple[EndPoint, ...]
    rack: str | None
    broker_epoch: int
    jmx_port: int = -1
    features: Mapping[str, Any] = field(default_factory=dict)
    version: int = 5

    def endpoint(self, listener_name: str) -> EndPoint | None:
        for endpoint in self.endpoints:
            if endpoint.listener_name == listener_name:
                return endpoint
        return None


class BrokersZNode:
    @staticmethod
    def path() -> str:
        return "/brokers"


class BrokerIdsZNode:
    """Parent of the ephemeral broker registrations; its children are broker ids as text."""

    @staticmethod
    def path() -> str:
        return "/brokers/ids"


class BrokerIdZNode:
    """`/brokers/ids/<id>`: the ephemeral registration of a live broker (JSON version 5).

    Fields: version, host and port (of the first PLAINTEXT endpoint, for pre-0.10 clients; null
    and -1 when there is none), endpoints (`NAME://host:port`), listener_security_protocol_map,
    jmx_port, timestamp (milliseconds, as a string), features (KIP-584 supported features), and rack
    only when the broker has one -- Kafka omits the key rather than writing null.
    """

    VERSION = 5

    @staticmethod
    def path(broker_id: int) -> str:
        return f"{BrokerIdsZNode.path()}/{broker_id}"

    @staticmethod
    def encode(
        endpoints: Sequence[EndPoint],
        *,
        rack: str | None = None,
        jmx_port: int = -1,
        features: Mapping[str, Any] | None = None,
        timestamp_ms: int | None = None,
    ) -> bytes:
        plaintext = next((e for e in endpoints if e.security_protocol == "PLAINTEXT"), None)
        payload: dict[str, Any] = {
            "version": BrokerIdZNode.VERSION,
            "host": plaintext.host if plaintext else None,
            "port": plaintext.port if plaintext else -1,
            "endpoints": [e.connection_string for e in endpoints],
            "listener_security_protocol_map": {
                e.listener_name: e.security_protocol for e in endpoints
            },
            "jmx_port": jmx_port,
            "features": dict(features or {}),
            "timestamp": str(_now_ms() if timestamp_ms is None else timestamp_ms),
        }
        if rack is not None:
            payload["rack"] = rack
        return _dumps(payload)

    @staticmethod
    def decode(broker_id: int, data: bytes, czxid: int) -> BrokerInfo:
        """Decode a registration; `czxid` is the znode's creation zxid (the broker epoch)."""
        where = BrokerIdZNode.path(broker_id)
        obj = _loads(data, where)
        version = _int(obj, "version", where)
        host = obj.get("host")
        if host is not None and not isinstance(host, str):
            raise InvalidZNodeDataError(f"{where}: field 'host' is not a string", path=where)
        port = _int(obj, "port", where) if obj.get("port") is not None else -1
        if version <= 1:
            if host is None:
                raise InvalidZNodeDataError(f"{where}: version 1 without a host", path=where)
            endpoints: tuple[EndPoint, ...] = (EndPoint.plaintext(host, port),)
        else:
            raw_map = obj.get("listener_security_protocol_map")
            protocol_map = None
            if raw_map is not None:
                protocol_map = _object(raw_map, "listener_security_protocol_map", where)
            raw_endpoints = _field(obj, "endpoints", where)
            if not isinstance(raw_endpoints, list) or not all(
                isinstance(e, str) for e in raw_endpoints
            ):
                raise InvalidZNodeDataError(f"{where}: 'endpoints' is not a list", path=where)
            endpoints = tuple(EndPoint.parse(e, protocol_map, where) for e in raw_endpoints)
        rack = obj.get("rack")
        if rack is not None and not isinstance(rack, str):
            raise InvalidZNodeDataError(f"{where}: field 'rack' is not a string", path=where)
        jmx_port = obj.get("jmx_port", -1)
        features = obj.get("features") or {}
        return BrokerInfo(
            id=broker_id,
            host=host,
            port=port,
            endpoints=endpoints,
            rack=rack,
            broker_epoch=czxid,
            jmx_port=jmx_port if isinstance(jmx_port, int) else -1,
            features=_object(features, "features", where),
            version=version,
        )


# ---------------------------------------------------------------------------------------------
# Cluster id


@dataclass(frozen=True, slots=True)
class ClusterId:
    id: str
    zk_version: int


class ClusterZNode:
    @staticmethod
    def path() -> str:
        return "/cluster"


class ClusterIdZNode:
    """`/cluster/id`: `{"version":"1","id":"<cluster id>"}` -- note the version is a string here,
    unlike every other Kafka znode. Created once by the first broker; never changes."""

    @staticmethod
    def path() -> str:
        return f"{ClusterZNode.path()}/id"

    @staticmethod
    def encode(cluster_id: str) -> bytes:
        return _dumps({"version": "1", "id": cluster_id})

    @staticmethod
    def decode(data: bytes, stat_version: int) -> ClusterId:
        where = ClusterIdZNode.path()
        return ClusterId(_str(_loads(data, where), "id", where), stat_version)
