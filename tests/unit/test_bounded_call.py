"""`bounded_call`, the watchdog the transaction tests put around librdkafka's transactional calls."""

from __future__ import annotations

import threading

import pytest

from tests.integration import _transactions
from tests.integration._transactions import ClientCallHung, bounded_call


def test_returns_the_calls_value() -> None:
    assert bounded_call(lambda: 42, 1.0, "answer") == 42


def test_raises_the_calls_error_in_the_callers_thread() -> None:
    def fail() -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        bounded_call(fail, 1.0, "fail")


def test_a_call_that_outlives_its_timeout_is_reported_hung(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_transactions, "HUNG_AFTER_S", 0.05)
    release = threading.Event()
    try:
        with pytest.raises(ClientCallHung, match="send_offsets_to_transaction still running"):
            bounded_call(lambda: release.wait(30), 0.05, "send_offsets_to_transaction")
    finally:
        release.set()


def test_a_producer_close_that_blocks_is_abandoned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Soak run 16: `close(1.0)` of a transactional producer blocked for more than 270 s."""
    from tests.faults import transactions

    monkeypatch.setattr(_transactions, "HUNG_AFTER_S", 0.05)
    release = threading.Event()

    class BlockingClose:
        purged = False

        def purge(self) -> None:
            self.purged = True

        def close(self, timeout: float) -> None:
            release.wait(30)

    producer = BlockingClose()
    try:
        assert transactions._close(producer) is False  # type: ignore[arg-type]
        assert producer.purged
    finally:
        release.set()


def test_a_producer_close_that_returns_is_a_close() -> None:
    from tests.faults import transactions

    class QuickClose:
        closed_with: float | None = None

        def purge(self) -> None:
            pass

        def close(self, timeout: float) -> None:
            self.closed_with = timeout

    producer = QuickClose()
    assert transactions._close(producer) is True  # type: ignore[arg-type]
    assert producer.closed_with == transactions.CLOSE_TIMEOUT_S
