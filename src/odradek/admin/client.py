"""The Kafka-protocol admin client the tools and the console share: connections to a cluster's
brokers through the project's own client (`BrokerConnection`, with the `--command-config` security
settings), never through ZooKeeper, so it works against any Kafka-compatible broker.

`AdminClient` connects to the first bootstrap server that answers and sends Metadata v12,
CreateTopics v7 and DeleteTopics v6 (to the controller, as Kafka's admin client does in ZooKeeper
mode; to the bootstrap broker if the controller is unknown or unreachable), ApiVersions and
DescribeConfigs. A Kafka error code in a response becomes `KafkaResponseError`, whose message
starts with the code's name (`TOPIC_ALREADY_EXISTS: ...`), what an operator reads in Kafka's tools.

Concurrency: an `AdminClient` is owned by one event loop.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from odradek.errors import NetworkError, OperatorError
from odradek.network.client import PLAINTEXT_CLIENT, BrokerConnection, ClientSecurity
from odradek.protocol.build import build
from odradek.protocol.codec import ApiKey, request_class

METADATA_VERSION = 12
CREATE_TOPICS_VERSION = 7
DELETE_TOPICS_VERSION = 6
API_VERSIONS_VERSION = 3
DESCRIBE_CONFIGS_MAX_VERSION = 4
TOPIC_RESOURCE_TYPE = 2  # DescribeConfigs resource type of a topic
DEFAULT_CONFIG_SOURCE = 5  # DescribeConfigs config_source of a value nobody set
ZERO_UUID = uuid.UUID(int=0)

_HOST_PORT = re.compile(r"(\[[^\]]+\]|[^:,\s]+):(\d{1,5})")


class KafkaResponseError(OperatorError):
    """A response carried a Kafka error code; the message starts with the code's name."""

    def __init__(self, code: ErrorCode, message: str | None) -> None:
        name = code.name.upper()
        detail = " ".join((message or "").split())
        super().__init__(f"{name}: {detail}" if detail else name)
        self.code = code


def parse_bootstrap(text: str) -> list[tuple[str, int]]:
    """`host:port[,host:port...]` -> [(host, port)]; OperatorError naming a bad entry."""
    servers = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = _HOST_PORT.fullmatch(item)
        if not match or not 0 < int(match.group(2)) < 65536:
            raise OperatorError(f"invalid --bootstrap-server entry {item!r}: expected HOST:PORT")
        servers.append((match.group(1).strip("[]"), int(match.group(2))))
    if not servers:
        raise OperatorError("--bootstrap-server is empty")
    return servers


def check_error(code: ErrorCode, message: str | None = None) -> None:
    if code != ErrorCode.none:
        raise KafkaResponseError(code, message)


