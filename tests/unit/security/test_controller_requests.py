"""The forged-controller-request defence: the pure decisions and the validator with a fake
ZooKeeper reader."""

from __future__ import annotations

import asyncio

import pytest
from kio.schema.errors import ErrorCode

from odradek.security.controller_requests import (
    Check,
    ControllerEpochValidator,
    ControllerView,
    check_broker_epoch,
    check_controller,
    check_controller_against_zookeeper,
    may_update_follower_state,
    validate_controlled_shutdown,
    validate_follower_fetch,
)

STALE_CONTROLLER = ErrorCode.stale_controller_epoch
STALE_BROKER = ErrorCode.stale_broker_epoch


@pytest.mark.parametrize(
    ("request_id", "request_epoch", "verified", "expected"),
    [
        (1, 5, None, Check.READ_ZOOKEEPER),
        (1, 5, ControllerView(1, 5), Check.ACCEPT),
        (2, 5, ControllerView(1, 5), Check.REFUSE),
        (1, 4, ControllerView(1, 5), Check.REFUSE),
        (1, 6, ControllerView(1, 5), Check.READ_ZOOKEEPER),
        (1, 10**9, ControllerView(1, 5), Check.READ_ZOOKEEPER),
    ],
)
def test_check_controller(
    request_id: int, request_epoch: int, verified: ControllerView | None, expected: Check
) -> None:
    assert check_controller(request_id, request_epoch, verified)[0] is expected


def test_check_against_zookeeper() -> None:
    assert check_controller_against_zookeeper(1, 6, ControllerView(1, 6))[0]
    assert not check_controller_against_zookeeper(1, 10**9, ControllerView(1, 6))[0]  # forged
    assert not check_controller_against_zookeeper(1, 6, ControllerView(1, 7))[0]  # stale
    assert not check_controller_against_zookeeper(1, 6, ControllerView(2, 6))[0]  # wrong id
    assert not check_controller_against_zookeeper(1, 6, ControllerView(-1, 6))[0]  # no controller


@pytest.mark.parametrize(
    ("request_epoch", "own", "expected"),
    [
        (100, 100, Check.ACCEPT),
        (99, 100, Check.REFUSE),
        (-1, 100, Check.REFUSE),  # Kafka accepts -1 (pre-KIP-380 controllers); we do not
        (-1, -1, Check.REFUSE),
        (101, 100, Check.READ_ZOOKEEPER),
    ],
)
def test_check_broker_epoch(request_epoch: int, own: int, expected: Check) -> None:
    assert check_broker_epoch(request_epoch, own)[0] is expected


class FakeZooKeeper:
    def __init__(self, controller: ControllerView, registration: int) -> None:
        self.controller = controller
        self.registration = registration
        self.reads = 0

    async def read_controller(self) -> ControllerView:
        self.reads += 1
        await asyncio.sleep(0)  # a real read suspends: concurrent callers must share it
        return self.controller

    async def read_registration(self) -> int:
        return self.registration


def validator(zk: FakeZooKeeper, own_epoch: list[int]) -> ControllerEpochValidator:
    return ControllerEpochValidator(zk.read_controller, zk.read_registration, lambda: own_epoch[0])


def test_forged_future_epoch_is_refused_and_the_real_controller_still_accepted() -> None:
    async def go() -> None:
        zk = FakeZooKeeper(ControllerView(1, 5), 100)
        v = validator(zk, [100])
        assert (await v.validate(1, 5, 100)).accepted
        forged = await v.validate(1, 10**9, 100)
        assert forged.error == STALE_CONTROLLER and "forged" in forged.reason
        assert v.verified == ControllerView(1, 5)  # unchanged by the forgery
        assert (await v.validate(1, 5, 100)).accepted
        assert v.check_cached(1, 5, 100) is not None  # no read needed any more

    asyncio.run(go())


