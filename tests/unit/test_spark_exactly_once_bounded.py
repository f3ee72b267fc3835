"""The exactly-once sink's watchdog around librdkafka's transactional calls (`bounded`), and what
`write_task` does when a call hangs: fail the task without touching the held producer again."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from odradek.errors import RequestTimedOutError
from odradek.spark import exactly_once, writer
from odradek.spark.exactly_once import TaskIdentity, TransactionCallHung, bounded
from odradek.spark.options import SinkOptions


def test_bounded_returns_the_value_and_raises_the_error() -> None:
    assert bounded(lambda: "done", "call", timeout_s=1.0) == "done"

    def refuse() -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        bounded(refuse, "call", timeout_s=1.0)


def test_bounded_reports_a_call_blocked_past_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exactly_once, "HUNG_AFTER_S", 0.05)
    release = threading.Event()
    try:
        with pytest.raises(TransactionCallHung, match="send_offsets_to_transaction did not") as e:
            bounded(lambda: release.wait(30), "send_offsets_to_transaction", timeout_s=0.05)
        assert isinstance(e.value, RequestTimedOutError)  # Kafka's REQUEST_TIMED_OUT family
    finally:
        release.set()


class _Producer:
    """What write_task calls on its producer; `send_offsets` blocks until released."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release
        self.calls: list[str] = []

    def init_transactions(self, timeout: float) -> None:
        self.calls.append("init")

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")

    def send_offsets_to_transaction(self, *args: Any) -> None:
        self.calls.append("send_offsets")
        self.release.wait(30)


class _Task:
    def __init__(self, producer: _Producer) -> None:
        self.producer = producer
        self.report = writer.WriteReport()

    def write(self, batches: Any) -> writer.WriteReport:
        return self.report


class _Ledger:
    def __init__(self, *args: Any) -> None:
        self.closed = False

    def already_committed(self) -> bool:
        return False

    def record(self, producer: _Producer) -> None:
        bounded(lambda: producer.send_offsets_to_transaction(), "send_offsets_to_transaction", 0.05)

    def close(self) -> None:
        self.closed = True


def test_a_hung_call_fails_the_task_without_an_abort(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exactly_once, "HUNG_AFTER_S", 0.05)
    release = threading.Event()
    producer = _Producer(release)
    monkeypatch.setattr(writer, "task_identity", lambda: TaskIdentity("q", 3, 0))
    monkeypatch.setattr(writer, "_TaskProducer", lambda options, txn_id: _Task(producer))
    monkeypatch.setattr(writer, "TransactionLedger", _Ledger)
    options = SinkOptions.parse(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t", "exactlyOnce": "true"}
    )
    try:
        with pytest.raises(TransactionCallHung):
            writer.write_task(options, iter([]))
        assert producer.calls == ["init", "begin", "send_offsets"]
    finally:
        release.set()