@dataclass
class AdminClient:
    """The connections one `odradek topics` command uses. Owned by one event loop."""

    bootstrap: BrokerConnection
    timeout: float
    security: ClientSecurity = PLAINTEXT_CLIENT

    @classmethod
    async def connect(
        cls,
        servers: Sequence[tuple[str, int]],
        timeout: float,
        security: ClientSecurity = PLAINTEXT_CLIENT,
    ) -> AdminClient:
        """Connect to the first bootstrap server that answers (and authenticate, with the
        `--command-config` security settings)."""
        problems = []
        for host, port in servers:
            try:
                connection = await BrokerConnection.connect(
                    host, port, timeout=timeout, client_id="odradek-admin", security=security
                )
            except NetworkError as e:
                problems.append(str(e))
                continue
            return cls(connection, timeout, security)
        raise OperatorError("; ".join(problems))

    def close(self) -> None:
        self.bootstrap.close()

    async def _send(
        self, connection: BrokerConnection, api_key: int, version: int, values: Any
    ) -> Any:
        request = build(request_class(api_key, version), values)
        try:
            return await connection.send(api_key, version, request, timeout=self.timeout + 5)
        except NetworkError as e:
            raise OperatorError(str(e)) from None

    async def metadata(self, topics: Sequence[str] | None) -> Any:
        names = None if topics is None else [{"name": t, "topic_id": ZERO_UUID} for t in topics]
        return await self._send(
            self.bootstrap,
            ApiKey.METADATA,
            METADATA_VERSION,
            {"topics": names, "allow_auto_topic_creation": False},
        )

    async def _controller_connection(self) -> BrokerConnection:
        """A connection to the controller, where ZooKeeper-mode Kafka requires topic changes to
        go; the bootstrap connection itself when the controller is unknown or unreachable."""
        metadata = await self.metadata([])
        controller = next(
            (b for b in metadata.brokers if b.node_id == metadata.controller_id), None
        )
        if controller is None:
            return self.bootstrap
        try:
            return await self.connection_to(controller.host, controller.port, "odradek-admin")
        except NetworkError:
            return self.bootstrap

    async def connection_to(self, host: str, port: int, client_id: str) -> BrokerConnection:
        """The bootstrap connection when it goes to host:port; else a new connection there with
        this client's timeout and security (the `--command-config` settings), which the caller
        closes. NetworkError when it cannot connect."""
        if (host, port) == (self.bootstrap.host, self.bootstrap.port):
            return self.bootstrap
        return await BrokerConnection.connect(
            host, port, timeout=self.timeout, client_id=client_id, security=self.security
        )

    async def _send_to_controller(self, api_key: int, version: int, values: Any) -> Any:
        connection = await self._controller_connection()
        try:
            return await self._send(connection, api_key, version, values)
        finally:
            if connection is not self.bootstrap:
                connection.close()

    async def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        assignment: dict[int, list[int]],
        configs: dict[str, str],
    ) -> Any:
        topic = {
            "name": name,
            "num_partitions": -1 if assignment else partitions,
            "replication_factor": -1 if assignment else replication_factor,
            "assignments": [
                {"partition_index": p, "broker_ids": replicas} for p, replicas in assignment.items()
            ],
            "configs": [{"name": k, "value": v} for k, v in configs.items()],
        }
        values = {"topics": [topic], "timeout": int(self.timeout * 1000), "validate_only": False}
        response = await self._send_to_controller(
            ApiKey.CREATE_TOPICS, CREATE_TOPICS_VERSION, values
        )
        result = response.topics[0]
        check_error(result.error_code, result.error_message)
        return result

    async def delete_topic(self, name: str) -> None:
        values = {
            "topics": [{"name": name, "topic_id": ZERO_UUID}],
            "timeout": int(self.timeout * 1000),
        }
        response = await self._send_to_controller(
            ApiKey.DELETE_TOPICS, DELETE_TOPICS_VERSION, values
        )
        result = response.responses[0]
        check_error(result.error_code, result.error_message)

    async def supported_version(self, api_key: int, highest: int) -> int | None:
        """The highest version of `api_key` up to `highest` that the bootstrap broker offers."""
        response = await self._send(
            self.bootstrap,
            ApiKey.API_VERSIONS,
            API_VERSIONS_VERSION,
            {"client_software_name": "odradek-topics", "client_software_version": "0.1.0"},
        )
        for api in response.api_keys:
            if api.api_key == api_key and api.min_version <= highest:
                return min(highest, int(api.max_version))
        return None

    async def topic_configs(self, topics: Sequence[str]) -> dict[str, list[tuple[str, str]]]:
        """Each topic's configs that differ from the broker defaults; empty lists when the
        broker does not offer DescribeConfigs."""
        if not topics:
            return {}
        version = await self.supported_version(
            ApiKey.DESCRIBE_CONFIGS, DESCRIBE_CONFIGS_MAX_VERSION
        )
        if version is None:
            return {t: [] for t in topics}
        resources = [
            {"resource_type": TOPIC_RESOURCE_TYPE, "resource_name": t, "configuration_keys": None}
            for t in topics
        ]
        response = await self._send(
            self.bootstrap, ApiKey.DESCRIBE_CONFIGS, version, {"resources": resources}
        )
        configs: dict[str, list[tuple[str, str]]] = {t: [] for t in topics}
        for result in response.results:
            check_error(result.error_code, result.error_message)
            configs[result.resource_name] = [
                (entry.name, entry.value if entry.value is not None else "")
                for entry in result.configs
                if entry.config_source != DEFAULT_CONFIG_SOURCE and not entry.is_sensitive
            ]
        return configs
