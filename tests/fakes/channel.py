"""A ControllerChannelManager that records the controller's requests instead of sending them.

`RecordingChannelManager` has the production class's constructor and methods (`add_broker`,
`remove_broker`, `send`, `queued`, `shutdown`), so a test can hand it to
`ControllerBrokerRequestBatch` or patch it into `odradek.controller.failover`. Each request is kept,
per broker and in send order, as the kio request object the batch built, with the response callback,
until the test answers it with `answer_next` (in order, as the one sender per broker would).

Stricter than production, so that mistakes show where they are made:

* a send after `shutdown` raises `ChannelClosedError` (production drops it silently; a resigned
  controller that still sends is a bug);
* a send to a broker without a sender (never added, or removed) is kept in `dropped` rather than
  vanishing, so a test can assert that the controller only addresses brokers it considers live;
* `add_broker` for a broker that already has a sender with different registration data replaces it
  and discards its unanswered requests, as production's cancelled sender task does.

Concurrency: single-threaded, like the controller's event task that calls it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from odradek.protocol.codec import ApiKey
from odradek.zk.znodes import BrokerInfo

ResponseCallback = Callable[[int, int, Any], None]


class ChannelClosedError(Exception):
    """The controller sent a request through a channel it had already shut down."""


@dataclass
class SentRequest:
    """One request as the batch handed it to the channel. `answered` once the test replied;
    `discarded` if its broker's sender went away first (it will never be answered)."""

    sequence: int
    broker_id: int
    api_key: int
    version: int
    request: Any
    callback: ResponseCallback | None
    answered: bool = False
    discarded: bool = False

    @property
    def controller_epoch(self) -> int:
        return int(self.request.controller_epoch)


@dataclass(frozen=True, slots=True)
class PartitionInRequest:
    """One partition entry of a recorded LeaderAndIsr / UpdateMetadata / StopReplica request."""

    broker_id: int
    api_key: int
    topic: str
    partition: int
    state: Any  # the kio partition-state entity of that request type
    request_controller_epoch: int

    @property
    def tp(self) -> tuple[str, int]:
        return (self.topic, self.partition)


@dataclass
class RecordingChannelManager:
    """Records requests per broker. Same construction as `ControllerChannelManager`.

    Concurrency: the controller's event task (or a test's single thread) only; `answer_next`
    runs the response callback inline, which only enqueues a controller event.
    """

    controller_id: int
    request_timeout: float = 30.0
    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    sent: list[SentRequest] = field(default_factory=list)
    dropped: list[SentRequest] = field(default_factory=list)
    closed: bool = False

    # ControllerChannelManager's interface

    def add_broker(self, broker: BrokerInfo) -> None:
        existing = self.brokers.get(broker.id)
        if existing == broker:
            return
        if existing is not None:
            self._discard_pending(broker.id)
        self.brokers[broker.id] = broker

    def remove_broker(self, broker_id: int) -> None:
        if self.brokers.pop(broker_id, None) is not None:
            self._discard_pending(broker_id)

    def send(
        self,
        broker_id: int,
        api_key: int,
        version: int,
        request: Any,
        callback: ResponseCallback | None,
    ) -> None:
        if self.closed:
            raise ChannelClosedError(
                f"controller {self.controller_id} sent {ApiKey(api_key).name} to broker "
                f"{broker_id} after its channel was shut down"
            )
        item = SentRequest(
            len(self.sent) + len(self.dropped), broker_id, api_key, version, request, callback
        )
        if broker_id in self.brokers:
            self.sent.append(item)
        else:
            self.dropped.append(item)

    @property
    def queued(self) -> int:
        return len(self.pending())

    async def shutdown(self) -> None:
        self.closed = True
        self.brokers.clear()

    # what tests look at

    def _discard_pending(self, broker_id: int) -> None:
        # A removed sender's queue dies with it: those requests will never be answered.
        for item in self.sent:
            if item.broker_id == broker_id and not item.answered:
                item.discarded = True

    def requests(
        self, api_key: int | None = None, broker_id: int | None = None, since: int = 0
    ) -> list[SentRequest]:
        """Recorded requests (sent ones, not dropped), optionally of one type / to one broker,
        from index `since` of `sent` on."""
        return [
            r
            for r in self.sent[since:]
            if (api_key is None or r.api_key == api_key)
            and (broker_id is None or r.broker_id == broker_id)
        ]

    def pending(self, broker_id: int | None = None) -> list[SentRequest]:
        """Requests not answered yet, in send order."""
        return [
            r
            for r in self.sent
            if not r.answered
            and not r.discarded
            and (broker_id is None or r.broker_id == broker_id)
        ]

    def partitions(
        self, api_key: int, broker_id: int | None = None, since: int = 0
    ) -> list[PartitionInRequest]:
        """Every partition entry of the matching requests, flattened, in send order."""
        return list(self._iter_partitions(self.requests(api_key, broker_id, since)))

    @staticmethod
    def _iter_partitions(requests: list[SentRequest]) -> Iterator[PartitionInRequest]:
        for item in requests:
            for topic_state in item.request.topic_states:
                for state in topic_state.partition_states:
                    yield PartitionInRequest(
                        item.broker_id,
                        item.api_key,
                        topic_state.topic_name,
                        int(state.partition_index),
                        state,
                        item.controller_epoch,
                    )

    def brokers_sent(self, api_key: int, since: int = 0) -> set[int]:
        return {r.broker_id for r in self.requests(api_key, since=since)}

    def answer_next(self, broker_id: int, make_response: Callable[[SentRequest], Any]) -> bool:
        """Answer the oldest unanswered request to `broker_id` with `make_response(request)`,
        through the callback the controller gave. False if nothing was pending."""
        pending = self.pending(broker_id)
        if not pending:
            return False
        item = pending[0]
        item.answered = True
        if item.callback is not None:
            item.callback(broker_id, item.api_key, make_response(item))
        return True

    def clear(self) -> None:
        """Forget what was recorded (a test's way of starting a new phase)."""
        self.sent.clear()
        self.dropped.clear()


__all__ = [
    "ChannelClosedError",
    "PartitionInRequest",
    "RecordingChannelManager",
    "SentRequest",
]