def test_wrong_controller_id_or_broker_epoch() -> None:
    async def go() -> None:
        zk = FakeZooKeeper(ControllerView(1, 5), 100)
        v = validator(zk, [100])
        assert (await v.validate(3, 5, 100)).error == STALE_CONTROLLER
        assert (await v.validate(1, 5, 99)).error == STALE_BROKER
        assert (await v.validate(1, 5, -1)).error == STALE_BROKER
        # a higher broker epoch is checked against our registration in ZooKeeper
        assert (await v.validate(1, 5, 12345)).error == STALE_BROKER
        zk.registration = 150  # we re-registered and have not learned it yet
        assert (await v.validate(1, 5, 150)).accepted

    asyncio.run(go())


def test_new_controller_after_failover_and_the_deposed_one() -> None:
    async def go() -> None:
        zk = FakeZooKeeper(ControllerView(1, 5), 100)
        v = validator(zk, [100])
        assert (await v.validate(1, 5, 100)).accepted
        zk.controller = ControllerView(2, 6)
        assert (await v.validate(2, 6, 100)).accepted
        assert (await v.validate(1, 5, 100)).error == STALE_CONTROLLER  # the deposed controller
        v.observe(ControllerView(3, 7))  # from this broker's own /controller watch
        assert v.check_cached(3, 7, 100) is not None and v.check_cached(3, 7, 100).accepted  # type: ignore[union-attr]
        v.observe(ControllerView(2, 6))  # older: ignored
        assert v.verified == ControllerView(3, 7)

    asyncio.run(go())


def test_concurrent_requests_share_one_zookeeper_read() -> None:
    async def go() -> None:
        zk = FakeZooKeeper(ControllerView(1, 5), 100)
        v = validator(zk, [100])
        verdicts = await asyncio.gather(*(v.validate(1, 5 + i % 2 * 10**6, 100) for i in range(20)))
        assert zk.reads == 1
        assert sum(x.accepted for x in verdicts) == 10

    asyncio.run(go())


def test_controlled_shutdown() -> None:
    live = {1: 100, 2: 200}
    assert validate_controlled_shutdown(1, 100, live).accepted
    assert validate_controlled_shutdown(1, -1, live).error == STALE_BROKER
    assert validate_controlled_shutdown(1, 150, live).error == STALE_BROKER
    assert validate_controlled_shutdown(3, 300, live).error == ErrorCode.broker_not_available


def test_follower_fetch() -> None:
    live = {1: 100, 2: 200}
    ok = validate_follower_fetch(2, 200, [1, 2], live, has_current_leader_epoch=True)
    assert ok.error is None and ok.update_state
    not_assigned = validate_follower_fetch(3, 300, [1, 2], live, has_current_leader_epoch=True)
    assert not_assigned.error == ErrorCode.unknown_leader_epoch
    old_version = validate_follower_fetch(3, -1, [1, 2], live, has_current_leader_epoch=False)
    assert old_version.error == ErrorCode.not_leader_or_follower
    stale = validate_follower_fetch(2, 199, [1, 2], live, has_current_leader_epoch=True)
    assert stale.error == STALE_BROKER and not stale.update_state
    no_epoch = validate_follower_fetch(2, -1, [1, 2], live, has_current_leader_epoch=True)
    assert no_epoch.error == STALE_BROKER
    lenient = validate_follower_fetch(
        2, -1, [1, 2], live, has_current_leader_epoch=True, require_replica_epoch=False
    )
    assert lenient.error is None and lenient.update_state
    # a dead follower (not registered) fetching in its name: served, never updates the ISR
    dead = validate_follower_fetch(2, 200, [1, 2], {1: 100}, has_current_leader_epoch=True)
    assert dead.error is None and not dead.update_state


def test_follower_state_only_after_a_valid_read() -> None:
    assert may_update_follower_state(10, 0, 10, False)
    assert may_update_follower_state(0, 0, 10, False)
    assert not may_update_follower_state(11, 0, 10, False)  # beyond the leader's LEO
    assert not may_update_follower_state(5, 6, 10, False)  # below the log start
    assert not may_update_follower_state(5, 0, 10, True)  # must truncate first
