"""Transactions under faults: a transactional writer and read_committed readers, recording into
the run's `History` (the checks are in `history`).

* `TransactionalWriter`: a confluent-kafka producer with a `transactional.id` (its own thread),
  running transactions of 2-5 records spread over the topic's partitions, one after another. The
  first three commit, abort and fence (so that a short run has each); then a seeded choice
  commits most of them, aborts some deliberately (after flushing, so that their
  records are in the log and their invisibility means something), and now and then fences the
  producer in the middle of a transaction by initializing a second producer with the same
  `transactional.id`: the zombie's commit must fail and its records must never be visible. Every
  record is recorded as `txn_send` (process: the transaction's name `t0.17`, value `t0.17-<i>`),
  every transaction's end as `txn_outcome`, its `error` field one of:

  - `committed`: commit_transaction returned;
  - `aborted`: abort_transaction returned (deliberately, or after an abortable error);
  - `fenced`: a producer with the same id initialized before the transaction's commit was tried;
  - `failed`: the producer failed (fatal error, or gave up retrying) before commit was tried;
  - `unknown`: commit was tried but neither it nor an abort returned: the transaction may have
    committed or not, but it is all or nothing.

  librdkafka's error rules decide: a retriable error repeats the call, an abortable one
  (`txn_requires_abort`) aborts, anything else discards the producer, and the next transaction
  starts on a new producer with the same id (whose initialization fences the old one). A call
  still running well past its own timeout (librdkafka can block for ever after a coordinator left
  the metadata: `tests.integration._transactions.bounded_call`) is noted as `<call> hung` and its
  producer abandoned the same way, without being closed. `close` itself runs under the same
  watchdog (`close hung`).
* `CommittedReader`: a confluent-kafka consumer with `isolation.level=read_committed`, assigned
  every partition from offset 0, recording each record it gets as `txn_read` while faults run.
* `read_final_committed`: after the heal, waits until every partition's last stable offset has
  reached its high watermark (no transaction left open), then reads everything a read_committed
  consumer sees up to there, as `txn_final` events.

The LSO itself is observed by `lab.HistoryReader` (ListOffsets with isolation_level=1, as `lso`
events with the answering leader's epoch).

Concurrency: the writer and the reader run in their own threads and touch only their own
clients; `History.record` takes its lock. The test thread calls `start`/`stop`/`abandon` and
reads the counts.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from tests.faults.checker import CheckResult
from tests.faults.history import History
from tests.fixtures.threads import thread_stack
from tests.integration._transactions import ClientCallHung, bounded_call

TRANSACTION_TIMEOUT_MS = 30_000
CALL_TIMEOUT_S = 30.0
"""One init/commit/abort call; a retriable error (a timeout included) repeats it."""
END_DEADLINE_S = 120.0
"""How long one transaction's end (or a producer's initialization) is retried."""
ABORT_SHARE = 0.25
FENCE_SHARE = 0.05
RECORDS_PER_TRANSACTION = (2, 5)
FIRST_ACTIONS = ("commit", "abort", "fence")
"""The first transactions' ends, so that even a short run has one of each; then seeded."""
OUTCOMES = ("committed", "aborted", "fenced", "failed", "unknown")


CLOSE_TIMEOUT_S = 1.0


def _close(producer: Producer | None) -> bool:
    """Drop a producer within about a second: what it still queues is purged, and `close`
    aborts its open transaction if it still can (else the next producer with the same id, or the
    coordinator on its timeout, does). Never a commit, so outcomes stay what was recorded.

    `close` runs under the same watchdog as the transactional calls: soak run 16 (seed
    1256811644) saw `close(1.0)` of a producer whose abort had just failed block for more than
    270 s in librdkafka. False when it hung (the producer is abandoned, never destroyed under its
    call)."""
    if producer is None:
        return True
    try:
        producer.purge()
        bounded_call(lambda: producer.close(CLOSE_TIMEOUT_S), CLOSE_TIMEOUT_S, "close")
    except ClientCallHung:
        return False
    except (KafkaException, RuntimeError, TypeError, SystemError):
        pass  # SystemError: confluent-kafka's close can fail so (soak run 14); the producer is dropped
    return True


