"""Produce (api key 0).

Record batches stay opaque here: the handler hands each partition's bytes to the replica manager,
which validates them (`odradek.log.validator`: header, CRC and every record), stamps offsets and
the leader epoch, and appends them as they are. Each partition is answered on its own: a refused
batch fails its partition only, with the error's message and, for INVALID_TIMESTAMP, the
offending records in `record_errors` (v8+), as Kafka fills them.

As in Kafka, a request carrying a transactional batch without a transactional id is refused whole
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED for every partition), and so is a transactional request
whose principal may not WRITE its transactional id.

acks=0 gets no response; acks=1 is answered after the local append; acks=-1 (all) after the high
watermark passes the appended batches, or REQUEST_TIMED_OUT after the request's timeout.

Internal topics (`__consumer_offsets`, `__transaction_state`) take records only from the broker's own coordinator, as in
Kafka: a client's produce to one is INVALID_TOPIC_EXCEPTION (Kafka lets its admin client id
`__admin_client` through, and so does this).

Authorization (`odradek.security.api_acls`): WRITE on each topic (TOPIC_AUTHORIZATION_FAILED for the
partitions of a refused topic, which is neither written nor auto-created), and WRITE on the
transactional id of a transactional request (TRANSACTIONAL_ID_AUTHORIZATION_FAILED for all).

Client quotas (`odradek.server.quota.throttling`): once the records are appended, the request's
size and handler time are recorded against the client's produce and request quotas; the response
carries the throttle time and the connection is muted for it (acks=0: muted only).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.coordinator.group.placement import OFFSETS_TOPIC
from odradek.coordinator.transaction.log_records import TRANSACTION_STATE_TOPIC
from odradek.errors import KafkaError
from odradek.network.server import NO_RESPONSE
from odradek.protocol.build import build_response
from odradek.protocol.record_batch import iter_batches
from odradek.server.authorization import (
    TOPIC,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID,
    WRITE,
)
from odradek.server.quota.throttling import produce_throttle_ms

if TYPE_CHECKING:
    from odradek.cluster.replica_manager import ProduceResult
    from odradek.network.request_context import RequestContext
    from odradek.server.services import BrokerServices


ADMIN_CLIENT_ID = "__admin_client"
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})


def _partition_response(index: int, result: ProduceResult) -> dict[str, Any]:
    error = result.error
    return {
        "index": index,
        "error_code": error.code if error is not None else ErrorCode.none,
        "error_message": str(error) if error is not None else None,
        "base_offset": result.base_offset,
        "log_append_time": None,
        "log_start_offset": result.log_start_offset,
        "record_errors": [
            {"batch_index": batch_index, "batch_index_error_message": message}
            for batch_index, message in (error.record_errors if error is not None else ())
        ],
    }


def _has_transactional_batch(records: bytes | None) -> bool:
    """Whether the first batch of `records` is transactional (what Kafka looks at)."""
    if records is None:
        return False
    try:
        first = next(iter_batches(records), None)
    except KafkaError:
        return False
    return first is not None and first.is_transactional


def handle_produce(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    started_ns = time.perf_counter_ns()
    header = context.header
    acks = int(request.acks)
    timeout_ms = int(request.timeout.total_seconds() * 1000)
    order: list[tuple[str, list[int]]] = []
    entries: dict[tuple[str, int], bytes] = {}
    immediate: dict[tuple[str, int], KafkaError] = {}
    transactional_id = request.transactional_id
    if transactional_id is None:
        refuse_transactional = any(
            _has_transactional_batch(p.records)
            for t in request.topic_data
            for p in t.partition_data
        )
        refusal = "a transactional batch needs a transactional id"
    else:
        refuse_transactional = not broker.authorizer.allowed(
            context, WRITE, TRANSACTIONAL_ID, transactional_id
        )
        refusal = "Transactional Id authorization failed."
    for topic_data in request.topic_data:
        name = topic_data.name
        authorized = broker.authorizer.allowed(context, WRITE, TOPIC, name)
        indexes = []
        for partition_data in topic_data.partition_data:
            key = (name, partition_data.index)
            indexes.append(partition_data.index)
            if acks not in (0, 1, -1):
                immediate[key] = KafkaError(
                    f"acks must be 0, 1 or -1, not {acks}", ErrorCode.invalid_required_acks
                )
            elif refuse_transactional:
                immediate[key] = KafkaError(
                    refusal, ErrorCode.transactional_id_authorization_failed
                )
            elif not authorized:
                immediate[key] = KafkaError("Authorization failed.", TOPIC_AUTHORIZATION_FAILED)
            elif partition_data.records is None:
                immediate[key] = KafkaError("the records are null", ErrorCode.corrupt_message)
            elif name in INTERNAL_TOPICS and header.client_id != ADMIN_CLIENT_ID:
                immediate[key] = KafkaError(
                    f"cannot append to internal topic {name}", ErrorCode.invalid_topic_exception
                )
            else:
                entries[key] = partition_data.records
        order.append((name, indexes))
        if authorized and not broker.metadata_cache.contains_topic(name):
            broker.maybe_auto_create_topic(name)

    result = broker.replica_manager.append_records(entries, acks, timeout_ms)
    handler_ns = time.perf_counter_ns() - started_ns
    if acks == 0:
        produce_throttle_ms(broker.quotas.client, context, acks, handler_ns)
        return NO_RESPONSE

    def answer(results: dict[tuple[str, int], ProduceResult]) -> Any:
        from odradek.cluster.replica_manager import ProduceResult

        topics = []
        for name, indexes in order:
            partitions = []
            for index in indexes:
                key = (name, index)
                if key in immediate:
                    partitions.append(
                        _partition_response(index, ProduceResult(error=immediate[key]))
                    )
                else:
                    partitions.append(_partition_response(index, results[key]))
            topics.append({"name": name, "partition_responses": partitions})
        throttle_ms = produce_throttle_ms(broker.quotas.client, context, acks, handler_ns)
        return build_response(header, {"responses": topics, "throttle_time": throttle_ms})

    if isinstance(result, dict):
        return answer(result)

    async def wait_and_build() -> Any:
        return answer(await result)

    return wait_and_build()
