"""What Produce and Fetch do about client quotas (Kafka's `KafkaApis.handleProduceRequest` and
`handleFetchRequest`, quota parts), as small functions the handlers call.

Produce: the request's size is recorded against the client's produce rate and its handler time
against its request rate (not for acks=0, which Kafka exempts from request quotas); the larger
throttle time goes into the response's `throttle_time_ms` and mutes the connection for that long.

Fetch (consumers only; followers are never client-throttled): before reading, the fetch is capped
to the most the client may take in one window (`max_value_in_window`: bound x 10 s), so that a
large fetch is not throttled for sure; after reading, the response's record bytes are recorded
against its fetch rate and the handler time against its request rate. If either is over its
bound, the response goes out *without records* (the fetched bytes are taken back from the rate),
carrying the throttle time, and the connection is muted: the consumer fetches the same offsets
again after the throttle.

Every other client API (not the inter-broker ones) runs under the request quota alone
(`throttle_request`): its handler time is recorded, and the response's throttle time set.

Follower fetches instead feed the leader replication throttle (KIP-73): the bytes sent for
throttled replicas are recorded (`record_leader_replication`).

Nothing here runs when `ClientQuotas.enabled` is False (or the throttle has no rate).
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from odradek.server.quota.manager import ClientQuotas, request_time_percent

if TYPE_CHECKING:
    from odradek.cluster.replication_quota import ReplicationQuotaManager
    from odradek.network.request_context import RequestContext


def _who(context: RequestContext) -> tuple[str, str]:
    return context.principal, context.header.client_id or ""


def _throttle(context: RequestContext, throttle_ms: int) -> int:
    if throttle_ms > 0 and context.throttle is not None:
        context.throttle(throttle_ms)
    return throttle_ms


def produce_throttle_ms(
    quotas: ClientQuotas, context: RequestContext, acks: int, handler_ns: int
) -> int:
    """Record a produce request; the throttle time for its response (0: none). Mutes the
    connection when it is positive."""
    if not quotas.enabled:
        return 0
    principal, client_id = _who(context)
    bandwidth = quotas.produce.record_and_get_throttle_ms(principal, client_id, context.size)
    request = 0
    if acks != 0:
        request = quotas.request.record_and_get_throttle_ms(
            principal, client_id, request_time_percent(handler_ns)
        )
    return _throttle(context, max(bandwidth, request))


def fetch_max_bytes(quotas: ClientQuotas, context: RequestContext, max_bytes: int) -> int:
    """A consumer fetch's max bytes, capped to what its fetch quota allows in one window."""
    if not quotas.fetch.enabled:
        return max_bytes
    principal, client_id = _who(context)
    most = quotas.fetch.max_value_in_window(principal, client_id)
    return max_bytes if most is None else max(0, min(max_bytes, int(most)))


def fetch_throttle_ms(
    quotas: ClientQuotas, context: RequestContext, response_bytes: int, handler_ns: int
) -> int:
    """Record a consumer fetch's response; the throttle time (0: send the records). When it is
    positive the bytes are taken back (the response goes out empty) and the connection is muted."""
    if not quotas.enabled:
        return 0
    principal, client_id = _who(context)
    request = quotas.request.record_and_get_throttle_ms(
        principal, client_id, request_time_percent(handler_ns)
    )
    bandwidth = quotas.fetch.record_and_get_throttle_ms(principal, client_id, response_bytes)
    throttle = max(bandwidth, request)
    if throttle > 0:
        quotas.fetch.unrecord(principal, client_id, response_bytes)
    return _throttle(context, throttle)


def record_leader_replication(
    leader: ReplicationQuotaManager, results: Mapping[tuple[str, int], Any]
) -> None:
    """Record the bytes a follower fetch's response carries for throttled replicas."""
    if not leader.enabled:
        return
    size = sum(
        len(result.read.records)
        for (topic, partition), result in results.items()
        if result.read is not None and leader.is_throttled(topic, partition)
    )
    if size:
        leader.record(size)


# Answered without request quotas, as Kafka's `sendResponseExemptThrottle`: the inter-broker
# requests, and Produce and Fetch, which record their request time themselves (above).
EXEMPT_APIS = frozenset({0, 1, 4, 5, 6, 7, 27})


def request_quota_applies(quotas: ClientQuotas, api_key: int) -> bool:
    """The quick check before `throttle_request`: request quotas exist and the API is subject."""
    return quotas.request.enabled and api_key not in EXEMPT_APIS


def throttle_request(
    quotas: ClientQuotas,
    context: RequestContext,
    handle: Callable[[], Any],
) -> Any:
    """Run a handler under the client's request quota (Kafka's `sendResponseMaybeThrottle`):
    its synchronous time is recorded as a percentage of a thread; when that is over the
    `request_percentage` bound, the response's `throttle_time_ms` says for how long (at most one
    window) and the connection is muted that long."""
    started = time.perf_counter_ns()
    result = handle()
    handler_ns = time.perf_counter_ns() - started
    principal, client_id = _who(context)
    throttle_ms = quotas.request.record_and_get_throttle_ms(
        principal, client_id, request_time_percent(handler_ns)
    )
    if throttle_ms <= 0:
        return result
    _throttle(context, throttle_ms)
    if inspect.isawaitable(result):

        async def throttled() -> Any:
            return _with_throttle_time(await result, throttle_ms)

        return throttled()
    return _with_throttle_time(result, throttle_ms)


def _with_throttle_time(response: Any, throttle_ms: int) -> Any:
    """The response with its throttle time field set (when its version has one)."""
    if dataclasses.is_dataclass(response) and not isinstance(response, type):
        names = {f.name for f in dataclasses.fields(response)}
        if "throttle_time" in names:
            return dataclasses.replace(
                response, throttle_time=datetime.timedelta(milliseconds=throttle_ms)
            )
    return response
