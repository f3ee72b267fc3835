"""Transactional offset commits (TxnOffsetCommit, KIP-98): offsets a transactional producer
commits for a consumer group, visible only once its transaction commits.

`TxnOffsetCommit` validates the group (this broker must coordinate it; a generation and member
given by the producer must be the group's current ones, as for OffsetCommit) and keeps the offsets
*pending* under the producer id. The transaction coordinator's COMMIT marker on the group's
`__consumer_offsets` partition (`complete`) stores them through the metadata manager as ordinary
commits; an ABORT marker drops them. OffsetFetch does not see pending offsets.

Known gap against Kafka: Kafka appends the pending commits to `__consumer_offsets` at once, in a
transactional batch, and replays them (with the markers) when another broker loads the
partition; here they live in memory until the marker, so a group coordinator that dies between
TxnOffsetCommit and the marker loses them (the transaction then commits without its offsets).

Concurrency: event-loop thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping

from kio.schema.errors import ErrorCode

from odradek.coordinator.group.coordinator import GroupCoordinator
from odradek.coordinator.group.offsets import OffsetAndMetadata, TopicPartition

log = logging.getLogger(__name__)


class PendingTxnOffsets:
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self.coordinator = coordinator
        # producer id -> group id -> partition -> offset
        self._pending: dict[int, dict[str, dict[TopicPartition, OffsetAndMetadata]]] = {}

    def commit(
        self,
        group_id: str,
        producer_id: int,
        member_id: str,
        group_instance_id: str | None,
        generation_id: int,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
    ) -> ErrorCode:
        """TxnOffsetCommit: NONE once the offsets are pending, or the group's error."""
        error, group = self.coordinator._validate_offset_commit(
            group_id, member_id, group_instance_id, generation_id
        )
        if error is not ErrorCode.none or group is None:
            return error
        self._pending.setdefault(producer_id, {}).setdefault(group_id, {}).update(offsets)
        return ErrorCode.none

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
                log.warning("group %s left this coordinator; transactional offsets lost", group_id)
                continue
            outcome = manager.store_offsets(group, offsets)
            if not isinstance(outcome, dict):
                stores.append(outcome)
        if not groups:
            del self._pending[producer_id]
        return stores
