"""The transaction marker sender (Kafka's TransactionMarkerChannelManager): once a transaction is
in PrepareCommit or PrepareAbort, write its COMMIT or ABORT marker to every partition it touched,
then record the transaction complete.

For each transaction handed over (`add_markers_to_send`) one task runs until done:

1. group the partitions still without a marker by their leader (as the broker's metadata cache
   knows it) and send each leader one WriteTxnMarkers (v1) request for them, with the producer id,
   epoch, result and the coordinator epoch;
2. a partition answered NONE has its marker: it leaves the transaction's partition set; a
   partition whose topic no longer exists is dropped too (Kafka does the same: nobody can read
   it); any other error (no leader, NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS, a broker that
   cannot be reached, a timeout) is retried after `RETRY_BACKOFF_S` with fresh metadata — for
   ever, as Kafka retries: the partition's last stable offset waits for that marker;
3. once every partition has its marker, the CompleteCommit/CompleteAbort transition is appended to
   `__transaction_state` (`complete`), retried while it fails with COORDINATOR_NOT_AVAILABLE.

A marker is idempotent on the partition (a second COMMIT for a producer without an ongoing
transaction changes nothing that readers see), so retrying after a lost answer is safe. A round
that fails unexpectedly is retried too. The task stops only when the coordinator gives up the
`__transaction_state` partition or reloads it at a newer epoch (`remove_markers_for_partition`):
that load finds the transaction in Prepare* and sends its markers again. Nothing else sends them,
so a task must never be dropped without such a load (the coordinator's `on_elected` keeps them
across a leadership restated at the same epoch). Connections to leaders are kept and reused; one
that fails is dropped and reopened on the next attempt.

Concurrency: event-loop thread only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from odradek.coordinator.transaction.metadata import TopicPartition, TransactionMetadata
from odradek.network.client import BrokerConnection, ClientSecurity
from odradek.protocol.build import build
from odradek.protocol.codec import ApiKey

log = logging.getLogger(__name__)

RETRY_BACKOFF_S = 0.1
REQUEST_TIMEOUT_S = 30.0
WRITE_TXN_MARKERS_VERSION = 1


class MarkerMetadata(Protocol):
    """What the sender reads of the broker's metadata cache."""

    def leader_of(self, topic: str, partition: int) -> tuple[int, str, int] | None:
        """(broker id, host, port) of the partition's leader, None while it has none."""
        ...

    def topic_exists(self, topic: str) -> bool: ...


@dataclass(slots=True)
class PendingMarkers:
    transactional_id: str
    txn_partition: int
    coordinator_epoch: int
    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: set[TopicPartition]
    task: asyncio.Task[None] | None = None


