"""Random, well-formed requests of every API and version the broker advertises, from kio's schemas.

kio's request classes are dataclasses generated from Kafka's JSON message schemas: each field
carries its Kafka type (`metadata["kafka_type"]`), nested structures are dataclasses of their own,
arrays are `tuple[...]` and nullable fields `X | None`. `random_values(cls, rng, names)` walks a
class that way and draws plain values for every field, which `odradek.protocol.build` turns into
the entity and `odradek.protocol.codec.encode_request` into a frame: the same encoder the broker's
own clients use, so the frame is valid before any mutation.

Values lean towards what reaches the handlers' logic (small partition numbers, the fuzz topic's
name, valid record batches, -1 where Kafka uses it as "none") with a share of extremes (int32 max,
negative numbers, long strings). A few fields are kept within limits that would otherwise make a
*valid* request legitimately slow or destructive — these are requests Kafka itself would honour:

* waits and timeouts (max_wait, timeout, session and rebalance timeouts) are short;
* CreateTopics, CreatePartitions and the config APIs only validate (validate_only = True);
* topic names never name the canary topic, whose data the fuzz test checks at the end.

Mutated frames can still ask for anything; `safety.py` decides which of those to send.
"""

from __future__ import annotations

import dataclasses
import random
import types
import typing
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode

from odradek.protocol.build import build
from odradek.protocol.codec import encode_request, request_class
from odradek.protocol.record_batch import build_batch
from tests.fuzz import record_batches

INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
}
SHORT_WAIT_FIELDS = {"max_wait", "timeout", "session_timeout", "rebalance_timeout", "timeout_ms"}
VALIDATE_ONLY_FIELDS = {"validate_only"}
SMALL_FIELDS = {
    "num_partitions": 3,
    "replication_factor": 1,
    "count": 3,
    "partition": 3,
    "partition_index": 3,
    "index": 3,
}


@dataclass(frozen=True)
class Names:
    """The names the generator draws from: real topics and groups mixed with invented ones."""

    topics: Sequence[str]
    groups: Sequence[str] = ("fuzz-group",)
    forbidden: frozenset[str] = frozenset()
    """Never generated (the canary topic)."""


@dataclass(frozen=True)
class Field:
    name: str
    kafka_type: str | None
    nested: type | None
    is_array: bool
    nullable: bool
    item_nullable: bool


def _unwrap(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


@cache
def fields_of(cls: type) -> tuple[Field, ...]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp, nullable = _unwrap(hints[f.name])
        nested, is_array, item_nullable = None, False, False
        if typing.get_origin(tp) is tuple:
            is_array = True
            item, item_nullable = _unwrap(typing.get_args(tp)[0])
            if dataclasses.is_dataclass(item):
                nested = item
        elif dataclasses.is_dataclass(tp):
            nested = tp
        out.append(
            Field(f.name, f.metadata.get("kafka_type"), nested, is_array, nullable, item_nullable)
        )
    return tuple(out)


def _int(rng: random.Random, kafka_type: str, name: str) -> int:
    low, high = INT_RANGES[kafka_type]
    if name in SMALL_FIELDS:
        return rng.randint(-1 if rng.random() < 0.1 else 0, SMALL_FIELDS[name])
    if name == "acks":
        return rng.choice([-1, 0, 1, 1, 1])
    roll = rng.random()
    if roll < 0.55:
        return rng.randint(max(low, -1), min(high, 10))
    if roll < 0.75:
        return rng.choice([low, high, -1, 0, 1, min(high, 2**31 - 1)])
    return rng.randint(low, high)


def _string(rng: random.Random, name: str, names: Names) -> str:
    roll = rng.random()
    if ("topic" in name or name in ("name", "resource_name")) and roll < 0.6 and names.topics:
        return rng.choice(list(names.topics))
    if "group" in name and roll < 0.6:
        return rng.choice(list(names.groups))
    if roll < 0.1:
        return ""
    if roll < 0.15:
        return "x" * rng.randint(200, 400)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789-._"
    text = "fz-" + "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
    return text if text not in names.forbidden else "fz-renamed"


def records_value(rng: random.Random) -> bytes | None:
    """A records field: usually a valid batch, often one of the hand-made bad ones."""
    roll = rng.random()
    if roll < 0.05:
        return None
    if roll < 0.55:
        count = rng.randint(1, 5)
        return build_batch(
            [
                (b"fk", rng.randbytes(rng.randint(0, 40)), [], 1_700_000_000_000 + i)
                for i in range(count)
            ],
            compression=rng.choice([0, 0, 0, 1, 2, 3, 4]),
        )
    return rng.choice(_small_cases()).records


@cache
def _small_cases() -> tuple[record_batches.Case, ...]:
    return tuple(record_batches.cases(1_700_000_000_000))


def _scalar(rng: random.Random, field: Field, names: Names) -> Any:
    kind = field.kafka_type
    name = field.name
    if kind in INT_RANGES:
        return _int(rng, kind, name)
    if kind in ("timedelta_i32", "timedelta_i64"):
        if name in SHORT_WAIT_FIELDS or rng.random() < 0.9:
            return rng.randint(0, 100)
        return rng.randint(0, 2**31 - 1)
    if kind == "bool":
        return True if name in VALIDATE_ONLY_FIELDS else rng.random() < 0.5
    if kind == "string":
        return _string(rng, name, names)
    if kind == "bytes":
        return rng.randbytes(rng.randint(0, 40))
    if kind == "records":
        return records_value(rng)
    if kind == "uuid":
        return uuid.UUID(int=rng.getrandbits(128)) if rng.random() < 0.5 else uuid.UUID(int=0)
    if kind == "float64":
        return rng.uniform(-1e6, 1e6)
    if kind == "error_code":
        return rng.choice(list(ErrorCode))
    return None


def random_values(cls: type, rng: random.Random, names: Names, depth: int = 0) -> dict[str, Any]:
    """Plain values for every field of the kio class `cls` (see the module docstring)."""
    values: dict[str, Any] = {}
    for field in fields_of(cls):
        if field.nullable and field.kafka_type != "records" and rng.random() < 0.08:
            values[field.name] = None
            continue
        if field.is_array:
            length = rng.choice([0, 1, 1, 2, 3]) if depth < 3 else 0
            if field.nested is not None:
                values[field.name] = [
                    random_values(field.nested, rng, names, depth + 1) for _ in range(length)
                ]
            else:
                values[field.name] = [_scalar(rng, field, names) for _ in range(length)]
        elif field.nested is not None:
            values[field.name] = random_values(field.nested, rng, names, depth + 1)
        else:
            values[field.name] = _scalar(rng, field, names)
    return values


def random_request(
    api_key: int, version: int, rng: random.Random, names: Names, correlation_id: int
) -> bytes:
    """A framed, valid request (size prefix included)."""
    cls = request_class(api_key, version)
    for _ in range(20):
        values = random_values(cls, rng, names)
        try:
            entity = build(cls, values)
            return encode_request(api_key, version, correlation_id, "fuzz", entity)
        except (ValueError, TypeError, OverflowError, UnicodeError):
            continue  # a value out of the field's range: draw again
    entity = build(cls, {})
    return encode_request(api_key, version, correlation_id, "fuzz", entity)
