"""FindCoordinator (10), as the group and transaction coordinators answer it.

A key's coordinator is the leader of the key's partition of the coordinator's internal topic
(`__consumer_offsets` for group ids, `__transaction_state` for transactional ids), and any broker
answers the question from its metadata cache. When the topic does not exist yet the broker starts
creating it and answers COORDINATOR_NOT_AVAILABLE, as it does while the partition has no leader:
clients retry. Versions 4 and later (KIP-699) ask for many keys at once and get one answer per key;
earlier versions ask for one key and get its answer at the top level of the response.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from odradek.protocol.build import build_response


class BrokerEndpoint(Protocol):
    @property
    def id(self) -> int: ...

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...


class PartitionLeader(Protocol):
    @property
    def leader(self) -> int: ...


class ClusterMetadata(Protocol):
    """What the coordinators' APIs read of the broker's metadata cache."""

    def alive_broker_ids(self) -> Iterable[int]: ...

    def get_broker(self, broker_id: int) -> BrokerEndpoint | None: ...

    def get_partition(self, topic: str, partition: int) -> PartitionLeader | None: ...

    def contains_topic(self, topic: str) -> bool: ...


def coordinator_unavailable(key: str) -> dict[str, Any]:
    """The answer for `key` before its coordinator is found: COORDINATOR_NOT_AVAILABLE, no node."""
    return {
        "key": key,
        "error_code": ErrorCode.coordinator_not_available,
        "error_message": None,
        "node_id": -1,
        "host": "",
        "port": -1,
    }


def locate_coordinator(
    cache: ClusterMetadata,
    key: str,
    topic: str,
    partition_of: Callable[[str], int],
    ensure_topic: Callable[[], None],
    partition_name: str,
) -> dict[str, Any]:
    """The answer for `key`: the leader of `topic`'s partition `partition_of(key)`.

    Without the topic, `ensure_topic()` starts creating it; `partition_name` names the partition
    in the message of an answer without a leader ("the group's offsets partition")."""
    found = coordinator_unavailable(key)
    if not cache.contains_topic(topic):
        ensure_topic()
        found["error_message"] = f"{topic} is being created"
        return found
    partition = cache.get_partition(topic, partition_of(key))
    leader = partition.leader if partition is not None else -1
    endpoint = cache.get_broker(leader) if leader >= 0 else None
    if endpoint is None:
        found["error_message"] = f"{partition_name} has no leader"
        return found
    found.update(
        error_code=ErrorCode.none, node_id=endpoint.id, host=endpoint.host, port=endpoint.port
    )
    return found


def find_coordinator_response(
    header: Any, request: Any, find: Callable[[str], dict[str, Any]]
) -> Any:
    """The response of the request's version, with `find(key)` for each key it asks about."""
    if header.api_version >= 4:
        coordinators = [find(key) for key in request.coordinator_keys]
        return build_response(header, {"throttle_time": 0, "coordinators": coordinators})
    return build_response(header, {"throttle_time": 0, **find(request.key)})
