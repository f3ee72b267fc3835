"""Transactions through the Kafka protocol, for `odradek transactions` and the console's
transactions page (what Kafka's admin client does for `kafka-transactions.sh`).

* `list_transactions` asks every broker (ListTransactions v1, optionally only some states): each
  answers for the `__transaction_state` partitions it leads, so the broker is the coordinator;
* `describe` asks a transactional id's coordinator (FindCoordinator with key type 1, then
  DescribeTransactions v0): state, producer id and epoch, timeout, start time, partitions;
* `producers` asks a partition's leader (DescribeProducers v0) for its active producers and where
  each one's open transaction starts;
* `abort` sends the partition's leader an ABORT marker (WriteTxnMarkers v1, which needs
  CLUSTER_ACTION) for one producer: how a *hanging* transaction is ended, one whose coordinator no
  longer knows it and which holds the partition's last stable offset back for ever;
  `abort_hanging` finds that producer first from the offset where its transaction starts.

A Kafka error code in an answer raises `KafkaResponseError` (its message starts with the code's
name); a mistake in what was asked raises `OperatorError`.

Concurrency: owned by one event loop, like the `GroupAdminClient` it talks through.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from odradek.admin.client import KafkaResponseError
from odradek.admin.groups import GroupAdminClient
from odradek.errors import OperatorError
from odradek.protocol.codec import ApiKey

LIST_TRANSACTIONS_VERSION = 1
DESCRIBE_TRANSACTIONS_VERSION = 0
DESCRIBE_PRODUCERS_VERSION = 0
WRITE_TXN_MARKERS_VERSION = 1
FIND_COORDINATOR_VERSION = 3
TRANSACTION_KEY_TYPE = 1
# Kafka's TransactionState names, as ListTransactions filters on them and answers them.
TRANSACTION_STATES = (
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "PrepareEpochFence",
    "Dead",
)


@dataclass(frozen=True, slots=True, order=True)
class TransactionListing:
    """One line of ListTransactions: the broker that answered is the id's coordinator."""

    transactional_id: str
    coordinator: int
    producer_id: int
    state: str


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    transactional_id: str
    coordinator: int
    state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    start_time_ms: int | None  # None: no transaction in progress
    partitions: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class ActiveProducer:
    """A partition's producer as DescribeProducers reports it."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp_ms: int
    coordinator_epoch: int
    current_txn_start_offset: int | None  # None: no open transaction on this partition


def milliseconds(value: Any) -> int:
    """A duration or an instant of a decoded answer in ms (-1 for none)."""
    if isinstance(value, datetime.timedelta):
        return value // datetime.timedelta(milliseconds=1)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    return int(value) if value is not None else -1


class TransactionsAdmin:
    def __init__(self, client: GroupAdminClient) -> None:
        self.client = client

    async def coordinator(self, transactional_id: str) -> int:
        client = self.client
        deadline = time.monotonic() + client.timeout
        while True:
            answer = await client._send(
                client.bootstrap,
                ApiKey.FIND_COORDINATOR,
                FIND_COORDINATOR_VERSION,
                {"key": transactional_id, "key_type": TRANSACTION_KEY_TYPE},
            )
            code = ErrorCode(answer.error_code)
            if code is ErrorCode.none:
                return int(answer.node_id)
            if time.monotonic() >= deadline or code not in (
                ErrorCode.coordinator_not_available,
                ErrorCode.coordinator_load_in_progress,
            ):
                raise KafkaResponseError(code, answer.error_message)
            await asyncio.sleep(0.2)

    async def list_transactions(self, states: Sequence[str] = ()) -> list[TransactionListing]:
        """Every transactional id of every coordinator (only those in `states` when given)."""
        found = []
        for broker_id in sorted(await self.client.brokers()):
            answer = await self.client.to_broker(
                broker_id,
                ApiKey.LIST_TRANSACTIONS,
                LIST_TRANSACTIONS_VERSION,
                {"state_filters": list(states), "producer_id_filters": [], "duration_filter": -1},
            )
            code = ErrorCode(answer.error_code)
            if code is not ErrorCode.none:
                raise KafkaResponseError(code, f"ListTransactions on broker {broker_id}")
            for state in answer.transaction_states:
                found.append(
                    TransactionListing(
                        state.transactional_id,
                        broker_id,
                        int(state.producer_id),
                        state.transaction_state,
                    )
                )
        return sorted(found)

    async def describe(self, transactional_id: str) -> TransactionDescription:
        coordinator = await self.coordinator(transactional_id)
        (described,) = await self.describe_at(coordinator, [transactional_id])
        if isinstance(described, KafkaResponseError):
            raise described
        return described

    async def describe_at(
        self, coordinator: int, transactional_ids: Sequence[str]
    ) -> list[TransactionDescription | KafkaResponseError]:
        """DescribeTransactions of ids that broker `coordinator` coordinates, in one request:
        per id its description or its error (one id's error does not fail the others)."""
        answer = await self.client.to_broker(
            coordinator,
            ApiKey.DESCRIBE_TRANSACTIONS,
            DESCRIBE_TRANSACTIONS_VERSION,
            {"transactional_ids": list(transactional_ids)},
        )
        results: list[TransactionDescription | KafkaResponseError] = []
        for state in answer.transaction_states:
            code = ErrorCode(state.error_code)
            if code is not ErrorCode.none:
                results.append(KafkaResponseError(code, f"describing {state.transactional_id}"))
                continue
            start = milliseconds(state.transaction_start_time)
            results.append(
                TransactionDescription(
                    transactional_id=state.transactional_id,
                    coordinator=coordinator,
                    state=state.transaction_state,
                    producer_id=int(state.producer_id),
                    producer_epoch=int(state.producer_epoch),
                    timeout_ms=milliseconds(state.transaction_timeout),
                    start_time_ms=start if start >= 0 else None,
                    partitions=tuple((t.topic, int(p)) for t in state.topics for p in t.partitions),
                )
            )
        return results

    async def leader(self, topic: str, partition: int) -> int:
        metadata = await self.client.metadata([topic])
        for entry in metadata.topics:
            if ErrorCode(entry.error_code) is not ErrorCode.none:
                raise KafkaResponseError(ErrorCode(entry.error_code), f"topic {topic}")
            for p in entry.partitions:
                if int(p.partition_index) == partition:
                    return int(p.leader_id)
        raise OperatorError(f"{topic}-{partition} does not exist")

    async def producers(self, topic: str, partition: int) -> list[ActiveProducer]:
        leader = await self.leader(topic, partition)
        answer = await self.client.to_broker(
            leader,
            ApiKey.DESCRIBE_PRODUCERS,
            DESCRIBE_PRODUCERS_VERSION,
            {"topics": [{"name": topic, "partition_indexes": [partition]}]},
        )
        (result,) = answer.topics[0].partitions
        code = ErrorCode(result.error_code)
        if code is not ErrorCode.none:
            raise KafkaResponseError(code, result.error_message)
        return [
            ActiveProducer(
                producer_id=int(p.producer_id),
                producer_epoch=int(p.producer_epoch),
                last_sequence=int(p.last_sequence),
                last_timestamp_ms=int(p.last_timestamp),
                coordinator_epoch=int(p.coordinator_epoch),
                current_txn_start_offset=(
                    int(p.current_txn_start_offset) if p.current_txn_start_offset >= 0 else None
                ),
            )
            for p in result.active_producers
        ]

    async def abort(
        self, topic: str, partition: int, producer_id: int, epoch: int, coordinator_epoch: int
    ) -> None:
        leader = await self.leader(topic, partition)
        answer = await self.client.to_broker(
            leader,
            ApiKey.WRITE_TXN_MARKERS,
            WRITE_TXN_MARKERS_VERSION,
            {
                "markers": [
                    {
                        "producer_id": producer_id,
                        "producer_epoch": epoch,
                        "transaction_result": False,
                        "topics": [{"name": topic, "partition_indexes": [partition]}],
                        "coordinator_epoch": coordinator_epoch,
                    }
                ]
            },
        )
        code = ErrorCode(answer.markers[0].topics[0].partitions[0].error_code)
        if code is not ErrorCode.none:
            raise KafkaResponseError(code, f"aborting on {topic}-{partition}")

    async def abort_hanging(
        self, topic: str, partition: int, start_offset: int, producer_id: int | None = None
    ) -> tuple[int, int, int]:
        """Abort the open transaction that starts at `start_offset` of the partition: its
        producer found with DescribeProducers, then `abort` with that producer's id, epoch and
        coordinator epoch (as Kafka's admin client does). With `producer_id`, only when the
        transaction there is that producer's (what an operator confirmed may have ended and
        another begun since). Returns (producer id, epoch, coordinator epoch)."""
        matching = [
            p
            for p in await self.producers(topic, partition)
            if p.current_txn_start_offset == start_offset and producer_id in (None, p.producer_id)
        ]
        if not matching:
            whose = f" of producer {producer_id}" if producer_id is not None else ""
            raise OperatorError(
                f"no open transaction{whose} starts at offset {start_offset} of {topic}-{partition}"
            )
        producer = matching[0]
        coordinator_epoch = max(0, producer.coordinator_epoch)
        await self.abort(
            topic, partition, producer.producer_id, producer.producer_epoch, coordinator_epoch
        )
        return producer.producer_id, producer.producer_epoch, coordinator_epoch
