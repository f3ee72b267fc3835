"""`FetchPool`: what a Python worker keeps between read tasks (leaders, idle connections)."""

from __future__ import annotations

import os
from typing import Any, cast

import pytest

from odradek.spark import fetch_pool
from odradek.spark.fetch_pool import IDLE_S, FetchPool
from odradek.spark.wire import BrokerSocket

A, B = ("127.0.0.1", 9092), ("127.0.0.1", 9093)


class FakeConnection:
    def __init__(self, in_flight: int = 0) -> None:
        self.in_flight = in_flight
        self.closed = False

    def close(self) -> None:
        self.closed = True


def connection(in_flight: int = 0) -> Any:
    return cast(BrokerSocket, FakeConnection(in_flight))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_leaders_are_remembered_per_bootstrap_topic_and_partition_and_forgotten() -> None:
    pool = FetchPool()
    pool.remember_leader("b:1", "t", 0, A)
    assert pool.leader("b:1", "t", 0) == A
    assert pool.leader("b:1", "t", 1) is None
    assert pool.leader("other:1", "t", 0) is None
    pool.forget_leader("b:1", "t", 0)
    assert pool.leader("b:1", "t", 0) is None
    pool.forget_leader("b:1", "t", 0)  # forgetting twice is harmless


def test_a_connection_is_handed_out_once_and_only_for_its_broker() -> None:
    pool = FetchPool()
    c = connection()
    pool.checkin(A, c)
    assert pool.checkout(B) is None
    assert pool.checkout(A) is c
    assert pool.checkout(A) is None  # in use by the task that took it


def test_a_connection_with_a_request_in_flight_is_closed_not_kept() -> None:
    pool = FetchPool()
    c = connection(in_flight=1)
    pool.checkin(A, c)
    assert c.closed and pool.idle_connections() == 0


def test_idle_connections_are_bounded_per_broker() -> None:
    pool = FetchPool()
    kept = [connection() for _ in range(fetch_pool._IDLE_PER_BROKER)]
    extra = connection()
    for c in [*kept, extra]:
        pool.checkin(A, c)
    assert extra.closed and not any(c.closed for c in kept)
    assert pool.idle_connections() == len(kept)


def test_a_connection_idle_too_long_is_closed_instead_of_reused() -> None:
    clock = Clock()
    pool = FetchPool(clock)
    old, young = connection(), connection()
    pool.checkin(A, old)
    clock.now += IDLE_S - 1
    pool.checkin(A, young)
    clock.now += 2  # old is now past IDLE_S, young is not
    assert pool.checkout(A) is young
    assert pool.checkout(A) is None
    assert old.closed


def test_a_forked_child_starts_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """PySpark's daemon forks its workers: a child must never use its parent's sockets."""
    pool = FetchPool()
    c = connection()
    pool.checkin(A, c)
    pool.remember_leader("b:1", "t", 0, A)
    child_pid = os.getpid() + 1
    monkeypatch.setattr(fetch_pool.os, "getpid", lambda: child_pid)
    assert pool.checkout(A) is None
    assert pool.leader("b:1", "t", 0) is None
    assert not c.closed  # the parent's to close, not the child's
