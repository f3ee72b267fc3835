"""The records of `__consumer_offsets`: Kafka's on-disk key and value schemas, every version.

The group coordinator stores two kinds of records in the offsets topic, as Kafka does (the JSON
schemas are in Kafka's `group-coordinator/src/main/resources/common/message/`):

| key (version)         | value (versions read; version written)      | meaning                     |
|-----------------------|---------------------------------------------|-----------------------------|
| OffsetCommitKey (0,1) | OffsetCommitValue (0-4; 3)                   | a group's committed offset  |
| GroupMetadataKey (2)  | GroupMetadataValue (0-4; 3)                  | a group's generation, members |

A key or value is a big-endian int16 version followed by the message in that version's layout;
a null value (a tombstone) deletes the key. The key's version tells the two kinds apart (0 and 1 are
offset commits, 2 is group metadata); versions 3 and up belong to Kafka's new consumer-group
protocol (KIP-848), which Odradek neither writes nor reads (`decode_key` returns None for them).

Layouts: non-flexible versions write int16-length strings (-1 for null), int32-length bytes and
int32-count arrays; flexible versions (4+) write compact forms (unsigned varint length + 1, 0 for
null) and end every struct with a tagged-field section (unsigned varint count, then tag, size and
data per field), which a reader skips. A field absent from a version is not written and reads as
its default. Kafka 3.9 writes key version 1 for offset commits, value version 3 for both values
(version 1 of OffsetCommitValue only when an explicit expire timestamp is set: OffsetCommit v1
clients), and reads all of them; so does this module.

Nothing here does I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, ClassVar

from odradek.coordinator.record_fields import RecordReader, write_uvarint
from odradek.errors import CorruptRecordError

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY = 1
GROUP_METADATA_VALUE_VERSION = 3

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_SIZES = {"int16": _INT16, "int32": _INT32, "int64": _INT64}


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of a schema: its type, the versions it exists in, and where it may be null.

    `type` is a primitive (int16, int32, int64, string, bytes) or, for an array of structs, the
    struct's record class. Version ranges are inclusive; None as the upper bound means "and up".
    """

    name: str
    type: Any
    versions: tuple[int, int | None]
    nullable: tuple[int, int | None] | None = None
    default: Any = None
    array: bool = False

    def present(self, version: int) -> bool:
        return _in(self.versions, version)

    def nullable_in(self, version: int) -> bool:
        return self.nullable is not None and _in(self.nullable, version)


def _in(versions: tuple[int, int | None], version: int) -> bool:
    low, high = versions
    return low <= version and (high is None or version <= high)


@dataclass(frozen=True, slots=True)
class RecordSpec:
    """A schema: its valid versions, the first flexible one, and its fields in order."""

    name: str
    valid: tuple[int, int]
    first_flexible: int | None
    fields: tuple[FieldSpec, ...]

    def flexible(self, version: int) -> bool:
        return self.first_flexible is not None and version >= self.first_flexible


# -- the records -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int

    SPEC: ClassVar[RecordSpec]


@dataclass(frozen=True, slots=True)
class OffsetCommitValue:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = -1
    expire_timestamp: int = -1
    """Only in version 1 (OffsetCommit v1's per-partition retention); -1 otherwise."""

    SPEC: ClassVar[RecordSpec]


@dataclass(frozen=True, slots=True)
class GroupMetadataKey:
    group: str

    SPEC: ClassVar[RecordSpec]