class TransactionMarkerChannelManager:
    def __init__(
        self,
        metadata: MarkerMetadata,
        security: ClientSecurity,
    ) -> None:
        self.metadata = metadata
        self.security = security
        self._pending: dict[str, PendingMarkers] = {}
        self._connections: dict[int, BrokerConnection] = {}
        self.markers_written = 0

    def pending(self) -> list[PendingMarkers]:
        return list(self._pending.values())

    def add_markers_to_send(
        self,
        txn_partition: int,
        coordinator_epoch: int,
        commit: bool,
        metadata: TransactionMetadata,
        on_written: Callable[[PendingMarkers], Awaitable[None]],
    ) -> None:
        """Write the markers of `metadata`'s partitions, then await `on_written` (which records
        the transaction complete)."""
        previous = self._pending.pop(metadata.transactional_id, None)
        if previous is not None and previous.task is not None:
            previous.task.cancel()
        pending = PendingMarkers(
            metadata.transactional_id,
            txn_partition,
            coordinator_epoch,
            metadata.producer_id,
            metadata.producer_epoch,
            commit,
            set(metadata.partitions),
        )
        self._pending[metadata.transactional_id] = pending
        pending.task = asyncio.get_running_loop().create_task(
            self._run(pending, metadata, on_written)
        )

    def remove_markers_for_partition(self, txn_partition: int) -> None:
        for transactional_id, pending in list(self._pending.items()):
            if pending.txn_partition == txn_partition:
                del self._pending[transactional_id]
                if pending.task is not None:
                    pending.task.cancel()

    async def shutdown(self) -> None:
        tasks = [p.task for p in self._pending.values() if p.task is not None]
        self._pending.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()

    async def _run(
        self,
        pending: PendingMarkers,
        metadata: TransactionMetadata,
        on_written: Callable[[PendingMarkers], Awaitable[None]],
    ) -> None:
        failed_rounds = 0
        try:
            while pending.partitions:
                try:
                    await self._send_round(pending)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    # Only this task writes these markers: were it to end here, the transaction
                    # would stay in Prepare* for ever. An unexpected failure (the metadata cache,
                    # an answer we cannot read) is retried like any error.
                    failed_rounds += 1
                    if failed_rounds == 1 or failed_rounds % 100 == 0:
                        log.exception(
                            "a round of %s's markers failed (%d so far); retrying",
                            pending.transactional_id,
                            failed_rounds,
                        )
                if pending.partitions:
                    await asyncio.sleep(RETRY_BACKOFF_S)
            metadata.partitions.clear()
            await on_written(pending)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("writing the markers of %s failed", pending.transactional_id)
        finally:
            if self._pending.get(pending.transactional_id) is pending:
                del self._pending[pending.transactional_id]

    async def _send_round(self, pending: PendingMarkers) -> None:
        by_leader: dict[tuple[int, str, int], list[TopicPartition]] = {}
        for topic, partition in sorted(pending.partitions):
            if not self.metadata.topic_exists(topic):
                log.info(
                    "dropping the %s marker of %s for %s-%d: the topic is gone",
                    "COMMIT" if pending.commit else "ABORT",
                    pending.transactional_id,
                    topic,
                    partition,
                )
                pending.partitions.discard((topic, partition))
                continue
            leader = self.metadata.leader_of(topic, partition)
            if leader is not None:
                by_leader.setdefault(leader, []).append((topic, partition))
        if by_leader:
            await asyncio.gather(
                *(self._send(pending, leader, tps) for leader, tps in by_leader.items())
            )

    async def _connection(self, broker_id: int, host: str, port: int) -> BrokerConnection:
        connection = self._connections.get(broker_id)
        if connection is not None and not connection.closed and connection.port == port:
            return connection
        if connection is not None:
            connection.close()
        connection = await BrokerConnection.connect(
            host,
            port,
            timeout=REQUEST_TIMEOUT_S,
            client_id="txn-marker-sender",
            security=self.security,
        )
        self._connections[broker_id] = connection
        return connection

    async def _send(
        self,
        pending: PendingMarkers,
        leader: tuple[int, str, int],
        partitions: list[TopicPartition],
    ) -> None:
        from kio.schema.write_txn_markers.v1.request import WriteTxnMarkersRequest

        broker_id, host, port = leader
        topics: dict[str, list[int]] = {}
        for topic, partition in partitions:
            topics.setdefault(topic, []).append(partition)
        request = build(
            WriteTxnMarkersRequest,
            {
                "markers": [
                    {
                        "producer_id": pending.producer_id,
                        "producer_epoch": pending.producer_epoch,
                        "transaction_result": pending.commit,
                        "topics": [
                            {"name": topic, "partition_indexes": ids}
                            for topic, ids in topics.items()
                        ],
                        "coordinator_epoch": pending.coordinator_epoch,
                    }
                ]
            },
        )
        try:
            connection = await self._connection(broker_id, host, port)
            response: Any = await connection.send(
                ApiKey.WRITE_TXN_MARKERS,
                WRITE_TXN_MARKERS_VERSION,
                request,
                timeout=REQUEST_TIMEOUT_S,
            )
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.info(
                "WriteTxnMarkers for %s to broker %d failed (%s); retrying",
                pending.transactional_id,
                broker_id,
                e,
            )
            stale = self._connections.pop(broker_id, None)
            if stale is not None:
                stale.close()
            return
        for marker in response.markers:
            for topic in marker.topics:
                for result in topic.partitions:
                    key = (topic.name, int(result.partition_index))
                    error = ErrorCode(result.error_code)
                    if error is ErrorCode.none:
                        pending.partitions.discard(key)
                        self.markers_written += 1
                    elif error in (
                        ErrorCode.invalid_producer_epoch,
                        ErrorCode.transaction_coordinator_fenced,
                    ):
                        # A newer coordinator or epoch owns the producer: our markers are moot.
                        log.warning(
                            "marker of %s for %s-%d refused (%s): giving up",
                            pending.transactional_id,
                            key[0],
                            key[1],
                            error.name,
                        )
                        pending.partitions.discard(key)
                    else:
                        log.debug(
                            "marker of %s for %s-%d: %s; retrying",
                            pending.transactional_id,
                            key[0],
                            key[1],
                            error.name,
                        )
