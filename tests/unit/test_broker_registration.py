"""A broker's registration at start-up (`BrokerZk._register_broker`) while an earlier
incarnation's `/brokers/ids/<id>` still lives.

The soak found it (round seed 822689643): a broker the nemesis restarted found its old
registration, waited, and gave up ("already registered ... by another broker") while ZooKeeper
was paused, although no session can expire while ZooKeeper does not serve. Only the time the
broker is connected counts towards giving up now. A stub stands in for ZooKeeper: what is tested
is the waiting rule, not ZooKeeper.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from odradek.errors import OperatorError
from odradek.server.broker_zk import BrokerZk
from odradek.zk.errors import NodeExistsError, NoNodeError

OLD_SESSION, OUR_SESSION = 1, 2
SESSION_TIMEOUT_MS = 100  # the broker gives up after 0.1 + 5 s of connected waiting


class HeldRegistration:
    """`/brokers/ids/<id>` owned by `owner` (None: absent); `connected` as the client sees it."""

    session_id = OUR_SESSION

    def __init__(self) -> None:
        self.owner: int | None = OLD_SESSION
        self.connected = True

    async def create(self, path: str, data: bytes, ephemeral: bool = False) -> None:
        if self.owner is not None:
            raise NodeExistsError(path)
        self.owner = OUR_SESSION

    async def get(self, path: str) -> tuple[bytes, Any]:
        if self.owner is None:
            raise NoNodeError(path)
        return b"", SimpleNamespace(ephemeralOwner=self.owner, czxid=7)


class Config(dict[str, Any]):
    advertised_listeners: list[Any] = []


def registering_broker(zk: HeldRegistration) -> Any:
    broker = SimpleNamespace(
        config=Config({"zookeeper.session.timeout.ms": SESSION_TIMEOUT_MS, "broker.rack": None}),
        broker_id=3,
        socket_servers=[],
        registered=asyncio.Event(),
        broker_epoch=-1,
        _zk=zk,
    )
    return broker


def test_soak_broker_restarted_while_zookeeper_paused_waits_for_its_old_registration() -> None:
    asyncio.run(_restarted_while_zookeeper_paused())


async def _restarted_while_zookeeper_paused() -> None:
    zk = HeldRegistration()
    broker = registering_broker(zk)

    async def zookeeper_pauses_then_expires_the_old_session() -> None:
        await asyncio.sleep(0.5)
        zk.connected = False  # longer than the broker's patience in wall-clock time
        await asyncio.sleep(6.0)
        zk.connected = True
        await asyncio.sleep(1.0)
        zk.owner = None

    nemesis = asyncio.create_task(zookeeper_pauses_then_expires_the_old_session())
    await asyncio.wait_for(BrokerZk._register_broker(broker), timeout=30)
    await nemesis
    assert zk.owner == OUR_SESSION
    assert broker.registered.is_set() and broker.broker_epoch == 7


def test_another_broker_with_our_id_is_refused_after_connected_patience() -> None:
    asyncio.run(_another_broker_with_our_id())


async def _another_broker_with_our_id() -> None:
    zk = HeldRegistration()  # never expires: another live broker holds the id
    broker = registering_broker(zk)
    started = time.monotonic()
    with pytest.raises(OperatorError, match="already registered"):
        await asyncio.wait_for(BrokerZk._register_broker(broker), timeout=30)
    assert time.monotonic() - started >= SESSION_TIMEOUT_MS / 1000 + 5
    assert zk.owner == OLD_SESSION
