"""ElectLeaders (43), versions 0-2: leader elections an admin client asks for (KIP-183, KIP-460).

Only the active controller elects (`KafkaController.elect_leaders`, see
`odradek.controller.elect_leaders`); on any other broker every partition is answered
NOT_CONTROLLER, as in Kafka's ZooKeeper mode, and clients send the request to the controller named
in Metadata. v0 has no election type and means PREFERRED; v1+ carry PREFERRED (0) or UNCLEAN (1),
anything else is INVALID_REQUEST. `topic_partitions` null means every partition this broker's
metadata knows; the answer then leaves out the partitions whose election was not needed, as Kafka's
does, so that "elect all" lists only what moved or failed.

The answer first waits for the controller's outcome of every partition (even with timeout 0, as in
Kafka: the elections are always made), then, until the request's timeout, for this broker's metadata
to show each elected leader (the controller sends itself UpdateMetadata like every broker), so a
client that reads Metadata right after the answer sees the new leaders. An elected partition whose
metadata has not arrived by the timeout is REQUEST_TIMED_OUT.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.controller.elect_leaders import ElectionOutcome, ElectionType
from odradek.errors import InvalidRequestError, KafkaError, RequestTimedOutError
from odradek.protocol.build import build_response
from odradek.server.authorization import ALTER, CLUSTER_AUTHORIZATION_FAILED

if TYPE_CHECKING:
    from odradek.network.request_context import RequestContext
    from odradek.server.metadata_cache import MetadataCache
    from odradek.server.services import BrokerServices

TopicPartition = tuple[str, int]

CONTROLLER_ANSWER_GRACE_S = 30.0


def requested_partitions(request: Any, cache: MetadataCache) -> tuple[list[TopicPartition], bool]:
    """The partitions a request names (duplicates dropped), and whether it asked for all."""
    if request.topic_partitions is None:
        every = [(topic, p) for topic, parts in cache.topics.items() for p in parts]
        return sorted(every), True
    named = {(str(t.topic), int(p)) for t in request.topic_partitions for p in t.partitions}
    return sorted(named), False


def results_by_topic(
    outcomes: Mapping[TopicPartition, ElectionOutcome], all_partitions: bool
) -> list[dict[str, Any]]:
    """The response's `replica_election_results`: topics sorted, partitions sorted, each with
    error NONE (elected) or its error. With `all_partitions`, ELECTION_NOT_NEEDED is left out."""
    by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for (topic, partition), outcome in sorted(outcomes.items()):
        if isinstance(outcome, KafkaError):
            if all_partitions and outcome.code == ErrorCode.election_not_needed:
                continue
            code, message = outcome.code, str(outcome) or None
        else:
            code, message = ErrorCode.none, None
        by_topic[topic].append(
            {"partition_id": partition, "error_code": code, "error_message": message}
        )
    return [
        {"topic": topic, "partition_result": partitions} for topic, partitions in by_topic.items()
    ]


def _all(partitions: Iterable[TopicPartition], error: KafkaError) -> dict[TopicPartition, Any]:
    return {tp: error for tp in partitions}


def handle_elect_leaders(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    if not broker.authorizer.cluster(context, ALTER):
        return build_response(
            header,
            {
                "error_code": CLUSTER_AUTHORIZATION_FAILED,
                "replica_election_results": results_by_topic(
                    _all(
                        requested_partitions(request, broker.metadata_cache)[0],
                        KafkaError("Authorization failed.", CLUSTER_AUTHORIZATION_FAILED),
                    ),
                    False,
                ),
            },
        )
    election_type = int(getattr(request, "election_type", ElectionType.PREFERRED))
    timeout = max(0.0, request.timeout.total_seconds())

    async def elect() -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        partitions, all_partitions = requested_partitions(request, broker.metadata_cache)
        top_level = ErrorCode.none
        outcomes: dict[TopicPartition, ElectionOutcome]
        if election_type not in (ElectionType.PREFERRED, ElectionType.UNCLEAN):
            error = InvalidRequestError(f"unknown election type {election_type}")
            top_level = error.code
            outcomes = _all(partitions, error)
        else:
            # The timeout bounds the wait for metadata, not the controller's answer (as in
            # Kafka, where timeout 0 still elects and answers): the grace period only guards
            # against a controller that never answers. Shielded, so that a request that gives
            # up does not cancel elections already queued.
            answer = broker.controller.elect_leaders(partitions, ElectionType(election_type))
            try:
                async with asyncio.timeout(timeout + CONTROLLER_ANSWER_GRACE_S):
                    outcomes = await asyncio.shield(answer)
            except TimeoutError:
                outcomes = _all(partitions, RequestTimedOutError("the controller did not answer"))
            except KafkaError as e:  # NOT_CONTROLLER, or the controller moved meanwhile
                outcomes = _all(partitions, e)
        elected = {tp: o for tp, o in outcomes.items() if not isinstance(o, KafkaError)}
        if elected:
            cache = broker.metadata_cache

            def leads(tp: TopicPartition) -> bool:
                state = cache.get_partition(*tp)
                return state is not None and state.leader == elected[tp]

            await broker.wait_for_metadata(
                lambda: all(leads(tp) for tp in elected), max(0.0, deadline - loop.time())
            )
            for tp in elected:
                if not leads(tp):
                    outcomes[tp] = RequestTimedOutError(
                        "the new leader did not reach this broker's metadata in time"
                    )
        return build_response(
            header,
            {
                "throttle_time": 0,
                "error_code": top_level,
                "replica_election_results": results_by_topic(outcomes, all_partitions),
            },
        )

    return elect()
