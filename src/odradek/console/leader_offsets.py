"""The high watermarks of one page of partitions, asked of each partition's leader directly.

Why not confluent-kafka's `list_offsets`: librdkafka first asks for the Metadata of every
partition of the topics named, so a console's first page of a 10,000-partition topic waited
0.3-1.6 s on it (`bench/console.py`). The console's ZooKeeper snapshot already names each
partition's leader, so `LeaderOffsets.high_watermarks` sends one ListOffsets (latest,
read_uncommitted: the high watermark) per leader of the page's partitions, all at once. Only the
brokers' addresses come from a Metadata request, one that names no topic (its size does not grow
with the partitions): it gives the addresses of the listener the console's bootstrap servers are
on, which ZooKeeper's registrations (every listener of a broker) cannot single out.

Leaders move, and a snapshot may be a few seconds old. The steps of one call:

1. group the partitions by the leader the caller names (the snapshot's); a partition without one
   (-1: no leader, or a dead one) goes straight to step 3;
2. send each leader a ListOffsets of its partitions, in parallel;
3. the partitions answered NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION (a broker that does
   not, or not yet, host it), LEADER_NOT_AVAILABLE, REPLICA_NOT_AVAILABLE or a leader-epoch error,
   or whose leader could not be reached, get their leader read again from their state znodes
   (`CurrentLeaders`: the controller writes a new leader there before it tells any broker), the
   brokers' addresses asked again if a connection failed, and steps 1-2 once more;
4. what still fails is that partition's result: the error, whose text starts with Kafka's code
   name (or says which broker could not be reached). One partition's failure never hides another's
   offset. A leader that does not answer within `timeout_s` is not asked again in step 3 unless
   ZooKeeper names another one: a call waits at most twice `timeout_s`.

Concurrency: loop-thread only (the console's event loop). The connections are kept between calls
(an open topic page asks every 6 s) and replaced when they fail (`BrokerConnection`s are unusable
after a failure; `GroupAdminClient` reconnects to a broker whose connection closed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from odradek.admin.client import KafkaResponseError, parse_bootstrap
from odradek.admin.groups import LATEST, LIST_OFFSETS_VERSION, GroupAdminClient
from odradek.errors import OdradekError, OperatorError
from odradek.network.client import PLAINTEXT_CLIENT, ClientSecurity
from odradek.protocol.codec import ApiKey

TopicPartition = tuple[str, int]
TIMEOUT_S = 5.0
READ_UNCOMMITTED = 0

# Answers that mean "ask this partition's current leader" (Kafka's admin client retries the same
# ones after a metadata refresh).
MOVED = frozenset(
    {
        ErrorCode.not_leader_or_follower,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.leader_not_available,
        ErrorCode.replica_not_available,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.unknown_leader_epoch,
    }
)


class NoLeaderError(OperatorError):
    """The partition has no leader (none elected, or its leader is not registered)."""


class LeaderUnreachableError(OperatorError):
    """The leader's connection failed; the text says how."""


class LeaderTimedOutError(LeaderUnreachableError):
    """The leader did not answer within the timeout (asked again only if another broker leads
    by then: the same one would only make the page wait as long again)."""


