"""How the controller's decisions reach the brokers (Kafka's ControllerChannelManager and
ControllerBrokerRequestBatch).

`ControllerChannelManager` keeps one sender task per live broker, each with its own FIFO queue and
connection. A sender writes the requests queued so far (up to PIPELINED_REQUESTS) back to back and
then waits for their responses; a broker applies a connection's controller requests one after
another in the order they came (`server/handlers_interbroker`), so it sees them in the order they
were decided. On a connection failure the sender reconnects and resends, in order, the requests not
answered yet, for as long as the broker is live. When the controller learns a broker died,
`remove_broker` cancels its sender and drops whatever was queued: the broker will get full state with
UpdateMetadata and LeaderAndIsr when it returns.

`ControllerBrokerRequestBatch` collects, while one controller event is handled, everything each broker
must hear — LeaderAndIsr partition states, UpdateMetadata partitions, StopReplica partitions — and
`send_requests_to_brokers` turns them into at most one request of each kind per broker, sent in the
order LeaderAndIsr, UpdateMetadata, StopReplica, carrying the controller epoch (brokers refuse older).

Concurrency: both classes belong to the controller's event task; sender tasks only touch their own
queue and connection, and report responses through a callback that enqueues a controller event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from odradek.controller.context import ControllerContext, LeaderAndIsr, TopicPartition
from odradek.errors import NetworkError
from odradek.network.client import PLAINTEXT_CLIENT, BrokerConnection, ClientSecurity
from odradek.protocol.build import build
from odradek.protocol.codec import ApiKey, EncodedRequest
from odradek.protocol.controller_requests import (
    LeaderAndIsrPartition,
    UpdateMetadataPartition,
    encode_leader_and_isr_v5,
    encode_update_metadata_v7,
)
from odradek.protocol.messages import (
    LeaderAndIsrRequestV5,
    StopReplicaRequestV3,
    UpdateMetadataRequestV7,
)
from odradek.protocol.messages.leader_and_isr.v5.request import LeaderAndIsrTopicState
from odradek.protocol.messages.update_metadata.v7.request import UpdateMetadataTopicState
from odradek.protocol.topic_ids import topic_id_to_uuid
from odradek.zk.znodes import BrokerInfo

log = logging.getLogger(__name__)

LEADER_AND_ISR_VERSION = 5
UPDATE_METADATA_VERSION = 7
STOP_REPLICA_VERSION = 3
LEADER_DURING_DELETE = -2
RECONNECT_BACKOFF = 0.1
# Requests a sender writes before waiting for their answers: an event's LeaderAndIsr and
# UpdateMetadata go together, so the broker applies the second as soon as it has applied the first
# (waiting for the first's answer cost 0.6-1.2 s at 10,000 partitions on a busy broker).
PIPELINED_REQUESTS = 4
# Kafka's security protocol ids, as UpdateMetadata carries them.
SECURITY_PROTOCOL_IDS = {"PLAINTEXT": 0, "SSL": 1, "SASL_PLAINTEXT": 2, "SASL_SSL": 3}

ResponseCallback = Callable[[int, int, Any], None]  # (broker id, api key, response)


@dataclass
class _QueueItem:
    api_key: int
    version: int
    request: Any
    callback: ResponseCallback | None


class _BrokerSender:
    """Sends one broker's queued requests in order; retries across reconnects while it lives."""

    def __init__(
        self,
        broker: BrokerInfo,
        controller_id: int,
        timeout: float,
        listener: str,
        security: ClientSecurity,
    ) -> None:
        self.broker = broker
        self.queue: asyncio.Queue[_QueueItem] = asyncio.Queue()
        self._controller_id = controller_id
        self._timeout = timeout
        self._listener = listener
        self._security = security
        self._connection: BrokerConnection | None = None
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"controller-sender-{broker.id}"
        )

    def _address(self) -> tuple[str, int]:
        """The broker's control-plane (or inter-broker) listener."""
        endpoint = self.broker.endpoint(self._listener)
        if endpoint is None:
            raise NetworkError(
                f"broker {self.broker.id} registered no {self._listener} listener "
                f"({', '.join(e.listener_name for e in self.broker.endpoints)})"
            )
        return endpoint.host, endpoint.port

    async def _run(self) -> None:
        try:
            while True:
                items = [await self.queue.get()]
                while len(items) < PIPELINED_REQUESTS and not self.queue.empty():
                    items.append(self.queue.get_nowait())
                responses = await self._send_until_answered(items)
                for item, response in zip(items, responses, strict=True):
                    if item.callback is None:
                        continue
                    try:
                        item.callback(self.broker.id, item.api_key, response)
                    except Exception:
                        log.exception("controller response callback failed")
        finally:
            if self._connection is not None:
                self._connection.close()

    async def _send_until_answered(self, items: list[_QueueItem]) -> list[Any]:
        """Each item's response, in order. The items are written back to back (the broker
        applies a connection's controller requests in the order they came); after a connection
        failure, those not answered yet are sent again, in order."""
        answered: list[Any] = []
        while True:
            try:
                if self._connection is None or self._connection.closed:
                    host, port = self._address()
                    self._connection = await BrokerConnection.connect(
                        host,
                        port,
                        timeout=self._timeout,
                        client_id=f"controller-{self._controller_id}",
                        security=self._security,
                    )
                connection = self._connection
                futures = []
                for item in items[len(answered) :]:
                    future = connection.send_nowait(item.api_key, item.version, item.request)
                    # a failed connection fails every future; those not awaited then are resent
                    future.add_done_callback(_retrieve)
                    futures.append(future)
                for future in futures:
                    try:
                        async with asyncio.timeout(self._timeout):
                            answered.append(await future)
                    except TimeoutError:
                        raise NetworkError(
                            f"controller request to broker {self.broker.id} timed out"
                        ) from None
                return answered
            except NetworkError as e:
                log.info("controller request to broker %d failed (%s); retrying", self.broker.id, e)
                if self._connection is not None:
                    self._connection.close()
                    self._connection = None
                await asyncio.sleep(RECONNECT_BACKOFF)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a response future's error as seen (asyncio would log it as never retrieved)."""
    if not future.cancelled():
        future.exception()


