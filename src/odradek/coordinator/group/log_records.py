"""The coordinator's records as they sit in `__consumer_offsets` partitions: writing them as one
record batch, replaying a partition's batches into the groups and offsets they describe, and
turning a group into its metadata record and back.

Writing. Each store (an OffsetCommit, a group's metadata, tombstones) is one RecordBatch v2 with
CreateTime timestamps (the commit time), compressed with `offsets.topic.compression.codec`, no
producer id: what Kafka's coordinator appends. Keys and values are `schemas`' bytes; a tombstone
has a null value.

Replaying (`PartitionReplay`, Kafka's doLoadGroupsAndOffsets). The partition is read from its log
start offset to its log end offset, batch by batch, in offset order; for every key the last record
wins:

* an offset commit sets the group's committed offset of that partition, a tombstone removes it;
* group metadata replaces the group's generation, protocol, leader and members, a tombstone
  removes the group (its offsets go with it only if they are tombstoned too: a group deleted and
  then committed to again is a group with offsets only);
* control batches (transaction markers) are skipped; so are the keys of Kafka's new consumer-group
  protocol (versions 3+), which Odradek does not use.

A batch that does not decode is a corrupt log: `CorruptRecordError` stops the load (the broker
then refuses the partition's groups rather than forget offsets silently).

Nothing here does I/O. Decoding records is Python work per record, done only when a coordinator
partition loads, never on the produce or fetch path.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from odradek.coordinator.group import schemas
from odradek.coordinator.group.metadata import GroupMetadata, GroupState, MemberMetadata
from odradek.coordinator.group.offsets import OffsetAndMetadata
from odradek.coordinator.group.schemas import (
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
)
from odradek.coordinator.group.schemas import MemberMetadata as MemberRecord
from odradek.errors import CorruptRecordError
from odradek.protocol.record_batch import (
    CompressionType,
    build_batch,
    decode_records,
    iter_batches,
)

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

KeyValue = tuple[bytes, bytes | None]


def build_records(
    entries: Sequence[KeyValue],
    timestamp_ms: int,
    compression: int = CompressionType.NONE,
    producer: tuple[int, int] | None = None,
) -> bytes:
    """One record batch holding `entries` (key, value or None for a tombstone), in order; with
    `producer` (id, epoch) a transactional batch of that producer (TxnOffsetCommit)."""
    if producer is None:
        return build_batch(
            [(key, value, (), timestamp_ms) for key, value in entries],
            compression=CompressionType(compression),
        )
    return build_batch(
        [(key, value, (), timestamp_ms) for key, value in entries],
        compression=CompressionType(compression),
        producer_id=producer[0],
        producer_epoch=producer[1],
        base_sequence=0,  # the coordinator's own write: no sequence is checked
        is_transactional=True,
    )


def offset_commit_entry(
    group_id: str, partition: TopicPartition, value: OffsetAndMetadata
) -> KeyValue:
    topic, index = partition
    return (
        schemas.offset_commit_key(group_id, topic, index),
        schemas.offset_commit_value(
            OffsetCommitValue(
                offset=value.offset,
                leader_epoch=value.leader_epoch,
                metadata=value.metadata,
                commit_timestamp=value.commit_timestamp,
                expire_timestamp=value.expire_timestamp,
            )
        ),
    )


def offset_tombstone(group_id: str, partition: TopicPartition) -> KeyValue:
    return schemas.offset_commit_key(group_id, partition[0], partition[1]), None


def group_metadata_entry(group_id: str, value: GroupMetadataValue) -> KeyValue:
    return schemas.group_metadata_key(group_id), schemas.group_metadata_value(value)


def group_tombstone(group_id: str) -> KeyValue:
    return schemas.group_metadata_key(group_id), None


def split_batches(data: bytes | memoryview, size: int) -> Iterable[memoryview]:
    """`data` (whole batches) in slices of about `size` bytes, cut at batch boundaries."""
    view = memoryview(data)
    start = end = 0
    for header in iter_batches(view):
        end = header.position + header.size
        if end - start >= size:
            yield view[start:end]
            start = end
    if end > start:
        yield view[start:end]


@dataclass(slots=True)
class ReplayedGroup:
    """What a partition's log says about one group."""

    metadata: GroupMetadataValue | None = None
    offsets: dict[TopicPartition, tuple[OffsetAndMetadata, int]] = field(default_factory=dict)
    """Committed value and the log offset of its record, per partition."""


