"""Transaction APIs answered by the transaction coordinator: FindCoordinator with key type 1
(TRANSACTION), InitProducerId with a transactional id (22), AddPartitionsToTxn (24),
AddOffsetsToTxn (25), EndTxn (26), DescribeTransactions (65) and ListTransactions (66).

These handlers translate between wire versions and the `TransactionCoordinator`. FindCoordinator
answers from any broker: the leader of the id's `__transaction_state` partition (the broker
creates the topic on first use, `TransactionServices.ensure_transaction_topic`, and answers
COORDINATOR_NOT_AVAILABLE until it has a leader); key type 0 (groups) goes to the group
coordinator's handler. Old versions name errors that newer ones renamed: PRODUCER_FENCED is
INVALID_PRODUCER_EPOCH for InitProducerId before v4, AddPartitionsToTxn/AddOffsetsToTxn/EndTxn
before v2, as Kafka answers (KIP-588).

Authorization happens before the coordinator is asked (`odradek.server.authorization_txn`).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from kio.schema.errors import ErrorCode

from odradek.coordinator.find_coordinator import (
    ClusterMetadata,
    find_coordinator_response,
    locate_coordinator,
)
from odradek.coordinator.group import handlers as group_handlers
from odradek.coordinator.group.placement import OFFSETS_TOPIC, partition_for
from odradek.coordinator.transaction.coordinator import TransactionCoordinator
from odradek.coordinator.transaction.log_records import TRANSACTION_STATE_TOPIC
from odradek.protocol.build import build_response

if TYPE_CHECKING:
    from odradek.network.request_context import RequestContext

TRANSACTION_KEY_TYPE = 1


class TransactionServices(Protocol):
    @property
    def transaction_coordinator(self) -> TransactionCoordinator: ...

    @property
    def metadata_cache(self) -> ClusterMetadata: ...

    def ensure_transaction_topic(self) -> None: ...


def _fenced(error: ErrorCode, version: int, first_with_producer_fenced: int) -> ErrorCode:
    if error is ErrorCode.producer_fenced and version < first_with_producer_fenced:
        return ErrorCode.invalid_producer_epoch
    return error


def _ms(value: datetime.timedelta | int) -> int:
    if isinstance(value, datetime.timedelta):
        return value // datetime.timedelta(milliseconds=1)
    return int(value)


# ---------------------------------------------------------------------------------------------
# FindCoordinator


def handle_find_coordinator(services: Any, context: RequestContext, request: Any) -> Any:
    key_type = int(getattr(request, "key_type", 0))
    if key_type != TRANSACTION_KEY_TYPE:
        return group_handlers.handle_find_coordinator(services, context, request)
    header = context.header
    cache = services.metadata_cache
    coordinator: TransactionCoordinator = services.transaction_coordinator

    def find(key: str) -> dict[str, Any]:
        return locate_coordinator(
            cache,
            key,
            TRANSACTION_STATE_TOPIC,
            coordinator.manager.partition_of,
            services.ensure_transaction_topic,
            "the transactional id's partition",
        )

    return find_coordinator_response(header, request, find)


# ---------------------------------------------------------------------------------------------
# InitProducerId (transactional path)


async def init_transactional_producer(
    services: TransactionServices, context: RequestContext, request: Any
) -> Any:
    """InitProducerId for a non-null transactional id (the idempotent path is the InitProducerId
    handler's own)."""
    header = context.header
    expected = None
    producer_id = int(getattr(request, "producer_id", -1))
    producer_epoch = int(getattr(request, "producer_epoch", -1))
    if producer_id >= 0 or producer_epoch >= 0:
        if producer_id < 0 or producer_epoch < 0:
            # Kafka: both or neither (InitProducerIdRequest's validation)
            return build_response(
                header,
                {
                    "throttle_time": 0,
                    "error_code": ErrorCode.invalid_request,
                    "producer_id": -1,
                    "producer_epoch": -1,
                },
            )
        expected = (producer_id, producer_epoch)
    result = await services.transaction_coordinator.init_producer_id(
        request.transactional_id, _ms(request.transaction_timeout), expected
    )
    return build_response(
        header,
        {
            "throttle_time": 0,
            "error_code": _fenced(result.error, header.api_version, 4),
            "producer_id": result.producer_id,
            "producer_epoch": result.producer_epoch,
        },
    )


# ---------------------------------------------------------------------------------------------
# AddPartitionsToTxn, AddOffsetsToTxn, EndTxn


def _partition_results(
    topics: Iterable[tuple[str, Iterable[int]]], errors: dict[tuple[str, int], ErrorCode]
) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "results_by_partition": [
                {"partition_index": p, "partition_error_code": errors[(name, p)]} for p in ids
            ],
        }
        for name, ids in topics
    ]


async def _add_partitions_one(
    coordinator: TransactionCoordinator,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    topics: list[tuple[str, list[int]]],
    verify_only: bool,
    version: int,
) -> dict[tuple[str, int], ErrorCode]:
    partitions = [(name, p) for name, ids in topics for p in ids]
    if verify_only:
        return coordinator.verify_partitions(
            transactional_id, producer_id, producer_epoch, partitions
        )
    error = await coordinator.add_partitions(
        transactional_id, producer_id, producer_epoch, partitions
    )
    error = _fenced(error, version, 2)
    return dict.fromkeys(partitions, error)