# UpdateMetadata v7's body starts with controller id (int32), controller epoch (int32) and the
# recipient's broker epoch (int64), the one field that differs between recipients.
_BROKER_EPOCH = struct.Struct(">q")
_BROKER_EPOCH_AT = 8


def with_broker_epoch(body: bytes, broker_epoch: int) -> bytes:
    """An encoded UpdateMetadata v7 body with its broker epoch set to `broker_epoch`."""
    end = _BROKER_EPOCH_AT + _BROKER_EPOCH.size
    return body[:_BROKER_EPOCH_AT] + _BROKER_EPOCH.pack(broker_epoch) + body[end:]


class ControllerChannelManager:
    """One sender per live broker. Controller event task only."""

    def __init__(
        self,
        controller_id: int,
        request_timeout: float,
        listener: str = "PLAINTEXT",
        security: ClientSecurity = PLAINTEXT_CLIENT,
    ) -> None:
        self.controller_id = controller_id
        self.request_timeout = request_timeout
        self.listener = listener
        self.security = security
        self._senders: dict[int, _BrokerSender] = {}

    def add_broker(self, broker: BrokerInfo) -> None:
        existing = self._senders.get(broker.id)
        if existing is not None and existing.broker == broker:
            return
        if existing is not None:
            existing.task.cancel()
        self._senders[broker.id] = _BrokerSender(
            broker, self.controller_id, self.request_timeout, self.listener, self.security
        )

    def remove_broker(self, broker_id: int) -> None:
        sender = self._senders.pop(broker_id, None)
        if sender is not None:
            sender.task.cancel()

    def send(
        self,
        broker_id: int,
        api_key: int,
        version: int,
        request: Any,
        callback: ResponseCallback | None,
    ) -> None:
        sender = self._senders.get(broker_id)
        if sender is None:
            log.debug("dropping request api=%d to broker %d: not live", api_key, broker_id)
            return
        sender.queue.put_nowait(_QueueItem(api_key, version, request, callback))

    @property
    def queued(self) -> int:
        return sum(sender.queue.qsize() for sender in self._senders.values())

    async def shutdown(self) -> None:
        senders = list(self._senders.values())
        self._senders.clear()
        for sender in senders:
            sender.task.cancel()
        for sender in senders:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender.task


@dataclass(frozen=True, slots=True)
class StopReplicaAnswer:
    """A StopReplica response with the partitions its request asked to delete: topic deletion
    must only count a replica deleted when the broker answered a request that deleted it."""

    response: Any
    deleted_partitions: frozenset[TopicPartition]

    @property
    def error_code(self) -> int:
        return int(self.response.error_code)


@dataclass(slots=True)
class _LeaderAndIsrEntry:
    leader_and_isr: LeaderAndIsr
    replicas: tuple[int, ...]
    is_new: bool