@dataclass(slots=True)
class PartitionReplay:
    """The state of one offsets partition, built by feeding it the partition's batches in order."""

    groups: dict[str, ReplayedGroup] = field(default_factory=dict)
    records: int = 0
    batches: int = 0
    next_offset: int = 0
    """The offset after the last record fed (where the next read starts)."""
    pending: dict[int, list[tuple[int, bytes, bytes | None]]] = field(default_factory=dict)
    """Records of open transactions (TxnOffsetCommit), by producer id, in offset order."""

    def feed(self, data: bytes | memoryview) -> None:
        """Apply every whole batch in `data` (a chunk read from the log). A transactional batch
        (TxnOffsetCommit) waits under its producer id until that producer's marker: COMMIT
        applies it, ABORT drops it; what is still waiting at the end is `pending`."""
        view = memoryview(data)
        for header in iter_batches(view):
            self.next_offset = header.base_offset + header.last_offset_delta + 1
            self.batches += 1
            batch = view[header.position : header.position + header.size]
            if header.is_control:
                waiting = self.pending.pop(header.producer_id, [])
                records = decode_records(batch)
                key = records[0].key if records else None
                if key is not None and len(key) == 4 and key[2:4] == b"\x00\x01":  # COMMIT
                    for offset, record_key, value in waiting:
                        self._apply(offset, record_key, value)
                continue
            for record in decode_records(batch):
                self.records += 1
                if record.key is None:
                    raise CorruptRecordError(
                        f"a record without a key at offset {record.offset} of the offsets topic"
                    )
                if header.is_transactional:
                    self.pending.setdefault(header.producer_id, []).append(
                        (record.offset, record.key, record.value)
                    )
                else:
                    self._apply(record.offset, record.key, record.value)

    def pending_offsets(self) -> dict[int, dict[str, dict[TopicPartition, OffsetAndMetadata]]]:
        """Transactional offset commits whose marker is not in the log yet, by producer id."""
        found: dict[int, dict[str, dict[TopicPartition, OffsetAndMetadata]]] = {}
        for producer_id, entries in self.pending.items():
            for _offset, key_bytes, value in entries:
                key = schemas.decode_key(key_bytes)
                if not isinstance(key, OffsetCommitKey) or value is None:
                    continue
                decoded = schemas.decode_offset_commit_value(value)
                found.setdefault(producer_id, {}).setdefault(key.group, {})[
                    (key.topic, key.partition)
                ] = OffsetAndMetadata(
                    decoded.offset,
                    decoded.leader_epoch,
                    decoded.metadata,
                    decoded.commit_timestamp,
                    decoded.expire_timestamp,
                )
        return found

    def _apply(self, offset: int, key_bytes: bytes, value: bytes | None) -> None:
        key = schemas.decode_key(key_bytes)
        if key is None:
            return
        if isinstance(key, OffsetCommitKey):
            group = self.groups.setdefault(key.group, ReplayedGroup())
            partition = (key.topic, key.partition)
            if value is None:
                group.offsets.pop(partition, None)
                return
            decoded = schemas.decode_offset_commit_value(value)
            group.offsets[partition] = (
                OffsetAndMetadata(
                    decoded.offset,
                    decoded.leader_epoch,
                    decoded.metadata,
                    decoded.commit_timestamp,
                    decoded.expire_timestamp,
                ),
                offset,
            )
        elif isinstance(key, GroupMetadataKey):
            if value is None:
                found = self.groups.get(key.group)
                if found is not None:
                    found.metadata = None
                    if not found.offsets:
                        del self.groups[key.group]
                return
            self.groups.setdefault(key.group, ReplayedGroup()).metadata = schemas.decode(
                GroupMetadataValue, value
            )

    def loaded_groups(self) -> Iterable[tuple[str, ReplayedGroup]]:
        """The groups that exist after the replay: with metadata, offsets or both."""
        return (
            (group_id, group)
            for group_id, group in self.groups.items()
            if group.metadata is not None or group.offsets
        )


def group_record(group: GroupMetadata, assignment: Mapping[str, bytes]) -> GroupMetadataValue:
    """The GroupMetadataValue of `group` with `assignment` (member id -> bytes)."""
    protocol = group.protocol_name
    return GroupMetadataValue(
        protocol_type=group.protocol_type or "",
        generation=group.generation_id,
        protocol=protocol,
        leader=group.leader_id,
        current_state_timestamp=group.state_timestamp_ms,
        members=tuple(
            MemberRecord(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                rebalance_timeout=m.rebalance_timeout_ms,
                session_timeout=m.session_timeout_ms,
                subscription=m.metadata_for(protocol) if protocol else b"",
                assignment=assignment.get(m.member_id, b""),
            )
            for m in group.members.values()
        ),
    )


def group_from_record(group_id: str, value: GroupMetadataValue | None) -> GroupMetadata:
    """A group as its last metadata record left it (Kafka's loadGroup): Stable with its members
    and assignments, or Empty; a group with offsets only when there is no record."""
    if value is None:
        return GroupMetadata(group_id)
    group = GroupMetadata(
        group_id,
        state=GroupState.STABLE if value.members else GroupState.EMPTY,
        state_timestamp_ms=value.current_state_timestamp,
        generation_id=value.generation,
        protocol_type=value.protocol_type or None,
        protocol_name=value.protocol,
        leader_id=value.leader,
    )
    for record in value.members:
        member = MemberMetadata(
            member_id=record.member_id,
            group_instance_id=record.group_instance_id,
            client_id=record.client_id,
            client_host=record.client_host,
            rebalance_timeout_ms=(
                record.rebalance_timeout
                if record.rebalance_timeout >= 0
                else record.session_timeout
            ),
            session_timeout_ms=record.session_timeout,
            protocol_type=value.protocol_type,
            protocols=((value.protocol or "", record.subscription),),
            assignment=record.assignment,
        )
        group.members[member.member_id] = member
        if member.group_instance_id is not None:
            group.static_members[member.group_instance_id] = member.member_id
    return group