class TransactionalWriter:
    """One transactional producer's transactions until `stop()` (module docstring)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        history: History,
        seed: int,
        name: str = "t0",
        pause_s: float = 0.05,
    ) -> None:
        self.topic = topic
        self.partitions = partitions
        self.history = history
        self.name = name
        self.pause_s = pause_s
        self._rng = random.Random(seed)
        self._config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"faults-{name}-{uuid.uuid4().hex[:8]}",
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            "message.timeout.ms": TRANSACTION_TIMEOUT_MS,
            "linger.ms": 5,
            "request.timeout.ms": 5000,
            "socket.timeout.ms": 10_000,
        }
        # No librdkafka `logger` here: confluent-kafka's log callback, under this writer's
        # calls from several threads (`bounded_call`), left exceptions set that later failed
        # `close` and logging itself with SystemError (soak runs 13 and 14). A call that does
        # not return is named by its stack (`stop`) and survived by `bounded_call`.
        self._lock = threading.Lock()
        self._outcomes: Counter[str] = Counter()
        self._notes: Counter[str] = Counter()
        self.error: str | None = None
        self._stopping = threading.Event()
        self._abandoning = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"fault-{name}", daemon=True)

    # -- the test thread's side

    def start(self) -> TransactionalWriter:
        self._thread.start()
        return self

    def outcomes(self) -> Counter[str]:
        with self._lock:
            return Counter(self._outcomes)

    def notes(self) -> Counter[str]:
        """Errors the writer met (by name), for the summary."""
        with self._lock:
            return Counter(self._notes)

    def stop(self, timeout: float = 2 * END_DEADLINE_S + 30) -> None:
        """Finish the transaction under way, close a transaction a failed producer left open,
        and stop."""
        self._stopping.set()
        self._thread.join(timeout)
        if self._thread.is_alive() and self.error is None:
            self.error = (
                f"still running {timeout:g}s after stop(), at:\n{thread_stack(self._thread)}"
            )

    def abandon(self) -> None:
        self._abandoning.set()
        self._stopping.set()
        self._thread.join(60)

    # -- the writer's thread

    def _drop(self, producer: Producer | None) -> None:
        """`_close`, noting a close that hung."""
        if not _close(producer):
            self._note("close hung")

    def _note(self, what: str) -> None:
        with self._lock:
            self._notes[what] += 1

    def _call(self, call: Callable[[float], object], name: str) -> None:
        """`call(CALL_TIMEOUT_S)` under `bounded_call`; a hang is noted, then raised."""
        try:
            bounded_call(lambda: call(CALL_TIMEOUT_S), CALL_TIMEOUT_S, name)
        except ClientCallHung:
            self._note(f"{name} hung")
            raise

    def _new_producer(self) -> Producer | None:
        """A producer with the writer's transactional id, initialized (which fences every earlier
        one and ends the transaction it left open); None if that did not succeed in time."""
        deadline = time.monotonic() + END_DEADLINE_S
        while not self._abandoning.is_set():
            producer = Producer(self._config)
            try:
                self._call(producer.init_transactions, "init_transactions")
                return producer
            except ClientCallHung:
                pass  # noted; the producer is abandoned
            except KafkaException as e:
                self._note(f"init_transactions {e.args[0].name()}")
                self._drop(producer)
            if time.monotonic() > deadline:
                return None
            time.sleep(0.5)
        return None

    def _run(self) -> None:
        producer: Producer | None = None
        number = 0
        # True while a failed producer may have left a transaction open (it holds the LSO back
        # until the coordinator's timeout; a new producer with the same id ends it at once).
        dangling = False
        try:
            while not self._stopping.is_set():
                if producer is None:
                    producer = self._new_producer()
                    if producer is None:
                        continue
                    dangling = False
                number += 1
                name = f"{self.name}.{number}"
                producer, outcome, note = self._transaction(producer, name, number)
                dangling = producer is None
                self.history.record("txn_outcome", name, -1, error=outcome, value=note or None)
                with self._lock:
                    self._outcomes[outcome] += 1
                self._stopping.wait(self.pause_s)
            if dangling and not self._abandoning.is_set():
                producer = self._new_producer()
        except BaseException as e:  # reported through `error`, read by the test thread
            self.error = repr(e)
        finally:
            self._drop(producer)

    def _action(self, number: int) -> str:
        choice = self._rng.random()
        if number <= len(FIRST_ACTIONS):
            return FIRST_ACTIONS[number - 1]
        if choice < FENCE_SHARE:
            return "fence"
        return "abort" if choice < FENCE_SHARE + ABORT_SHARE else "commit"

    def _transaction(
        self, producer: Producer, name: str, number: int
    ) -> tuple[Producer | None, str, str]:
        """Run one transaction; (the producer to go on with, or None; the outcome; a note)."""
        action = self._action(number)
        count = self._rng.randint(*RECORDS_PER_TRANSACTION)
        first = self._rng.randrange(self.partitions)
        try:
            producer.begin_transaction()
            for i in range(count):
                partition = (first + i) % self.partitions
                value = f"{name}-{i}"
                self.history.record("txn_send", name, partition, value=value)
                producer.produce(self.topic, value=value.encode(), partition=partition)
            if action != "commit":
                self._call(producer.flush, "flush")
        except ClientCallHung:
            return None, "failed", "flush hung"
        except KafkaException as e:
            error = e.args[0]
            self._note(error.name())
            if error.txn_requires_abort():
                return self._end(producer, commit=False, commit_tried=False)
            self._drop(producer)
            return None, "failed", error.name()
        if action == "fence":
            successor = self._new_producer()
            if successor is not None:
                return successor, "fenced", self._zombie_commit(producer)
            action = "commit"  # no successor in time: end it as usual
        return self._end(producer, commit=action == "commit", commit_tried=False)

    def _zombie_commit(self, zombie: Producer) -> str:
        try:
            self._call(zombie.commit_transaction, "commit_transaction")
        except ClientCallHung:
            return "zombie commit hung"
        except KafkaException as e:
            self._drop(zombie)
            return f"zombie commit refused: {e.args[0].name()}"
        self._drop(zombie)
        return "zombie commit accepted"

    def _end(
        self, producer: Producer, commit: bool, commit_tried: bool
    ) -> tuple[Producer | None, str, str]:
        deadline = time.monotonic() + END_DEADLINE_S
        while True:
            try:
                if commit:
                    commit_tried = True
                    self._call(producer.commit_transaction, "commit_transaction")
                    return producer, "committed", ""
                self._call(producer.abort_transaction, "abort_transaction")
                return producer, "aborted", ""
            except ClientCallHung:
                call = "commit" if commit else "abort"
                return None, "unknown" if commit_tried else "failed", f"{call} hung"
            except KafkaException as e:
                error: KafkaError = e.args[0]
                self._note(f"{'commit' if commit else 'abort'} {error.name()}")
                if commit and error.txn_requires_abort():
                    commit = False
                    continue
                if (
                    error.retriable()
                    and time.monotonic() < deadline
                    and not self._abandoning.is_set()
                ):
                    continue
                self._drop(producer)
                return None, "unknown" if commit_tried else "failed", error.name()


class CommittedReader:
    """A read_committed consumer of every partition from offset 0 while faults run (module
    docstring)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, history: History) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.history = history
        self.read = 0
        self.error: str | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="txn-reader", daemon=True)

    def start(self) -> CommittedReader:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(60)

    def _run(self) -> None:
        try:
            consumer = _consumer(self.bootstrap, eof=False)
            try:
                consumer.assign(
                    [ConfluentTopicPartition(self.topic, p, 0) for p in range(self.partitions)]
                )
                while not self._stopping.is_set():
                    message = consumer.poll(0.2)
                    if message is None or message.error():
                        continue
                    self.history.record(
                        "txn_read", "txn-reader", message.partition(),
                        value=message.value().decode(errors="replace"), offset=message.offset(),
                    )  # fmt: skip
                    self.read += 1
            finally:
                consumer.close()
        except BaseException as e:  # reported through `error`
            self.error = repr(e)


