"""Two idempotent producers driven step by step, for test_idempotent_duplicate_differential.py:
librdkafka (confluent-kafka) and Kafka 3.9.1's Java client (tests/java/EpochBumpProducer.java).

Both have the same face: `produce(topic, value)` to partition 0, `wait_for(pattern)` until a line
of the client's log matches (a deadline of `WAIT_S`, never a fixed sleep), `flush()` returning each
value's report ("delivered" or the client's error name), `close()`, and `lines`, the log so far.
`Cues` names the log lines the scenario waits on: a request to broker 2 timed out client-side,
and the producer bumped its epoch.

Timeouts: a record's delivery timeout is `TIMEOUT_MS`; a request's client-side timeout is half of
it (librdkafka's socket.timeout.ms; the Java client's request.timeout.ms, which is also the
broker's acks=all wait). librdkafka's broker-side request.timeout.ms is 2 s.

Concurrency: a client belongs to the test's thread. librdkafka hands its log lines to the Python
logger only inside poll() and flush(), so its waits poll; the Java client's stdout is read by a
daemon thread that only appends to `lines`.
"""

from __future__ import annotations

import logging
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from confluent_kafka import KafkaError, Message, Producer

from tests.integration._kafka import kafka_libs

TIMEOUT_MS = 12_000
WAIT_S = 3 * TIMEOUT_MS / 1000
LIBRDKAFKA = {
    "enable.idempotence": True,
    "acks": "all",
    "request.timeout.ms": 2000,
    "socket.timeout.ms": TIMEOUT_MS // 2,
    "message.timeout.ms": TIMEOUT_MS,
    "linger.ms": 1,
    "debug": "eos,msg",
}
JAVA_SOURCE = Path(__file__).resolve().parents[1] / "java" / "EpochBumpProducer.java"
# The two loggers whose INFO lines are the Java client's cues; everything else at WARN.
JAVA_LOG4J = """\
log4j.rootLogger=WARN, out
log4j.appender.out=org.apache.log4j.ConsoleAppender
log4j.appender.out.Target=System.out
log4j.appender.out.layout=org.apache.log4j.PatternLayout
log4j.appender.out.layout.ConversionPattern=%p %m (%c)%n
log4j.logger.org.apache.kafka.clients.NetworkClient=INFO
log4j.logger.org.apache.kafka.clients.producer.internals.TransactionManager=INFO
"""


@dataclass(frozen=True)
class Cues:
    """A client's log lines that order the scenario: B's request timed out, the epoch bumped
    (group 1: the new epoch)."""

    b_timed_out: re.Pattern[str]
    bumped: re.Pattern[str]


# librdkafka v2.15.0's texts (the bundled 2.16 library has the same): rd_kafka_broker_bufq_timeout_scan
# and rd_kafka_idemp_drain_done. Broker 2's thread is named "host:port/2".
LIBRDKAFKA_CUES = Cues(
    re.compile(r"/2: Timed out ProduceRequest in flight"),
    re.compile(r"All partitions drained, bumped epoch to PID\{Id:\d+,Epoch:(\d+)\}"),
)
# Kafka 3.9's NetworkClient.handleTimedOutRequests and TransactionManager.setProducerIdAndEpoch.
JAVA_CUES = Cues(
    re.compile(r"Disconnecting from node 2 due to request timeout"),
    re.compile(r"ProducerId set to \d+ with epoch ([1-9]\d*)"),
)


def wait_for_line(
    lines: list[str], pattern: re.Pattern[str], poll: Callable[[], object], count: int = 1
) -> None:
    """Call `poll` until `count` of `lines` match `pattern`; AssertionError after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while sum(1 for line in list(lines) if pattern.search(line)) < count:
        assert time.monotonic() < deadline, f"no {pattern.pattern!r} (x{count}) in {WAIT_S:g}s"
        poll()


class _Lines(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class Librdkafka:
    """A confluent-kafka producer (`LIBRDKAFKA`) and its debug log (see the module docstring)."""

    def __init__(self, bootstrap: str) -> None:
        self.lines: list[str] = []
        self._delivered: dict[bytes, str] = {}
        logger = logging.getLogger(f"{__name__}.{uuid.uuid4().hex}")
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        logger.addHandler(_Lines(self.lines))
        self._producer = Producer({"bootstrap.servers": bootstrap, **LIBRDKAFKA}, logger=logger)

    def _report(self, error: KafkaError | None, message: Message) -> None:
        value = message.value()
        assert isinstance(value, bytes)
        self._delivered[value] = error.name() if error else "delivered"

    def produce(self, topic: str, value: bytes) -> None:
        self._producer.produce(topic, value, partition=0, on_delivery=self._report)

    def wait_for(self, pattern: re.Pattern[str]) -> None:
        wait_for_line(self.lines, pattern, partial(self._producer.poll, 0.05))

    def flush(self) -> dict[bytes, str]:
        assert self._producer.flush(WAIT_S) == 0, "records left after flush"
        return dict(self._delivered)

    def close(self) -> None:
        self._producer.close()


def java_command(classes: Path) -> list[str]:
    """Compile EpochBumpProducer into `classes` and return the command that runs it."""
    clients_jar = next(kafka_libs().glob("kafka-clients-*.jar"))
    subprocess.run(
        ["javac", "-cp", str(clients_jar), "-d", str(classes), str(JAVA_SOURCE)],
        check=True,
        timeout=120,
    )
    (classes / "log4j.properties").write_text(JAVA_LOG4J)
    return [
        "java",
        f"-Dlog4j.configuration=file:{classes / 'log4j.properties'}",
        "-cp",
        f"{classes}:{kafka_libs()}/*",
        "EpochBumpProducer",
    ]


class JavaProducer:
    """EpochBumpProducer in its own JVM, fed commands on stdin (see the module docstring)."""

    def __init__(self, command: list[str], bootstrap: str) -> None:
        # request.timeout.ms, delivery.timeout.ms
        timeouts = [str(TIMEOUT_MS // 2), str(TIMEOUT_MS)]
        self._process = subprocess.Popen(
            [*command, bootstrap, *timeouts],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self.lines: list[str] = []
        self._flushes = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self.lines.append(line.rstrip("\n"))

    def _command(self, line: str) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(line + "\n")
        self._process.stdin.flush()

    def produce(self, topic: str, value: bytes) -> None:
        self._command(f"send {topic} {value.decode()}")

    def wait_for(self, pattern: re.Pattern[str], count: int = 1) -> None:
        wait_for_line(self.lines, pattern, partial(time.sleep, 0.05), count)

    def flush(self) -> dict[bytes, str]:
        self._command("flush")
        self._flushes += 1
        self.wait_for(re.compile(r"^flushed$"), self._flushes)
        reports = [line.split() for line in self.lines if line.startswith(("ack ", "error "))]
        return {w[1].encode(): "delivered" if w[0] == "ack" else w[2] for w in reports}

    def close(self) -> None:
        try:
            self._command("close")
            self._process.wait(30)
        finally:
            self._process.kill()
            self._process.wait(30)