def v3_topics(request: Any) -> list[tuple[str, list[int]]]:
    """The partitions of an AddPartitionsToTxn v0-v3 request (one transaction)."""
    return [(t.name, list(t.partitions)) for t in request.v3_and_below_topics]


def v3_response(
    header: Any, topics: list[tuple[str, list[int]]], errors: dict[tuple[str, int], ErrorCode]
) -> Any:
    return build_response(
        header,
        {"throttle_time": 0, "results_by_topic_v3_and_below": _partition_results(topics, errors)},
    )


async def handle_add_partitions_to_txn(
    services: TransactionServices, context: RequestContext, request: Any
) -> Any:
    header = context.header
    coordinator = services.transaction_coordinator
    if header.api_version < 4:
        topics = v3_topics(request)
        errors = await _add_partitions_one(
            coordinator,
            request.v3_and_below_transactional_id,
            int(request.v3_and_below_producer_id),
            int(request.v3_and_below_producer_epoch),
            topics,
            False,
            header.api_version,
        )
        return v3_response(header, topics, errors)
    results = []
    for txn in request.transactions:
        topics = [(t.name, list(t.partitions)) for t in txn.topics]
        errors = await _add_partitions_one(
            coordinator,
            txn.transactional_id,
            int(txn.producer_id),
            int(txn.producer_epoch),
            topics,
            bool(txn.verify_only),
            header.api_version,
        )
        results.append(
            {
                "transactional_id": txn.transactional_id,
                "topic_results": _partition_results(topics, errors),
            }
        )
    return build_response(
        header,
        {"throttle_time": 0, "error_code": ErrorCode.none, "results_by_transaction": results},
    )


async def handle_add_offsets_to_txn(
    services: TransactionServices, context: RequestContext, request: Any
) -> Any:
    header = context.header
    coordinator = services.transaction_coordinator
    offsets_partitions = services.metadata_cache
    count = _offsets_partition_count(offsets_partitions)
    if count is None:
        error = ErrorCode.coordinator_not_available
    else:
        error = await coordinator.add_partitions(
            request.transactional_id,
            int(request.producer_id),
            int(request.producer_epoch),
            [(OFFSETS_TOPIC, partition_for(request.group_id, count))],
        )
    return build_response(
        header, {"throttle_time": 0, "error_code": _fenced(error, header.api_version, 2)}
    )


def _offsets_partition_count(cache: Any) -> int | None:
    count = cache.partition_count(OFFSETS_TOPIC) if hasattr(cache, "partition_count") else None
    return int(count) if count else None


async def handle_end_txn(
    services: TransactionServices, context: RequestContext, request: Any
) -> Any:
    header = context.header
    error = await services.transaction_coordinator.end_transaction(
        request.transactional_id,
        int(request.producer_id),
        int(request.producer_epoch),
        bool(request.committed),
    )
    return build_response(
        header, {"throttle_time": 0, "error_code": _fenced(error, header.api_version, 2)}
    )


# ---------------------------------------------------------------------------------------------
# DescribeTransactions, ListTransactions


def handle_describe_transactions(
    services: TransactionServices, context: RequestContext, request: Any
) -> Any:
    coordinator = services.transaction_coordinator
    states = []
    for transactional_id in request.transactional_ids:
        error, metadata = coordinator.describe(transactional_id)
        entry: dict[str, Any] = {
            "error_code": error,
            "transactional_id": transactional_id,
            "transaction_state": "",
            "transaction_timeout": 0,
            "transaction_start_time": -1,
            "producer_id": -1,
            "producer_epoch": -1,
            "topics": [],
        }
        if metadata is not None:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in sorted(metadata.partitions):
                by_topic.setdefault(topic, []).append(partition)
            entry.update(
                transaction_state=metadata.state.kafka_name,
                transaction_timeout=metadata.txn_timeout_ms,
                transaction_start_time=metadata.txn_start_timestamp,
                producer_id=metadata.producer_id,
                producer_epoch=metadata.producer_epoch,
                topics=[{"topic": t, "partitions": ids} for t, ids in by_topic.items()],
            )
        states.append(entry)
    return build_response(context.header, {"throttle_time": 0, "transaction_states": states})


def handle_list_transactions(
    services: TransactionServices, context: RequestContext, request: Any
) -> Any:
    from odradek.coordinator.transaction.metadata import TransactionState

    coordinator = services.transaction_coordinator
    wanted = set(request.state_filters)
    unknown = sorted(s for s in wanted if TransactionState.from_name(s) is None)
    duration = int(getattr(request, "duration_filter", -1))
    error, listed = coordinator.list_transactions(
        {int(p) for p in request.producer_id_filters}, wanted, duration
    )
    return build_response(
        context.header,
        {
            "throttle_time": 0,
            "error_code": error,
            "unknown_state_filters": unknown,
            "transaction_states": [
                {
                    "transactional_id": m.transactional_id,
                    "producer_id": m.producer_id,
                    "transaction_state": m.state.kafka_name,
                }
                for m in sorted(listed, key=lambda m: m.transactional_id)
            ],
        },
    )