@dataclass(frozen=True, slots=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes

    SPEC: ClassVar[RecordSpec]


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int = -1
    members: tuple[MemberMetadata, ...] = ()

    SPEC: ClassVar[RecordSpec]


_ALL = (0, None)
OffsetCommitKey.SPEC = RecordSpec(
    "OffsetCommitKey",
    (0, 1),
    None,
    (
        FieldSpec("group", "string", (0, 1)),
        FieldSpec("topic", "string", (0, 1)),
        FieldSpec("partition", "int32", (0, 1)),
    ),
)
OffsetCommitValue.SPEC = RecordSpec(
    "OffsetCommitValue",
    (0, 4),
    4,
    (
        FieldSpec("offset", "int64", _ALL),
        FieldSpec("leader_epoch", "int32", (3, None), default=-1),
        FieldSpec("metadata", "string", _ALL),
        FieldSpec("commit_timestamp", "int64", _ALL),
        FieldSpec("expire_timestamp", "int64", (1, 1), default=-1),
    ),
)
GroupMetadataKey.SPEC = RecordSpec(
    "GroupMetadataKey", (2, 2), None, (FieldSpec("group", "string", (2, 2)),)
)
MemberMetadata.SPEC = RecordSpec(
    "MemberMetadata",
    (0, 4),
    4,
    (
        FieldSpec("member_id", "string", _ALL),
        FieldSpec("group_instance_id", "string", (3, None), nullable=(3, None)),
        FieldSpec("client_id", "string", _ALL),
        FieldSpec("client_host", "string", _ALL),
        FieldSpec("rebalance_timeout", "int32", (1, None), default=-1),
        FieldSpec("session_timeout", "int32", _ALL),
        FieldSpec("subscription", "bytes", _ALL),
        FieldSpec("assignment", "bytes", _ALL),
    ),
)
GroupMetadataValue.SPEC = RecordSpec(
    "GroupMetadataValue",
    (0, 4),
    4,
    (
        FieldSpec("protocol_type", "string", _ALL),
        FieldSpec("generation", "int32", _ALL),
        FieldSpec("protocol", "string", _ALL, nullable=_ALL),
        FieldSpec("leader", "string", _ALL, nullable=_ALL),
        FieldSpec("current_state_timestamp", "int64", (2, None), default=-1),
        FieldSpec("members", MemberMetadata, _ALL, default=(), array=True),
    ),
)

RECORDS: tuple[type, ...] = (
    OffsetCommitKey,
    OffsetCommitValue,
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
)


# -- encoding ----------------------------------------------------------------------------------


def _write_sized(
    out: bytearray, data: bytes | None, field: FieldSpec, version: int, flexible: bool
) -> None:
    if data is None:
        if not field.nullable_in(version):
            raise CorruptRecordError(f"{field.name} may not be null in version {version}")
        if flexible:
            out.append(0)
        else:
            out += (_INT16 if field.type == "string" else _INT32).pack(-1)
    elif flexible:
        write_uvarint(out, len(data) + 1)
        out += data
    else:
        out += (_INT16 if field.type == "string" else _INT32).pack(len(data))
        out += data


def _write_struct(out: bytearray, record: Any, spec: RecordSpec, version: int) -> None:
    flexible = spec.flexible(version)
    for field in spec.fields:
        if not field.present(version):
            continue
        value = getattr(record, field.name)
        if field.array:
            items = tuple(value)
            if flexible:
                write_uvarint(out, len(items) + 1)
            else:
                out += _INT32.pack(len(items))
            for item in items:
                _write_struct(out, item, field.type.SPEC, version)
        elif field.type in _SIZES:
            out += _SIZES[field.type].pack(value)
        elif field.type == "string":
            data = None if value is None else value.encode("utf-8")
            _write_sized(out, data, field, version, flexible)
        else:
            _write_sized(out, None if value is None else bytes(value), field, version, flexible)
    if flexible:
        out.append(0)  # no tagged fields


def encode(record: Any, version: int) -> bytes:
    """The record as Kafka stores it: int16 version, then the message in that version."""
    spec: RecordSpec = record.SPEC
    low, high = spec.valid
    if not low <= version <= high:
        raise CorruptRecordError(f"{spec.name} has no version {version}")
    out = bytearray(_INT16.pack(version))
    _write_struct(out, record, spec, version)
    return bytes(out)


# -- decoding ----------------------------------------------------------------------------------


def _read_sized(
    reader: RecordReader, field: FieldSpec, version: int, flexible: bool
) -> bytes | None:
    if flexible:
        length = reader.uvarint() - 1
    else:
        length = reader.fixed(_INT16 if field.type == "string" else _INT32)
    if length < 0:
        if length != -1 or not field.nullable_in(version):
            raise CorruptRecordError(f"{field.name}: invalid length {length} in version {version}")
        return None
    return reader.take(length)


def _read_struct(reader: RecordReader, cls: type, version: int) -> Any:
    spec: RecordSpec = cls.SPEC  # type: ignore[attr-defined]
    flexible = spec.flexible(version)
    values: dict[str, Any] = {}
    for field in spec.fields:
        if not field.present(version):
            values[field.name] = field.default
            continue
        if field.array:
            count = reader.uvarint() - 1 if flexible else reader.fixed(_INT32)
            if count < 0:
                raise CorruptRecordError(f"{field.name}: a null array")
            values[field.name] = tuple(
                _read_struct(reader, field.type, version) for _ in range(count)
            )
        elif field.type in _SIZES:
            values[field.name] = reader.fixed(_SIZES[field.type])
        else:
            data = _read_sized(reader, field, version, flexible)
            if field.type == "string" and data is not None:
                try:
                    values[field.name] = data.decode("utf-8")
                except UnicodeDecodeError:
                    raise CorruptRecordError(f"{field.name} is not UTF-8") from None
            else:
                values[field.name] = data
    if flexible:
        reader.skip_tagged_fields()
    return cls(**values)


def decode(cls: type, data: bytes | memoryview) -> Any:
    """A version-prefixed record of class `cls`; CorruptRecordError if it does not parse."""
    reader = RecordReader(data)
    version = reader.fixed(_INT16)
    spec: RecordSpec = cls.SPEC  # type: ignore[attr-defined]
    low, high = spec.valid
    if not low <= version <= high:
        raise CorruptRecordError(f"{spec.name} version {version} is not one Kafka 3.9 writes")
    record = _read_struct(reader, cls, version)
    reader.end(spec.name)
    return record


def record_version(data: bytes | memoryview) -> int:
    """The int16 version that starts a key or value."""
    if len(data) < 2:
        raise CorruptRecordError("a record key or value shorter than its version")
    return int(_INT16.unpack_from(data, 0)[0])


# -- what the coordinator reads and writes ------------------------------------------------------

Key = OffsetCommitKey | GroupMetadataKey


_LENGTH = struct.Struct(">h")
_VALUE_V3_HEAD = struct.Struct(">hqih")


def _fast_offset_commit_key(data: bytes) -> OffsetCommitKey | None:
    """The common key (versions 0-1, ASCII-or-UTF-8 names) without the generic codec: a load
    decodes one per record. None when anything looks unusual (the generic decoder decides)."""
    try:
        (group_length,) = _LENGTH.unpack_from(data, 2)
        topic_at = 4 + group_length
        (topic_length,) = _LENGTH.unpack_from(data, topic_at)
        partition_at = topic_at + 2 + topic_length
        if group_length < 0 or topic_length < 0 or partition_at + 4 != len(data):
            return None
        (partition,) = _INT32.unpack_from(data, partition_at)
        return OffsetCommitKey(
            data[4:topic_at].decode("utf-8"),
            data[topic_at + 2 : partition_at].decode("utf-8"),
            partition,
        )
    except (struct.error, UnicodeDecodeError):
        return None


def _fast_offset_commit_value(data: bytes) -> OffsetCommitValue | None:
    """Version 3, the one Kafka 3.x and Odradek write, without the generic codec."""
    try:
        version, offset, leader_epoch, length = _VALUE_V3_HEAD.unpack_from(data, 0)
        end = _VALUE_V3_HEAD.size + length
        if version != 3 or length < 0 or end + 8 != len(data):
            return None
        (commit_timestamp,) = _INT64.unpack_from(data, end)
        metadata = data[_VALUE_V3_HEAD.size : end].decode("utf-8")
    except (struct.error, UnicodeDecodeError):
        return None
    return OffsetCommitValue(offset, leader_epoch, metadata, commit_timestamp)


def decode_offset_commit_value(data: bytes) -> OffsetCommitValue:
    """An OffsetCommitValue of any version (the common version 3 on a fast path)."""
    fast = _fast_offset_commit_value(data)
    return fast if fast is not None else decode(OffsetCommitValue, data)  # type: ignore[no-any-return]


def decode_key(data: bytes | memoryview) -> Key | None:
    """An offsets-topic key: OffsetCommitKey (versions 0, 1) or GroupMetadataKey (2); None for
    the keys of Kafka's new consumer-group protocol (3 and up), which Odradek does not use."""
    version = record_version(data)
    if version in (0, 1):
        fast = _fast_offset_commit_key(bytes(data))
        return fast if fast is not None else decode(OffsetCommitKey, data)  # type: ignore[no-any-return]
    if version == 2:
        return decode(GroupMetadataKey, data)  # type: ignore[no-any-return]
    if version > 2:
        return None
    raise CorruptRecordError(f"offsets topic key with version {version}")


def offset_commit_key(group: str, topic: str, partition: int) -> bytes:
    return encode(OffsetCommitKey(group, topic, partition), OFFSET_COMMIT_KEY_VERSION)


def group_metadata_key(group: str) -> bytes:
    return encode(GroupMetadataKey(group), GROUP_METADATA_KEY_VERSION)


def offset_commit_value(value: OffsetCommitValue) -> bytes:
    """Version 3, or 1 when the commit carries an explicit expire timestamp (as Kafka 3.9)."""
    if value.expire_timestamp >= 0:
        return encode(value, OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY)
    return encode(value, OFFSET_COMMIT_VALUE_VERSION)


def group_metadata_value(value: GroupMetadataValue) -> bytes:
    return encode(value, GROUP_METADATA_VALUE_VERSION)
