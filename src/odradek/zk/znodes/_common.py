"""What the znode families share: `TopicPartition`, and JSON helpers -- compact encoding as Kafka's
Jackson writes it, and decoding whose errors become `InvalidZNodeDataError` naming the znode and the
bad field."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from odradek.zk.errors import InvalidZNodeDataError


class TopicPartition(NamedTuple):
    """A topic name and partition index (Kafka's `TopicPartition`); compares equal to a tuple."""

    topic: str
    partition: int


def _dumps(value: object) -> bytes:
    # Compact separators and raw UTF-8 match what Kafka's Jackson writer produces.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _loads(data: bytes, where: str) -> dict[str, Any]:
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidZNodeDataError(f"{where}: not valid JSON ({exc})", path=where) from None
    if not isinstance(value, dict):
        raise InvalidZNodeDataError(f"{where}: expected a JSON object", path=where)
    return value


def _field(obj: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise InvalidZNodeDataError(f"{where}: missing field {key!r}", path=where)
    return obj[key]


def _int(obj: Mapping[str, Any], key: str, where: str) -> int:
    value = _field(obj, key, where)
    # bool is an int in Python but never a valid number in these payloads.
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidZNodeDataError(f"{where}: field {key!r} is not an integer", path=where)
    return value


def _str(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = _field(obj, key, where)
    if not isinstance(value, str):
        raise InvalidZNodeDataError(f"{where}: field {key!r} is not a string", path=where)
    return value


def _int_list(value: Any, what: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise InvalidZNodeDataError(f"{where}: {what} is not a list of integers", path=where)
    return tuple(value)


def _object(value: Any, what: str, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidZNodeDataError(f"{where}: {what} is not a JSON object", path=where)
    return value


def _now_ms() -> int:
    return int(time.time() * 1000)


def _sequence_number(child: str, prefix: str) -> str:
    """The counter ZooKeeper appended to a sequential child's name (`isr_change_0000000042`)."""
    index = child.rfind(prefix)
    if index < 0:
        raise InvalidZNodeDataError(f"{child!r} is not a {prefix}<seq> node", path=child)
    return child[index + len(prefix) :]


def _partition_list(partitions: Iterable[TopicPartition]) -> list[dict[str, Any]]:
    return [{"topic": tp.topic, "partition": tp.partition} for tp in partitions]


def _decode_partition_list(obj: Mapping[str, Any], where: str) -> frozenset[TopicPartition]:
    entries = _field(obj, "partitions", where)
    if not isinstance(entries, list):
        raise InvalidZNodeDataError(f"{where}: 'partitions' is not a list", path=where)
    result = set()
    for entry in entries:
        entry = _object(entry, "a partitions entry", where)
        result.add(TopicPartition(_str(entry, "topic", where), _int(entry, "partition", where)))
    return frozenset(result)
