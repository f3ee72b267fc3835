"""The exactly-once topic sink (`exactlyOnce=true`): one Kafka transaction per micro-batch task.

Spark replays a micro-batch that did not complete (the driver died, the query was restarted from
its checkpoint) over the same offset ranges, so each of its write tasks receives the same rows
under the same task partition id. Each task therefore writes its rows in one transaction and
records, in the same transaction, that it did:

* transactional id and consumer group `odradek-spark-<query id>-<task partition id>`, where the
  query id is the one Spark keeps in the checkpoint (the `sql.streaming.queryId` local property;
  a restart from the checkpoint keeps it, a new checkpoint gets a new one) and the micro-batch id
  comes from the `streaming.sql.batchId` local property;
* `init_transactions` fences any earlier attempt of the task (a retried task, a zombie executor,
  the run killed with the driver) and aborts its open transaction, or waits for it to finish
  committing;
* the group's committed offset of partition 0 of the sink topic is read: it is the last batch id
  committed by this task plus one. A batch at or below it was committed before the replay: the
  task writes nothing and reports so;
* otherwise the rows are produced inside a transaction that also commits offset `batch id + 1`
  for that group (TxnOffsetCommit, with a metadata string naming the batch), so the records and
  the batch's record of them become visible together, to read_committed consumers, or not at all.

What this needs: the same rows in the same task partition when a batch is replayed, which holds
for the `odradek` source and any deterministic query (no `repartition()` without columns, no
nondeterministic expressions before the sink), and the sink's `topic` option. Readers of the sink
topic must use `isolation.level=read_committed` (a read_uncommitted reader also sees the records
of aborted attempts).

librdkafka (2.16 included) can block in `send_offsets_to_transaction` past its own timeout, for
ever, when the group coordinator it cached left the metadata (a killed broker, an expired
ZooKeeper session): issues #5456 and #5511. Every transactional call of a task therefore runs
under `bounded`: still blocked `HUNG_AFTER_S` past its timeout, the task fails with
`TransactionCallHung` instead of hanging for ever, without aborting (the call holds the
producer), and Spark's retry of the task fences that producer with `init_transactions`.

Concurrency: one task thread (and, per transactional call, a thread that makes it); the producer
and the consumer (used only to read and name the group) belong to the task.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as RdTopicPartition

from odradek.errors import DataSourceOptionError, RequestTimedOutError
from odradek.spark.clients import consumer_config, translate

__all__ = [
    "BATCH_ID_PROPERTY",
    "QUERY_ID_PROPERTY",
    "TaskIdentity",
    "TransactionCallHung",
    "TransactionLedger",
    "bounded",
    "task_identity",
]

log = logging.getLogger(__name__)

BATCH_ID_PROPERTY = "streaming.sql.batchId"  # Spark's MicroBatchExecution.BATCH_ID_KEY
QUERY_ID_PROPERTY = "sql.streaming.queryId"  # Spark's StreamExecution.QUERY_ID_KEY
TXN_TIMEOUT_S = 60.0
HUNG_AFTER_S = 30.0

T = TypeVar("T")


class TransactionCallHung(RequestTimedOutError):
    """A transactional call still blocked `HUNG_AFTER_S` after its own timeout (module
    docstring); its producer must not be used again."""


def bounded(
    call: Callable[[], T],
    what: str,
    timeout_s: float = TXN_TIMEOUT_S,
    hung_after_s: float | None = None,
) -> T:
    """`call()` (whose own timeout is `timeout_s`) in a thread of its own, its result or error
    returned here; TransactionCallHung if it has not returned `hung_after_s` (default
    `HUNG_AFTER_S`) later. The blocked thread keeps the client referenced, so it is never
    destroyed under the call."""
    grace = HUNG_AFTER_S if hung_after_s is None else hung_after_s
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as e:  # re-raised in the task's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, name=f"odradek-txn-{what}", daemon=True)
    thread.start()
    thread.join(timeout_s + grace)
    if thread.is_alive():
        raise TransactionCallHung(
            f"{what} did not return {timeout_s + grace:g}s after it was called, past its "
            f"timeout of {timeout_s:g}s (librdkafka issues #5456, #5511): the task fails and "
            "its retry fences this producer"
        )
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


@dataclass(frozen=True)
class TaskIdentity:
    """Which micro-batch task this is, as it survives a restart from the checkpoint."""

    query_id: str
    batch_id: int
    partition_id: int

    @property
    def transactional_id(self) -> str:
        return f"odradek-spark-{self.query_id}-{self.partition_id}"

    @property
    def group_id(self) -> str:
        return self.transactional_id


def task_identity() -> TaskIdentity:
    """The running task's identity, from the TaskContext Spark gives a Python worker."""
    from pyspark import TaskContext

    context = TaskContext.get()
    query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context else None
    batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
    if context is None or not query_id or batch_id is None:
        raise DataSourceOptionError(
            "exactlyOnce=true needs a streaming query (writeStream): this task has no "
            "micro-batch id"
        )
    return TaskIdentity(query_id, int(batch_id), context.partitionId())


class TransactionLedger:
    """The record, per task, of the last micro-batch whose transaction committed: the committed
    offset of partition 0 of `topic` for the task's group (batch id + 1)."""

    def __init__(
        self, bootstrap_servers: str, params: dict[str, str], identity: TaskIdentity, topic: str
    ) -> None:
        self.identity = identity
        self.partition = RdTopicPartition(topic, 0)
        config = consumer_config(bootstrap_servers, params, "read_committed")
        config["group.id"] = identity.group_id
        try:
            self.consumer = Consumer(config)
        except KafkaException as e:
            raise translate(e, "creating the sink's group client") from None

    def last_committed_batch(self) -> int | None:
        """The id of the last batch this task committed, or None if none has."""
        try:
            [found] = self.consumer.committed([self.partition], timeout=TXN_TIMEOUT_S)
        except KafkaException as e:
            raise translate(e, f"reading the offsets of group {self.identity.group_id}") from None
        if found.error is not None:
            raise translate(found.error, f"reading the offsets of group {self.identity.group_id}")
        return found.offset - 1 if found.offset is not None and found.offset > 0 else None

    def already_committed(self) -> bool:
        last = self.last_committed_batch()
        return last is not None and last >= self.identity.batch_id

    def record(self, producer: Any) -> None:
        """Add `batch id + 1` as the group's offset to the producer's open transaction."""
        marker = RdTopicPartition(
            self.partition.topic,
            0,
            self.identity.batch_id + 1,
            metadata=json.dumps({"batchId": self.identity.batch_id}),
        )
        group = self.consumer.consumer_group_metadata()
        bounded(
            lambda: producer.send_offsets_to_transaction([marker], group, TXN_TIMEOUT_S),
            "send_offsets_to_transaction",
        )

    def close(self) -> None:
        self.consumer.close()