class CurrentLeaders(Protocol):
    """Where a partition's leader is read again after a leader moved (the console's `ZkView`)."""

    async def leaders(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """Each partition's leader now (-1: none); a partition that could not be read is left
        out."""
        ...


def should_ask_again(result: int | OdradekError) -> bool:
    """Whether a partition's result asks for its leader to be read again and one more try."""
    if isinstance(result, KafkaResponseError):
        return result.code in MOVED
    return isinstance(result, NoLeaderError | LeaderUnreachableError)


def list_offsets_request(
    partitions: Sequence[TopicPartition],
    timestamp: int = LATEST,
    isolation_level: int = READ_UNCOMMITTED,
) -> dict[str, object]:
    """A ListOffsets request's values for `partitions`: by default their high watermarks
    (LATEST, read_uncommitted); EARLIEST for log starts, a time in ms for the first offset at or
    after it, read_committed's LATEST for the last stable offsets."""
    by_topic: dict[str, list[dict[str, int]]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(
            {"partition_index": partition, "current_leader_epoch": -1, "timestamp": timestamp}
        )
    return {
        "replica_id": -1,
        "isolation_level": isolation_level,
        "topics": [{"name": t, "partitions": p} for t, p in by_topic.items()],
    }


def read_answer(
    broker_id: int, partitions: Sequence[TopicPartition], answer: object
) -> dict[TopicPartition, int | OdradekError]:
    """Each asked partition's offset, or its error, out of one leader's ListOffsets response."""
    results: dict[TopicPartition, int | OdradekError] = {}
    for topic in getattr(answer, "topics", ()):
        for partition in topic.partitions:
            key = (topic.name, int(partition.partition_index))
            code = ErrorCode(partition.error_code)
            if code != ErrorCode.none:
                results[key] = KafkaResponseError(code, f"from broker {broker_id}")
            else:
                results[key] = int(partition.offset)
    for key in partitions:
        if key not in results:
            results[key] = KafkaResponseError(
                ErrorCode.unknown_server_error, f"broker {broker_id} did not answer for it"
            )
    return {key: results[key] for key in partitions}


class LeaderOffsets:
    """ListOffsets at the partitions' leaders (see the module docstring). Loop-thread only."""

    def __init__(
        self,
        bootstrap_servers: str,
        current_leaders: CurrentLeaders,
        security: ClientSecurity = PLAINTEXT_CLIENT,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self.servers = parse_bootstrap(bootstrap_servers)
        self.current_leaders = current_leaders
        self.security = security
        self.timeout_s = timeout_s
        self._client: GroupAdminClient | None = None
        # One client even when several pages ask at once (`GroupAdminClient` keeps one
        # connection per broker likewise).
        self._connecting = asyncio.Lock()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    async def high_watermarks(
        self, leaders: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int | OdradekError]:
        """Each partition's high watermark, or why it has none, asked of `leaders` (partition ->
        leader id, -1 for none); steps 1-4 of the module docstring."""
        return await self.offsets(leaders)

    async def offsets(
        self,
        leaders: Mapping[TopicPartition, int],
        timestamp: int = LATEST,
        isolation_level: int = READ_UNCOMMITTED,
    ) -> dict[TopicPartition, int | OdradekError]:
        """`high_watermarks` for any ListOffsets `timestamp` and isolation level (see
        `list_offsets_request`); -1 for a time after every record's."""
        request = {"timestamp": timestamp, "isolation_level": isolation_level}
        results = await self._ask(leaders, request)
        again = [key for key, result in results.items() if should_ask_again(result)]
        if not again:
            return results
        moved = await self.current_leaders.leaders(again)
        if any(isinstance(results[key], LeaderUnreachableError) for key in again):
            await self._forget_addresses()
        retry = {key: moved.get(key, leaders[key]) for key in again}
        retry = {
            key: leader
            for key, leader in retry.items()
            if not (isinstance(results[key], LeaderTimedOutError) and leader == leaders[key])
        }
        results.update(await self._ask(retry, request))
        return results

    async def _ask(
        self, leaders: Mapping[TopicPartition, int], request: Mapping[str, int]
    ) -> dict[TopicPartition, int | OdradekError]:
        results: dict[TopicPartition, int | OdradekError] = {}
        by_leader: dict[int, list[TopicPartition]] = {}
        for key, leader in leaders.items():
            if leader < 0:
                results[key] = NoLeaderError("no leader")
            else:
                by_leader.setdefault(leader, []).append(key)
        answers = await asyncio.gather(
            *(self._ask_leader(leader, keys, request) for leader, keys in sorted(by_leader.items()))
        )
        for answer in answers:
            results.update(answer)
        return {key: results[key] for key in leaders}  # in the caller's order

    async def _ask_leader(
        self, broker_id: int, partitions: Sequence[TopicPartition], request: Mapping[str, int]
    ) -> dict[TopicPartition, int | OdradekError]:
        try:
            answer = await self.to_broker(
                broker_id,
                ApiKey.LIST_OFFSETS,
                LIST_OFFSETS_VERSION,
                list_offsets_request(partitions, **request),
            )
        except LeaderUnreachableError as error:
            return {key: error for key in partitions}
        return read_answer(broker_id, partitions, answer)

    async def to_broker(self, broker_id: int, api_key: int, version: int, values: object) -> Any:
        """One request to one broker on the kept connections, answered within `timeout_s`, or
        `LeaderUnreachableError` (`LeaderTimedOutError` after the timeout) saying why not."""
        try:
            client = await self._connected()
            async with asyncio.timeout(self.timeout_s):
                return await client.to_broker(broker_id, api_key, version, values)
        except TimeoutError:
            # A request still queued on the connection would hold up the next page's: start over.
            hung = client.connections.pop(broker_id, None)
            if hung is not None:
                hung.close()
            raise LeaderTimedOutError(
                f"broker {broker_id}: no answer in {self.timeout_s:g} s"
            ) from None
        except OdradekError as e:  # NetworkError, OperatorError: a dead broker, a lost connection
            raise LeaderUnreachableError(f"broker {broker_id} unreachable: {e}") from None

    async def _connected(self) -> GroupAdminClient:
        """The kept client, or a new one when there is none or its bootstrap connection failed."""
        async with self._connecting:
            client = self._client
            if client is None or client.bootstrap.closed:
                if client is not None:
                    client.close()
                self._client = client = await GroupAdminClient.connect(
                    self.servers, self.timeout_s, self.security
                )
            return client

    async def leader_now(self, key: TopicPartition, failure: OdradekError) -> int:
        """Where to ask `key` again after `failure` (one `should_ask_again` accepts): its leader
        read again from ZooKeeper (-1: none or unreadable), after asking for the brokers'
        addresses again if the connection failed (step 3 for one partition)."""
        if isinstance(failure, LeaderUnreachableError):
            await self._forget_addresses()
        return (await self.current_leaders.leaders([key])).get(key, -1)

    async def _forget_addresses(self) -> None:
        """A leader could not be reached: ask for the brokers' addresses again (a broker may have
        come back elsewhere; a new one is not in the old list), with a new client when the old
        one's bootstrap broker is the one gone."""
        try:
            await (await self._connected()).brokers(refresh=True)
        except OdradekError:
            self.close()