@dataclass
class ControllerBrokerRequestBatch:
    """Requests collected while handling one controller event. Controller event task only."""

    context: ControllerContext
    channel: ControllerChannelManager
    controller_id: int
    on_response: ResponseCallback
    inter_broker_listener: str = "PLAINTEXT"
    leader_and_isr: dict[int, dict[TopicPartition, _LeaderAndIsrEntry]] = field(
        default_factory=dict
    )
    update_metadata_brokers: set[int] = field(default_factory=set)
    update_metadata_partitions: dict[TopicPartition, None] = field(default_factory=dict)
    update_metadata_all_partitions: bool = False
    stop_replica: dict[int, dict[TopicPartition, bool]] = field(default_factory=dict)
    # Leader/ISR states this controller wrote since the batch was last sent. No broker has heard
    # of their znode versions yet, so nobody else can have changed them in ZooKeeper since (a
    # leader's ISR write is conditional on the version it was told; a newer controller's writes
    # would fence ours): the state machines may decide from these instead of reading them again.
    unsent_writes: dict[TopicPartition, LeaderAndIsr] = field(default_factory=dict)

    def new_batch(self) -> None:
        self.unsent_writes.clear()
        self.leader_and_isr.clear()
        self.update_metadata_brokers.clear()
        self.update_metadata_partitions.clear()
        self.update_metadata_all_partitions = False
        self.stop_replica.clear()

    def add_leader_and_isr_request_for_brokers(
        self,
        broker_ids: Iterable[int],
        tp: TopicPartition,
        leader_and_isr: LeaderAndIsr,
        replicas: Iterable[int],
        is_new: bool,
    ) -> None:
        replicas = tuple(replicas)
        for broker_id in broker_ids:
            if broker_id < 0:
                continue
            entries = self.leader_and_isr.setdefault(broker_id, {})
            previous = entries.get(tp)
            entries[tp] = _LeaderAndIsrEntry(
                leader_and_isr, replicas, is_new or (previous is not None and previous.is_new)
            )
        # Every live broker hears of the change (inlined: this runs once per replica).
        self.update_metadata_brokers.update(self.context.live_brokers)
        self.update_metadata_partitions[tp] = None

    def add_update_metadata_request_for_brokers(
        self, broker_ids: Iterable[int], partitions: Iterable[TopicPartition] | None = None
    ) -> None:
        """UpdateMetadata to `broker_ids` for `partitions` (None: every partition)."""
        self.update_metadata_brokers.update(b for b in broker_ids if b >= 0)
        if partitions is None:
            self.update_metadata_all_partitions = True
        else:
            for tp in partitions:
                self.update_metadata_partitions[tp] = None

    def add_stop_replica_request_for_brokers(
        self, broker_ids: Iterable[int], tp: TopicPartition, delete: bool
    ) -> None:
        for broker_id in broker_ids:
            entries = self.stop_replica.setdefault(broker_id, {})
            entries[tp] = entries.get(tp, False) or delete

    def send_requests_to_brokers(self, controller_epoch: int) -> None:
        self._send_leader_and_isr(controller_epoch)
        self._send_update_metadata(controller_epoch)
        self._send_stop_replica(controller_epoch)
        self.new_batch()

    # request building

    def _topic_id(self, topic: str) -> uuid.UUID | None:
        topic_id = self.context.topic_ids.get(topic)
        return topic_id_to_uuid(topic_id)

    def _send_leader_and_isr(self, controller_epoch: int) -> None:
        context = self.context
        for broker_id, entries in self.leader_and_isr.items():
            if broker_id not in context.live_brokers:
                continue
            topics: dict[str, list[dict[str, Any]]] = {}
            leaders: set[int] = set()
            for (topic, partition), entry in entries.items():
                state = entry.leader_and_isr
                leaders.add(state.leader)
                moving = context.reassignments.get((topic, partition))
                # Named tuples, not `build` or kio's classes: this runs once per partition and
                # broker, 100,000s of times in a failover.
                topics.setdefault(topic, []).append(
                    LeaderAndIsrPartition(
                        partition,
                        state.controller_epoch,
                        state.leader,
                        state.leader_epoch,
                        tuple(state.isr),
                        state.zk_version,
                        entry.replicas,
                        moving.adding_replicas if moving else (),
                        moving.removing_replicas if moving else (),
                        entry.is_new,
                    )
                )
            live_leaders = []
            for leader in sorted(leaders):
                info = context.live_brokers.get(leader)
                endpoint = info.endpoint(self.inter_broker_listener) if info else None
                if endpoint is not None:
                    live_leaders.append(
                        {"broker_id": leader, "host_name": endpoint.host, "port": endpoint.port}
                    )
            request = build(
                LeaderAndIsrRequestV5,
                {
                    "controller_id": self.controller_id,
                    "controller_epoch": controller_epoch,
                    "broker_epoch": context.broker_epoch(broker_id),
                    "type": 0,
                    "topic_states": [
                        LeaderAndIsrTopicState(
                            topic_name=topic,
                            topic_id=self._topic_id(topic),
                            partition_states=tuple(states),  # type: ignore[arg-type]
                        )
                        for topic, states in topics.items()
                    ],
                    "live_leaders": live_leaders,
                },
            )
            self.channel.send(
                broker_id,
                ApiKey.LEADER_AND_ISR,
                LEADER_AND_ISR_VERSION,
                EncodedRequest(request, encode_leader_and_isr_v5(request)),
                self.on_response,
            )

    def _send_update_metadata(self, controller_epoch: int) -> None:
        if not self.update_metadata_brokers:
            return
        context = self.context
        if self.update_metadata_all_partitions:
            partitions: Iterable[TopicPartition] = context.all_partitions()
        else:
            partitions = list(self.update_metadata_partitions)
        live = context.live_broker_ids
        offline_dirs = bool(context.replicas_on_offline_dirs)
        topics: dict[str, list[dict[str, Any]]] = {}
        for tp in partitions:
            state = context.leadership.get(tp)
            if state is None:
                continue
            replicas = context.partition_replica_assignment(tp)
            leader = (
                LEADER_DURING_DELETE
                if context.is_topic_queued_for_deletion(tp[0])
                else state.leader
            )
            topics.setdefault(tp[0], []).append(
                UpdateMetadataPartition(
                    tp[1],
                    state.controller_epoch,
                    leader,
                    state.leader_epoch,
                    tuple(state.isr),
                    state.zk_version,
                    tuple(replicas),
                    tuple(
                        r
                        for r in replicas
                        if r not in live
                        or (offline_dirs and context.is_replica_on_offline_dir(r, tp))
                    ),
                )
            )
        # Built once for every recipient (only the broker epoch differs): with 100,000 partitions,
        # building them per broker was most of a failover's UpdateMetadata cost.
        topic_states = tuple(
            UpdateMetadataTopicState(
                topic_name=topic,
                topic_id=self._topic_id(topic),
                partition_states=tuple(states),  # type: ignore[arg-type]
            )
            for topic, states in topics.items()
        )
        live_brokers = [
            {
                "id": info.id,
                "endpoints": [
                    {
                        "port": endpoint.port,
                        "host": endpoint.host,
                        "listener": endpoint.listener_name,
                        "security_protocol": SECURITY_PROTOCOL_IDS.get(
                            endpoint.security_protocol, 0
                        ),
                    }
                    for endpoint in info.endpoints
                ],
                "rack": info.rack,
            }
            for info in sorted(context.live_brokers.values(), key=lambda b: b.id)
        ]
        shared: bytes | None = None  # the body encoded once (10K partitions: 0.07 s a copy)
        for broker_id in sorted(self.update_metadata_brokers):
            if broker_id not in context.live_brokers:
                continue
            broker_epoch = context.broker_epoch(broker_id)
            request = build(
                UpdateMetadataRequestV7,
                {
                    "controller_id": self.controller_id,
                    "controller_epoch": controller_epoch,
                    "broker_epoch": broker_epoch,
                    "topic_states": topic_states,
                    "live_brokers": live_brokers,
                },
            )
            if shared is None:
                shared = encode_update_metadata_v7(request)
            self.channel.send(
                broker_id,
                ApiKey.UPDATE_METADATA,
                UPDATE_METADATA_VERSION,
                EncodedRequest(request, with_broker_epoch(shared, broker_epoch)),
                self.on_response,
            )

    def _send_stop_replica(self, controller_epoch: int) -> None:
        context = self.context
        for broker_id, entries in self.stop_replica.items():
            if broker_id not in context.live_brokers:
                continue
            topics: dict[str, list[dict[str, Any]]] = {}
            for (topic, partition), delete in entries.items():
                state = context.leadership.get((topic, partition))
                topics.setdefault(topic, []).append(
                    {
                        "partition_index": partition,
                        "leader_epoch": state.leader_epoch if state is not None else -1,
                        "delete_partition": delete,
                    }
                )
            request = build(
                StopReplicaRequestV3,
                {
                    "controller_id": self.controller_id,
                    "controller_epoch": controller_epoch,
                    "broker_epoch": context.broker_epoch(broker_id),
                    "topic_states": [
                        {"topic_name": topic, "partition_states": states}
                        for topic, states in topics.items()
                    ],
                },
            )
            deleted = frozenset(tp for tp, delete in entries.items() if delete)

            def on_stop_replica_response(
                broker: int,
                api_key: int,
                response: Any,
                deleted: frozenset[TopicPartition] = deleted,
            ) -> None:
                self.on_response(broker, api_key, StopReplicaAnswer(response, deleted))

            self.channel.send(
                broker_id,
                ApiKey.STOP_REPLICA,
                STOP_REPLICA_VERSION,
                request,
                on_stop_replica_response,
            )
