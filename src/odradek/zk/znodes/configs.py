"""Dynamic configuration: per-topic and per-broker overrides under `/config` and the change
notifications that tell every broker to re-read them.

See the package docstring for the conventions every class here follows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from odradek.zk.errors import InvalidZNodeDataError
from odradek.zk.znodes._common import _dumps, _int, _loads, _object, _sequence_number, _str

# Dynamic configuration


@dataclass(frozen=True, slots=True)
class EntityConfig:
    """Config overrides of one entity (a topic, a broker, or the broker default)."""

    config: Mapping[str, str]
    zk_version: int


class ConfigZNode:
    @staticmethod
    def path() -> str:
        return "/config"


def _encode_entity_config(config: Mapping[str, str]) -> bytes:
    return _dumps({"version": 1, "config": {k: str(v) for k, v in config.items()}})


def _decode_entity_config(data: bytes, stat_version: int, where: str) -> EntityConfig:
    # Kafka treats an empty payload as "no overrides", so do we.
    if not data:
        return EntityConfig({}, stat_version)
    obj = _loads(data, where)
    config = _object(obj.get("config") or {}, "'config'", where)
    for key, value in config.items():
        if not isinstance(value, str):
            raise InvalidZNodeDataError(f"{where}: config {key!r} is not a string", path=where)
    return EntityConfig(dict(config), stat_version)


class TopicConfigZNode:
    """`/config/topics/<topic>`: `{"version":1,"config":{"retention.ms":"1000",..}}`; values are
    always strings. Kafka writes this znode (empty config) when it creates a topic."""

    @staticmethod
    def path(topic: str) -> str:
        return f"{ConfigZNode.path()}/topics/{topic}"

    @staticmethod
    def encode(config: Mapping[str, str]) -> bytes:
        return _encode_entity_config(config)

    @staticmethod
    def decode(data: bytes, stat_version: int, topic: str = "") -> EntityConfig:
        return _decode_entity_config(data, stat_version, TopicConfigZNode.path(topic))


class BrokerConfigZNode:
    """`/config/brokers/<id>` (or `/config/brokers/<default>` for the cluster-wide default)."""

    DEFAULT = "<default>"

    @staticmethod
    def path(broker: int | str) -> str:
        return f"{ConfigZNode.path()}/brokers/{broker}"

    @staticmethod
    def encode(config: Mapping[str, str]) -> bytes:
        return _encode_entity_config(config)

    @staticmethod
    def decode(data: bytes, stat_version: int, broker: int | str = "") -> EntityConfig:
        return _decode_entity_config(data, stat_version, BrokerConfigZNode.path(broker))


@dataclass(frozen=True, slots=True)
class ConfigChangeNotification:
    """Which entity's config changed: `entity_type` is the plural directory name ("topics",
    "brokers", ...), `entity_name` the topic name or broker id."""

    entity_type: str
    entity_name: str
    zk_version: int


class ConfigChangeNotificationZNode:
    """`/config/changes`: parent of the config change notifications."""

    @staticmethod
    def path() -> str:
        return f"{ConfigZNode.path()}/changes"


class ConfigChangeNotificationSequenceZNode:
    """`/config/changes/config_change_<seq>`: persistent sequential; JSON version 2,
    `{"version":2,"entity_path":"topics/<topic>"}`. Every broker watches the parent and re-reads
    the named entity's config. Decoding also accepts Kafka's version 1 (entity_type/entity_name).
    """

    PREFIX = "config_change_"

    @staticmethod
    def path(sequence_number: str = "") -> str:
        return f"{ConfigChangeNotificationZNode.path()}/{ConfigChangeNotificationSequenceZNode.PREFIX}{sequence_number}"

    @staticmethod
    def sequence_number(child: str) -> str:
        return _sequence_number(child, ConfigChangeNotificationSequenceZNode.PREFIX)

    @staticmethod
    def encode(entity_type: str, entity_name: str) -> bytes:
        return _dumps({"version": 2, "entity_path": f"{entity_type}/{entity_name}"})

    @staticmethod
    def decode(data: bytes, stat_version: int) -> ConfigChangeNotification:
        where = ConfigChangeNotificationZNode.path()
        obj = _loads(data, where)
        if _int(obj, "version", where) == 1:
            entity_type, entity_name = (
                _str(obj, "entity_type", where),
                _str(obj, "entity_name", where),
            )
        else:
            entity_type, slash, entity_name = _str(obj, "entity_path", where).partition("/")
            if not slash or not entity_name:
                raise InvalidZNodeDataError(f"{where}: bad entity_path", path=where)
        return ConfigChangeNotification(entity_type, entity_name, stat_version)
