"""The hand-written ZooKeeper-era messages (`odradek.protocol.messages`) against Kafka 3.9's own
JSON schemas (`kafka_schemas/`, from kafka-clients-3.9.1.jar).

kio's code generator would produce these classes from the schemas, but it lives only in kio's
source repository (it is not part of the package on PyPI), so the classes are written by hand in
kio's style and this test holds them to the schemas:

* structure: for the version Odradek defines, every struct (nested ones included) has exactly the
  schema's fields, in the schema's order, with the schema's types; the version, flexibility and api
  key match the schema;
* bytes: realistic messages written by kio's serializer are byte for byte what an encoder driven by
  the schema alone (below; it does not use kio) writes for the same values.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import typing
import uuid
from pathlib import Path
from typing import Any

import pytest

from odradek.protocol.messages import INTERBROKER_MESSAGES
from tests.unit.test_interbroker_messages import ROUND_TRIP_CASES, encode

SCHEMAS = Path(__file__).parent / "kafka_schemas"

MESSAGE_CLASSES = [
    (api_key, version, cls)
    for api_key, versions in sorted(INTERBROKER_MESSAGES.items())
    for version, pair in sorted(versions.items())
    for cls in pair
]


def load_schema(name: str) -> dict[str, Any]:
    """A schema file; Kafka's reader allows `//` comments, JSON does not."""
    text = (SCHEMAS / f"{name}.json").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("//")]
    return typing.cast(dict[str, Any], json.loads("\n".join(lines)))


def in_versions(spec: str | None, version: int) -> bool:
    """Kafka's version ranges: "0+", "2-4", "5", "none"."""
    if spec is None or spec == "none":
        return False
    if spec.endswith("+"):
        return version >= int(spec[:-1])
    low, _, high = spec.partition("-")
    return int(low) <= version <= int(high or low)


RENAMED_FIELDS = {"PartitionEpoch": "zk_version"}
"""Kafka 3.3 renamed the partition states' `ZkVersion` to `PartitionEpoch` (same place, type and
bytes); the classes follow the ZooKeeper-mode schemas (3.2) and keep the old name."""

KIO_TYPE_NAMES = {"error_code": "int16"}
"""kio types an int16 error code field as `error_code` (its ErrorCode enum)."""


