"""ZooKeeper views that must not go stale when a pass fails.

A watch fires once. A pass that reads the znodes again (and re-arms the watch) can fail on a
connection loss; if nothing runs it again, the view stays as it was until the session expires --
which it may never do. That happened to a leader's view of the live brokers' epochs after two of
three ZooKeeper members were paused: the re-registered followers' fetches were refused as
STALE_BROKER_EPOCH and they never rejoined the ISR.
"""

from __future__ import annotations

import asyncio
from typing import Any

from odradek.security.notifications import Coalescer
from odradek.server.broker_security import BrokerSecurity
from odradek.server.config import KafkaConfig
from odradek.zk.errors import ClientClosedError, ConnectionLossError
from odradek.zk.znodes import BrokerIdZNode
from tests.fakes.controller_zk import FakeZooKeeper


def test_a_failed_pass_runs_again_without_a_new_request() -> None:
    runs: list[str] = []

    async def work() -> None:
        runs.append("run")
        if len(runs) < 3:
            raise ConnectionLossError("connection loss")

    async def scenario() -> None:
        coalescer = Coalescer(work, "test", retry_backoff_s=0.01, max_retry_backoff_s=0.02)
        coalescer.request()
        await asyncio.wait_for(coalescer.wait_idle(), 5)

    asyncio.run(scenario())
    assert runs == ["run", "run", "run"]


def test_requests_during_a_run_make_exactly_one_more() -> None:
    runs = 0
    release = asyncio.Event()

    async def scenario() -> int:
        nonlocal runs

        async def work() -> None:
            nonlocal runs
            runs += 1
            if runs == 1:
                await release.wait()

        coalescer = Coalescer(work, "test")
        coalescer.request()
        await asyncio.sleep(0)
        for _ in range(5):
            coalescer.request()
        release.set()
        await asyncio.wait_for(coalescer.wait_idle(), 5)
        return runs

    assert asyncio.run(scenario()) == 2


def test_cancel_stops_a_pass_that_keeps_failing() -> None:
    async def work() -> None:
        raise ConnectionLossError("connection loss")

    async def scenario() -> None:
        coalescer = Coalescer(work, "test", retry_backoff_s=0.01)
        coalescer.request()
        await asyncio.sleep(0.05)
        coalescer.cancel()
        await asyncio.sleep(0)
        assert coalescer._task is not None and coalescer._task.done()

    asyncio.run(scenario())


class _FlakyClient:
    """A session whose next `get_children` fails with a connection loss, once."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.fail_next_children = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def get_children(self, path: str, watch: Any = None) -> list[str]:
        if self.fail_next_children:
            self.fail_next_children = False
            raise ConnectionLossError("connection loss")
        return await self._client.get_children(path, watch)


def _register(tree: FakeZooKeeper, broker_id: int) -> int:
    session = tree.client()
    tree.create(
        BrokerIdZNode.path(broker_id), b"{}", ephemeral_owner=session.session_id, makepath=True
    )
    stat = tree.exists(BrokerIdZNode.path(broker_id))
    assert stat is not None
    return int(stat.czxid)


def test_live_broker_epochs_recover_from_a_pass_lost_to_a_connection_loss() -> None:
    tree = FakeZooKeeper()
    first = _register(tree, 1)
    config = KafkaConfig({"broker.id": "1", "zookeeper.connect": "z:2181"})

    async def scenario() -> dict[int, int]:
        security = BrokerSecurity(config, lambda: first)
        client = _FlakyClient(tree.client())
        await security.start(client)  # type: ignore[arg-type]
        assert security.live_broker_epochs == {1: first}
        client.fail_next_children = True
        second = _register(tree, 2)  # the watch fires; its pass fails
        deadline = asyncio.get_running_loop().time() + 5
        while security.live_broker_epochs.get(2) != second:
            assert asyncio.get_running_loop().time() < deadline, security.live_broker_epochs
            await asyncio.sleep(0.05)
        third = _register(tree, 3)  # the retried pass re-armed the watch
        while security.live_broker_epochs.get(3) != third:
            assert asyncio.get_running_loop().time() < deadline, security.live_broker_epochs
            await asyncio.sleep(0.05)
        await security.close()
        return security.live_broker_epochs

    assert set(asyncio.run(scenario())) == {1, 2, 3}


def test_a_fetch_naming_an_unseen_epoch_makes_the_leader_look_again() -> None:
    tree = FakeZooKeeper()
    first = _register(tree, 1)
    config = KafkaConfig({"broker.id": "1", "zookeeper.connect": "z:2181"})

    async def scenario() -> None:
        security = BrokerSecurity(config, lambda: first)
        client = tree.client()
        await security.start(client)  # type: ignore[arg-type]
        # The watch is gone (as after a lost event): only a refresh can show broker 2.
        tree.expire_session(client.session_id)
        client.renew()
        second = _register(tree, 2)
        assert 2 not in security.live_broker_epochs
        security.refresh_broker_epochs()
        deadline = asyncio.get_running_loop().time() + 5
        while security.live_broker_epochs.get(2) != second:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        # Rate-limited: a second refresh within the interval reads nothing.
        tree.expire_session(client.session_id)  # the re-armed watch goes again
        client.renew()
        third = _register(tree, 3)
        security.refresh_broker_epochs()
        await asyncio.sleep(0.1)
        assert 3 not in security.live_broker_epochs
        assert third > second
        await security.close()

    asyncio.run(scenario())


def test_a_closed_client_ends_the_retries() -> None:
    runs = 0

    async def work() -> None:
        nonlocal runs
        runs += 1
        raise ClientClosedError("closed")

    async def scenario() -> None:
        coalescer = Coalescer(work, "test", retry_backoff_s=0.01)
        coalescer.request()
        await asyncio.wait_for(coalescer.wait_idle(), 5)

    asyncio.run(scenario())
    assert runs == 1
