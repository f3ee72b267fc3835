"""A broker's start-up steps that talk to ZooKeeper, when the session expires under them.

Soak run 15 (seed 909955276, round 8): a restarted broker exited at start-up with a
SessionExpiredError from the credential store's `create('/config/users', makepath=True)`: a
ZooKeeper quorum loss outlived its first session. Kafka's broker retries its requests in the new
session (`KafkaZkClient.retryRequestsUntilConnected`); the registration already did
(tests/unit/test_broker_registration.py), and now every start-up step that loads state from
ZooKeeper does (`BrokerZk._in_a_session`). Each step runs again whole, so the stores an earlier
attempt made reload rather than being made twice, and their watches are armed in the new session.

A new session also loses every watch of a cache loaded before it: topic configs now re-read and
re-watch (`TopicConfigs.resync`) like the security and quota caches.

The in-memory ZooKeeper of tests/fakes plays the server; what is tested is the retry rule.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from odradek.errors import OperatorError
from odradek.security.scram import ScramMechanism, scram_configs_from_add_config
from odradek.security.znodes import UserConfigZNode
from odradek.server.admin.topic_configs import TopicConfigs
from odradek.server.broker_security import BrokerSecurity
from odradek.server.broker_zk import STARTUP_SESSION_ATTEMPTS, BrokerZk
from odradek.server.config import KafkaConfig
from odradek.server.quota.broker_quotas import BrokerQuotas
from odradek.zk.errors import SessionExpiredError
from odradek.zk.znodes import (
    ConfigChangeNotificationSequenceZNode,
    TopicConfigZNode,
)
from tests.fakes.controller_zk import FakeZkClient, FakeZooKeeper
from tests.unit.security.test_credential_store import authenticates

SHA512 = ScramMechanism.SCRAM_SHA_512


class ExpiresUnderCreate:
    """A session on the fake tree that expires under its first `expiries` creates of `path`; a
    new session opens `reconnect_s` later (until then the client is not connected)."""

    connect_string = "zookeeper.invalid:2181"

    def __init__(self, tree: FakeZooKeeper, path: str, expiries: int = 1) -> None:
        self._client = FakeZkClient(tree)
        self.tree = tree
        self.path = path
        self.expiries = expiries
        self.reconnect_s = 0.2
        self.creates_while_disconnected = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    @property
    def session_id(self) -> int:
        return self._client.session_id

    @property
    def connected(self) -> bool:
        return self._client.connected

    async def create(self, path: str, data: bytes = b"", **kwargs: Any) -> str:
        if not self._client.connected:
            self.creates_while_disconnected += 1
        if path == self.path and self.expiries > 0:
            self.expiries -= 1
            self.tree.expire_session(self._client.session_id)
            self._client.connected = False
            asyncio.get_running_loop().call_later(self.reconnect_s, self._reconnect)
            raise SessionExpiredError(path)
        return await self._client.create(path, data, **kwargs)

    def _reconnect(self) -> None:
        self._client.renew()
        self._client.connected = True


def starting_broker(zk: Any) -> Any:
    broker = SimpleNamespace(
        config=SimpleNamespace(zookeeper_connection_timeout_ms=5000),
        broker_id=3,
        _zk=zk,
    )
    broker._wait_for_session = lambda *a: BrokerZk._wait_for_session(broker, *a)
    return broker


def announce(tree: FakeZooKeeper, entity_type: str, name: str) -> None:
    tree.create(
        "/config/changes/config_change_",
        ConfigChangeNotificationSequenceZNode.encode(entity_type, name),
        sequence=True,
    )


async def wait_until(condition: Any, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + 5
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"not within 5 s: {what}"
        await asyncio.sleep(0.02)


def test_soak_a_session_expiry_under_the_credential_stores_set_up_loads_in_the_new_session() -> (
    None
):
    tree = FakeZooKeeper()
    bob = scram_configs_from_add_config("SCRAM-SHA-512=[iterations=4096,password=bob-pw]")
    tree.create("/config/users/bob", UserConfigZNode.encode(bob), makepath=True)
    config = KafkaConfig({"broker.id": "3", "zookeeper.connect": "z:2181"})
    # /config/users exists: the create that expires is the notification parent's, the first one.
    zk = ExpiresUnderCreate(tree, "/config/changes")
    broker = starting_broker(zk)

    async def scenario() -> None:
        security = BrokerSecurity(config, lambda: -1)
        quotas = BrokerQuotas(config, 3)

        async def load() -> None:
            await security.start(zk)  # type: ignore[arg-type]
            await quotas.start(zk)  # type: ignore[arg-type]

        first_session = zk.session_id
        await asyncio.wait_for(
            BrokerZk._in_a_session(broker, "load its state", "loading state", load), 10
        )
        assert zk.expiries == 0 and zk.session_id != first_session
        assert zk.creates_while_disconnected == 0, "a retry before the new session opened"
        assert authenticates(security.credentials, SHA512, "bob", "bob-pw")
        # The watch is armed in the new session: a credential written now is heard.
        alice = scram_configs_from_add_config("SCRAM-SHA-512=[iterations=4096,password=al-pw]")
        tree.create("/config/users/alice", UserConfigZNode.encode(alice))
        announce(tree, "users", "alice")
        await wait_until(
            lambda: authenticates(security.credentials, SHA512, "alice", "al-pw"),
            "the credential written after the new session",
        )
        assert tree.watch_count(first_session) == 0
        await security.close()
        quotas.close()

    asyncio.run(scenario())


def test_a_session_that_expires_under_every_attempt_ends_the_startup_in_one_line() -> None:
    tree = FakeZooKeeper()
    zk = ExpiresUnderCreate(tree, "/config/changes", expiries=STARTUP_SESSION_ATTEMPTS)
    zk.reconnect_s = 0.01
    broker = starting_broker(zk)
    config = KafkaConfig({"broker.id": "3", "zookeeper.connect": "z:2181"})

    async def scenario() -> None:
        security = BrokerSecurity(config, lambda: -1)

        async def load() -> None:
            await security.start(zk)  # type: ignore[arg-type]

        await BrokerZk._in_a_session(broker, "load its state from ZooKeeper", "loading", load)

    with pytest.raises(OperatorError) as raised:
        asyncio.run(asyncio.wait_for(scenario(), 10))
    assert str(raised.value) == (
        "broker 3: the ZooKeeper session expired during each of 5 attempts to load its state "
        "from ZooKeeper"
    )


def test_topic_configs_changed_while_the_session_was_lost_apply_after_resync() -> None:
    tree = FakeZooKeeper()
    tree.create(
        TopicConfigZNode.path("t"), TopicConfigZNode.encode({"retention.ms": "1000"}), makepath=True
    )
    client = tree.client()
    changes: list[tuple[str, dict[str, str]]] = []

    async def scenario() -> None:
        configs = TopicConfigs(client, lambda topic, c: changes.append((topic, c)))  # type: ignore[arg-type]
        await configs.start()
        await configs.ensure_loaded(["t"])
        assert configs.get("t") == {"retention.ms": "1000"}
        tree.expire_session(client.session_id)  # its watch goes with the session
        client.renew()
        tree.set(TopicConfigZNode.path("t"), TopicConfigZNode.encode({"retention.ms": "2000"}))
        announce(tree, "topics", "t")
        await asyncio.sleep(0.05)
        assert changes == []  # nobody heard it
        await configs.resync()
        assert configs.get("t") == {"retention.ms": "2000"}
        assert changes == [("t", {"retention.ms": "2000"})]
        # ... and the watch is armed again, in the new session.
        tree.set(TopicConfigZNode.path("t"), TopicConfigZNode.encode({"retention.ms": "3000"}))
        announce(tree, "topics", "t")
        await wait_until(lambda: configs.get("t") == {"retention.ms": "3000"}, "the next change")

    asyncio.run(scenario())
