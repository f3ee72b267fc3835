"""Transactional offset commits (TxnOffsetCommit, KIP-98): offsets a transactional producer
commits for a consumer group, visible only once its transaction commits.

`TxnOffsetCommit` validates the group (this broker must coordinate it; a generation and member
given by the producer must be the group's current ones, as for OffsetCommit), appends the offset
commits to the group's `__consumer_offsets` partition as one *transactional* batch of the
producer (acks=all, as Kafka does) and, once that is committed, keeps them *pending* under the
producer id (`GroupMetadataManager.pending_txn_offsets`). The transaction coordinator's COMMIT
marker on that partition (`complete`) stores them through the metadata manager as ordinary
commits; an ABORT marker drops them. OffsetFetch does not see pending offsets.

A broker that loads the partition after a failure replays the transactional batches with their
markers (`log_records.PartitionReplay`): committed ones become offsets, aborted ones vanish, and
those still without a marker are pending again here, so the marker the transaction coordinator
sends (again) after a failover completes them.

Concurrency: event-loop thread only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping

from kio.schema.errors import ErrorCode

from odradek.coordinator.group import log_records
from odradek.coordinator.group.coordinator import GroupCoordinator
from odradek.coordinator.group.metadata import GroupMetadata
from odradek.coordinator.group.metadata_manager import _OFFSET_ERRORS, AppendResult
from odradek.coordinator.group.offsets import OffsetAndMetadata, TopicPartition

log = logging.getLogger(__name__)


class PendingTxnOffsets:
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self.coordinator = coordinator

    @property
    def _pending(self) -> dict[int, dict[str, dict[TopicPartition, OffsetAndMetadata]]]:
        return self.coordinator.manager.pending_txn_offsets

    def commit(
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        member_id: str,
        group_instance_id: str | None,
        generation_id: int,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
    ) -> ErrorCode | Awaitable[ErrorCode]:
        """TxnOffsetCommit: NONE once the offsets are written and pending, or the error."""
        error, group = self.coordinator._validate_offset_commit(
            group_id, member_id, group_instance_id, generation_id
        )
        if error is not ErrorCode.none or group is None:
            return error
        if not offsets:
            return ErrorCode.none
        manager = self.coordinator.manager
        batch = log_records.build_records(
            [log_records.offset_commit_entry(group_id, tp, v) for tp, v in offsets.items()],
            manager.clock_ms(),
            manager.config.compression,
            producer=(producer_id, producer_epoch),
        )

        def then(result: AppendResult) -> ErrorCode:
            if result.error is not ErrorCode.none:
                log.warning("transactional offsets of group %s: %s", group_id, result.error.name)
                return ErrorCode(_OFFSET_ERRORS.get(result.error, result.error))
            self._pending.setdefault(producer_id, {}).setdefault(group_id, {}).update(offsets)
            return ErrorCode.none

        outcome = manager._append_then(
            manager.partition_of(group_id), batch, manager.config.required_acks, then
        )
        if isinstance(outcome, ErrorCode):
            return outcome
        return asyncio.shield(outcome)

    def pending_groups(self, producer_id: int) -> list[str]:
        return sorted(self._pending.get(producer_id, {}))

    def complete(
        self, offsets_partition: int, producer_id: int, commit: bool
    ) -> list[Awaitable[object]]:
        """A marker for `producer_id` reached `__consumer_offsets` partition
        `offsets_partition`: store (commit) or drop (abort) its pending offsets of the groups of
        that partition."""
        groups = self._pending.get(producer_id)
        if not groups:
            return []
        manager = self.coordinator.manager
        stores: list[Awaitable[object]] = []
        for group_id in list(groups):
            if manager.partition_of(group_id) != offsets_partition:
                continue
            offsets = groups.pop(group_id)
            if not commit:
                continue
            group = manager.groups.get(group_id)
            if group is None:
                group = self.coordinator.groups[group_id] = GroupMetadata(
                    group_id, state_timestamp_ms=manager.clock_ms()
                )
            outcome = manager.store_offsets(group, offsets)
            if not isinstance(outcome, dict):
                stores.append(outcome)
        if not groups:
            del self._pending[producer_id]
        return stores
