"""The records of `__consumer_offsets` (`odradek.coordinator.group.schemas`) against Kafka 3.9:

* structure: every field of every record, in every version Kafka reads, has the JSON schema's name,
  type, versions and nullability (`kafka_schemas/*.json`, from kafka-group-coordinator-3.9.1.jar);
* bytes against the schemas: what Odradek writes equals what an encoder driven by the JSON alone
  (the one of test_interbroker_schemas) writes for the same values;
* bytes against Kafka: every vector that Kafka's own generated classes wrote
  (`group_record_vectors.json`, made by `GroupRecordVectors.java`) decodes, and encodes back to the
  same bytes;
* placement: a group's partition is what Kafka 3.9.1 computes (`Utils.abs(hashCode) % 50`, run in
  Java to make the table below).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from odradek.coordinator.group import schemas
from odradek.coordinator.group.placement import java_string_hash, partition_for
from odradek.coordinator.group.schemas import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
)
from odradek.errors import CorruptRecordError
from tests.unit.test_interbroker_schemas import Schema, encode_struct, in_versions, snake

VECTORS = json.loads(
    (Path(__file__).parent / "kafka_schemas" / "group_record_vectors.json").read_text()
)
CLASSES = {
    "OffsetCommitKey": OffsetCommitKey,
    "OffsetCommitValue": OffsetCommitValue,
    "GroupMetadataKey": GroupMetadataKey,
    "GroupMetadataValue": GroupMetadataValue,
}
VERSIONS = {
    "OffsetCommitKey": (0, 1),
    "OffsetCommitValue": (0, 4),
    "GroupMetadataKey": (2, 2),
    "GroupMetadataValue": (0, 4),
}


def _json_fields(schema: Schema, fields: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    return [
        (snake(f["name"]), f["type"], in_versions(f.get("nullableVersions"), schema.version))
        for f in schema.fields(fields)
    ]


def _our_fields(spec: schemas.RecordSpec, version: int) -> list[tuple[str, str, bool]]:
    out = []
    for field in spec.fields:
        if not field.present(version):
            continue
        kind = f"[]{field.type.SPEC.name}" if field.array else field.type
        out.append((field.name, kind, field.nullable_in(version)))
    return out


@pytest.mark.parametrize(
    ("name", "version"),
    [(name, v) for name, (low, high) in VERSIONS.items() for v in range(low, high + 1)],
)
def test_fields_match_kafkas_schema(name: str, version: int) -> None:
    schema = Schema(name, version)
    spec: schemas.RecordSpec = CLASSES[name].SPEC  # type: ignore[attr-defined]
    low, _, high = schema.doc["validVersions"].partition("-")
    assert spec.valid == (int(low), int(high or low))
    assert spec.flexible(version) == schema.flexible
    assert _our_fields(spec, version) == _json_fields(schema, schema.doc["fields"])
    if name == "GroupMetadataValue":
        members = schema.common["MemberMetadata"]["fields"]
        assert _our_fields(MemberMetadata.SPEC, version) == _json_fields(schema, members)


MEMBERS = (
    MemberMetadata("m-1", None, "client-1", "/127.0.0.1", 300_000, 45_000, b"\x00\x01sub", b"asg"),
    MemberMetadata("m-2", "static-2", "clïent-2", "/10.0.0.2", 60_000, 10_000, b"", b"\x01"),
)


def _values_for(name: str, version: int) -> Any:
    if name == "OffsetCommitKey":
        return OffsetCommitKey("grüppe", "orders", 12)
    if name == "GroupMetadataKey":
        return GroupMetadataKey("group-✓")
    if name == "OffsetCommitValue":
        return OffsetCommitValue(
            2**40 + 7,
            leader_epoch=5 if version >= 3 else -1,
            metadata="meta",
            commit_timestamp=1_700_000_000_000,
            expire_timestamp=1_800_000_000_000 if version == 1 else -1,
        )
    members = tuple(
        MemberMetadata(
            m.member_id,
            m.group_instance_id if version >= 3 else None,
            m.client_id,
            m.client_host,
            m.rebalance_timeout if version >= 1 else -1,
            m.session_timeout,
            m.subscription,
            m.assignment,
        )
        for m in MEMBERS
    )
    return GroupMetadataValue(
        "consumer", 7, "range", "m-1", 1_700_000_000_123 if version >= 2 else -1, members
    )


@pytest.mark.parametrize(
    ("name", "version"),
    [(name, v) for name, (low, high) in VERSIONS.items() for v in range(low, high + 1)],
)
def test_bytes_match_an_encoder_driven_by_the_schema(name: str, version: int) -> None:
    record = _values_for(name, version)
    schema = Schema(name, version)
    expected = struct.pack(">h", version) + encode_struct(schema.doc["fields"], record, schema)
    written = schemas.encode(record, version)
    assert written == expected
    assert schemas.decode(CLASSES[name], written) == record


@pytest.mark.parametrize(
    "vector", VECTORS, ids=[f"{v['name']}-v{v['version']}-{i}" for i, v in enumerate(VECTORS)]
)
def test_kafkas_own_bytes_decode_and_encode_back(vector: dict[str, Any]) -> None:
    data = bytes.fromhex(vector["hex"])
    record = schemas.decode(CLASSES[vector["name"]], data)
    assert schemas.encode(record, vector["version"]) == data
    if vector["name"].endswith("Key"):
        assert schemas.decode_key(data) == record  # the fast path for offset commit keys
    if vector["name"] == "OffsetCommitValue":
        assert schemas.decode_offset_commit_value(data) == record


def test_the_versions_written_are_kafka_39s() -> None:
    by_name = {(v["name"], v["version"]): bytes.fromhex(v["hex"]) for v in VECTORS}
    key = schemas.decode(OffsetCommitKey, by_name[("OffsetCommitKey", 1)])
    assert (
        schemas.offset_commit_key(key.group, key.topic, key.partition)
        == by_name[("OffsetCommitKey", 1)]
    )
    assert schemas.group_metadata_key("group-1") == by_name[("GroupMetadataKey", 2)]
    value = schemas.decode(OffsetCommitValue, by_name[("OffsetCommitValue", 3)])
    assert schemas.offset_commit_value(value)[:2] == b"\x00\x03"
    expiring = schemas.decode(OffsetCommitValue, by_name[("OffsetCommitValue", 1)])
    assert schemas.offset_commit_value(expiring) == by_name[("OffsetCommitValue", 1)]
    group = schemas.decode(GroupMetadataValue, by_name[("GroupMetadataValue", 3)])
    assert schemas.group_metadata_value(group) == by_name[("GroupMetadataValue", 3)]


def test_new_protocol_keys_are_skipped_and_garbage_is_refused() -> None:
    assert schemas.decode_key(b"\x00\x03\x00\x01g") is None  # ConsumerGroupMetadataKey
    with pytest.raises(CorruptRecordError):
        schemas.decode_key(b"\x00")
    with pytest.raises(CorruptRecordError):
        schemas.decode_key(b"\xff\xff")
    good = schemas.offset_commit_key("g", "t", 1)
    with pytest.raises(CorruptRecordError):
        schemas.decode(OffsetCommitKey, good[:-1])
    with pytest.raises(CorruptRecordError):
        schemas.decode(OffsetCommitKey, good + b"\x00")
    with pytest.raises(CorruptRecordError):
        schemas.decode(OffsetCommitValue, b"\x00\x09" + bytes(30))


def test_flexible_versions_skip_unknown_tagged_fields() -> None:
    value = OffsetCommitValue(5, 1, "m", 9)
    plain = schemas.encode(value, 4)
    assert plain.endswith(b"\x00")
    tagged = plain[:-1] + b"\x01\x07\x02hi"  # one tagged field: tag 7, two bytes
    assert schemas.decode(OffsetCommitValue, tagged) == value


# Computed by Kafka 3.9.1 itself: `s.hashCode()` and `Utils.abs(s.hashCode()) % 50`.
KAFKA_PLACEMENT = [
    ("", 0, 0),
    ("a", 97, 47),
    ("group-1", 293427299, 49),
    ("hello world", 1794106052, 2),
    ("grüppe-€-𝄞", -115574012, 12),
    ("consumer-group-xyz" * 10, -961502968, 18),
    ("polygenelubricants", -(2**31), 0),
    ("GydZG_", -(2**31), 0),
]


@pytest.mark.parametrize(("group", "hashed", "partition"), KAFKA_PLACEMENT)
def test_placement_is_kafkas(group: str, hashed: int, partition: int) -> None:
    assert java_string_hash(group) == hashed
    assert partition_for(group, 50) == partition