def snake(name: str) -> str:
    """A schema field name as kio spells it ("LeaderEpoch" -> "leader_epoch")."""
    if name in RENAMED_FIELDS:
        return RENAMED_FIELDS[name]
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Schema:
    """One message schema at one version."""

    def __init__(self, name: str, version: int) -> None:
        self.doc = load_schema(name)
        self.version = version
        self.flexible = in_versions(self.doc.get("flexibleVersions"), version)
        self.common = {s["name"]: s for s in self.doc.get("commonStructs", [])}

    def fields(self, fields: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The fields present in this version, tagged ones excluded (listed by `tagged`)."""
        return [
            f
            for f in fields
            if in_versions(f["versions"], self.version)
            and not in_versions(f.get("taggedVersions"), self.version)
        ]

    def tagged(self, fields: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [f for f in fields if in_versions(f.get("taggedVersions"), self.version)]

    def struct_fields(self, field: dict[str, Any]) -> list[dict[str, Any]]:
        """The fields of a struct-typed field: inline, or from commonStructs."""
        if "fields" in field:
            return typing.cast(list[dict[str, Any]], field["fields"])
        return typing.cast(list[dict[str, Any]], self.common[element_type(field)]["fields"])


def element_type(field: dict[str, Any]) -> str:
    kind = typing.cast(str, field["type"])
    return kind[2:] if kind.startswith("[]") else kind


PRIMITIVES = {
    "int8": ">b",
    "int16": ">h",
    "int32": ">i",
    "int64": ">q",
    "uint16": ">H",
    "float64": ">d",
}


# --- an encoder driven by the schema alone --------------------------------------------------------


def uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_primitive(kind: str, value: Any, schema: Schema, nullable: bool) -> bytes:
    if kind in PRIMITIVES:
        return struct.pack(PRIMITIVES[kind], int(value) if kind != "float64" else value)
    if kind == "bool":
        return b"\x01" if value else b"\x00"
    if kind == "uuid":
        return (value or uuid.UUID(int=0)).bytes
    if kind in ("string", "bytes"):
        if value is None:
            assert nullable, f"null {kind} in a field that is not nullable"
            return (
                uvarint(0)
                if schema.flexible
                else struct.pack(">h" if kind == "string" else ">i", -1)
            )
        data = value.encode() if kind == "string" else bytes(value)
        if schema.flexible:
            return uvarint(len(data) + 1) + data
        return struct.pack(">h" if kind == "string" else ">i", len(data)) + data
    raise AssertionError(f"type {kind} is not used by these schemas")


def encode_field(field: dict[str, Any], value: Any, schema: Schema) -> bytes:
    kind = field["type"]
    nullable = in_versions(field.get("nullableVersions"), schema.version)
    if not kind.startswith("[]"):
        if kind in PRIMITIVES or kind in ("bool", "uuid", "string", "bytes"):
            return encode_primitive(kind, value, schema, nullable)
        return encode_struct(schema.struct_fields(field), value, schema)
    if value is None:
        assert nullable
        return uvarint(0) if schema.flexible else struct.pack(">i", -1)
    items = list(value)
    out = uvarint(len(items) + 1) if schema.flexible else struct.pack(">i", len(items))
    element = element_type(field)
    for item in items:
        if element in PRIMITIVES or element in ("bool", "uuid", "string", "bytes"):
            out += encode_primitive(element, item, schema, False)
        else:
            out += encode_struct(schema.struct_fields(field), item, schema)
    return out


def encode_struct(fields: list[dict[str, Any]], value: Any, schema: Schema) -> bytes:
    out = b"".join(
        encode_field(f, getattr(value, snake(f["name"])), schema) for f in schema.fields(fields)
    )
    if schema.flexible:
        # No version defined here has tagged fields; were one added, its default is not written.
        assert not schema.tagged(fields), "tagged fields: extend this encoder"
        out += uvarint(0)
    return out


# --- the checks -------------------------------------------------------------------------------------


def check_structure(cls: type, fields: list[dict[str, Any]], schema: Schema, where: str) -> None:
    expected = schema.fields(fields)
    actual = dataclasses.fields(cls)  # type: ignore[arg-type]
    assert [f.name for f in actual] == [snake(f["name"]) for f in expected], where
    hints = typing.get_type_hints(cls)
    for ours, theirs in zip(actual, expected, strict=True):
        path = f"{where}.{ours.name}"
        element = element_type(theirs)
        if element in PRIMITIVES or element in ("bool", "uuid", "string", "bytes"):
            kafka_type = ours.metadata.get("kafka_type")
            assert KIO_TYPE_NAMES.get(kafka_type, kafka_type) == element, path
            continue
        nested = nested_class(hints[ours.name])
        assert nested.__name__ == element, path
        check_structure(nested, schema.struct_fields(theirs), schema, path)


def nested_class(hint: Any) -> type:
    """The struct class inside `tuple[X, ...]`, `X` or `X | None`."""
    for candidate in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(candidate) and isinstance(candidate, type):
            return candidate
        for inner in typing.get_args(candidate):
            if dataclasses.is_dataclass(inner) and isinstance(inner, type):
                return inner
    raise AssertionError(f"no struct class in {hint}")


@pytest.mark.parametrize(
    ("api_key", "version", "cls"),
    MESSAGE_CLASSES,
    ids=[f"{cls.__name__}-v{version}" for _, version, cls in MESSAGE_CLASSES],
)
def test_structure_matches_kafka_schema(api_key: int, version: int, cls: type) -> None:
    schema = Schema(cls.__name__, version)
    assert schema.doc["apiKey"] == api_key
    assert in_versions(schema.doc["validVersions"], version)
    assert cls.__version__ == version  # type: ignore[attr-defined]
    assert cls.__flexible__ == schema.flexible  # type: ignore[attr-defined]
    assert cls.__api_key__ == api_key  # type: ignore[attr-defined]
    check_structure(cls, schema.doc["fields"], schema, cls.__name__)


@pytest.mark.parametrize("make", ROUND_TRIP_CASES.values(), ids=ROUND_TRIP_CASES.keys())
def test_bytes_match_an_encoder_driven_by_the_kafka_schema(
    make: typing.Callable[[], object],
) -> None:
    message = make()
    cls = type(message)
    schema = Schema(cls.__name__, cls.__version__)  # type: ignore[attr-defined]
    assert encode(message) == encode_struct(schema.doc["fields"], message, schema)


def test_every_message_class_has_a_sample() -> None:
    sampled = {type(make()) for make in ROUND_TRIP_CASES.values()}
    assert sampled == {cls for _, _, cls in MESSAGE_CLASSES}