def _consumer(bootstrap: str, eof: bool) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"txn-reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": eof,
        }
    )


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    """partition -> (last stable offset, high watermark), from ListOffsets under both
    isolation levels."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    answers = {}
    for isolation in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
        futures = admin.list_offsets(
            {ConfluentTopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)},
            isolation_level=isolation,
            request_timeout=15,
        )
        answers[isolation] = {
            tp.partition: f.result(timeout=CALL_TIMEOUT_S).offset for tp, f in futures.items()
        }
    return {
        p: (answers[IsolationLevel.READ_COMMITTED][p], answers[IsolationLevel.READ_UNCOMMITTED][p])
        for p in range(partitions)
    }


def read_final_committed(
    bootstrap: str, topic: str, partitions: int, history: History, timeout: float = 90.0
) -> CheckResult:
    """Wait until every partition's LSO has reached its HW (`lso_reaches_high_watermark`: no
    transaction is left open once the writer stopped), then record what a read_committed
    consumer reads up to there as `txn_final` events."""
    deadline = time.monotonic() + timeout
    offsets: dict[int, tuple[int, int]] = {}
    while time.monotonic() < deadline:
        try:
            offsets = end_offsets(bootstrap, topic, partitions)
        except KafkaException:
            offsets = {}
        if offsets and all(lso == hw for lso, hw in offsets.values()):
            break
        time.sleep(0.5)
    held = [f"partition {p}: LSO {lso}, HW {hw}" for p, (lso, hw) in offsets.items() if lso != hw]
    if not offsets:
        held = ["ListOffsets never answered"]
    consumer = _consumer(bootstrap, eof=True)
    try:
        consumer.assign([ConfluentTopicPartition(topic, p, 0) for p in range(partitions)])
        at_end: set[int] = set()
        while len(at_end) < partitions and time.monotonic() < deadline + 60:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                continue
            history.record(
                "txn_final", "final-reader", message.partition(),
                value=message.value().decode(errors="replace"), offset=message.offset(),
            )  # fmt: skip
        if len(at_end) < partitions:
            held.append(f"the read_committed reader reached the end of {sorted(at_end)} only")
    finally:
        consumer.close()
    return CheckResult("lso_reaches_high_watermark", not held, len(offsets), tuple(held[:5]))
