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
