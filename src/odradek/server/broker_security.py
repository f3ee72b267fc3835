"""The broker's security components and the ZooKeeper views they keep (issue 14).

`BrokerSecurity` owns, for one broker:

* `authorizer` — the `RequestAuthorizer` every handler asks (`odradek.server.authorization`),
  backed by an `AclAuthorizer` when `authorizer.class.name` names Kafka's ZooKeeper authorizer;
* `acl_store` — keeps the authorizer's ACL cache equal to `/kafka-acl*` (change notifications), and
  writes CreateAcls/DeleteAcls; None without an authorizer;
* `credential_store` — SCRAM credentials from `/config/users` (always: SCRAM listeners and the
  SCRAM admin APIs need it);
* `controller_validator` — checks controller requests against ZooKeeper
  (`odradek.security.controller_requests`). It reads `/controller_epoch`, then `/controller`,
  after a `sync`: in that order a concurrent election can only make the pair look older than it
  is, which costs a re-read, never acceptance of a deposed controller. It learns the current
  controller from a watch on `/controller` (same reads) and from this broker's own election;
* `live_broker_epochs` — every registered broker's epoch (the czxid of `/brokers/ids/<id>`), from a
  watch on `/brokers/ids`: what a follower fetch's broker epoch is checked against.

`zookeeper_identity` finds the broker's own ZooKeeper credentials (a JAAS `Client` section) for
`zookeeper.set.acl` (`odradek.zk.acls`).

Start-up order (`start`, called once ZooKeeper is connected and before the broker listens): the
credentials and ACLs are loaded first, so that the first connection is authenticated and authorized
against the real data; then the two watches. After a ZooKeeper session expiry every watch is gone:
`resync` (on the next CONNECTED) reloads everything and re-arms them.

Concurrency: the broker's event loop; ZooKeeper watch callbacks only schedule a pass (`Coalescer`).
"""

from __future__ import annotations

import logging
import os
import shlex
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from odradek.errors import ConfigError
from odradek.security.acl_store import AclStore
from odradek.security.authorizer import AclAuthorizer, AclCache
from odradek.security.controller_requests import ControllerEpochValidator, ControllerView
from odradek.security.credential_store import CredentialCache, CredentialStore
from odradek.security.jaas import parse_jaas_file, zookeeper_credentials
from odradek.security.notifications import Coalescer
from odradek.server.authorization import RequestAuthorizer
from odradek.server.config import KafkaConfig
from odradek.zk.acls import ZkCredentials
from odradek.zk.client import ZkClient
from odradek.zk.errors import InvalidZNodeDataError, NoNodeError
from odradek.zk.znodes import BrokerIdsZNode, BrokerIdZNode, ControllerEpochZNode, ControllerZNode

log = logging.getLogger(__name__)

EPOCH_REFRESH_INTERVAL_S = 1.0

NO_CONTROLLER = -1


def _system_property(name: str, environ: Mapping[str, str]) -> str | None:
    """`-Dname=value` from KAFKA_OPTS, as a Kafka broker's JVM would see it."""
    for option in shlex.split(environ.get("KAFKA_OPTS", "")):
        if option.startswith(f"-D{name}="):
            return option.split("=", 1)[1]
    return None


def _credentials_from_file(path: str, section: str) -> ZkCredentials | None:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read the JAAS file {path}: {e.strerror or e}") from None
    found = zookeeper_credentials(parse_jaas_file(text), section)
    return ZkCredentials(*found) if found is not None else None


def environment_zookeeper_identity(
    environ: Mapping[str, str] = os.environ,
) -> ZkCredentials | None:
    """ZooKeeper credentials for a tool (`odradek configs --zookeeper`): the JAAS file of
    `-Djava.security.auth.login.config=` in KAFKA_OPTS, as Kafka's tools find it."""
    path = _system_property("java.security.auth.login.config", environ)
    if not path:
        return None
    section = _system_property("zookeeper.sasl.clientconfig", environ) or "Client"
    return _credentials_from_file(path, section)


def zookeeper_identity(
    config: KafkaConfig, environ: Mapping[str, str] = os.environ
) -> ZkCredentials | None:
    """The broker's ZooKeeper credentials: the `Client` section (`zookeeper.sasl.clientconfig`)
    of the JAAS file named by `java.security.auth.login.config` (server.properties, or
    `-Djava.security.auth.login.config=` in KAFKA_OPTS), used with ZooKeeper's digest scheme
    (`odradek.zk.acls`). None without one; ConfigError when `zookeeper.set.acl=true` has none."""
    path = config["java.security.auth.login.config"] or _system_property(
        "java.security.auth.login.config", environ
    )
    section = (
        _system_property("zookeeper.sasl.clientconfig", environ)
        or config["zookeeper.sasl.clientconfig"]
    )
    credentials = _credentials_from_file(path, section) if path else None
    if config["zookeeper.set.acl"] and credentials is None:
        raise ConfigError(
            "zookeeper.set.acl is true, but no ZooKeeper credentials are configured: a JAAS file "
            f"(java.security.auth.login.config) with a {section} section naming "
            "org.apache.zookeeper.server.auth.DigestLoginModule with username and password"
        )
    return credentials


class BrokerSecurity:
    def __init__(self, config: KafkaConfig, broker_epoch: Any) -> None:
        """`broker_epoch()` is this broker's current epoch (-1 before it registers)."""
        self.config = config
        self.broker_id = config.broker_id
        self._broker_epoch = broker_epoch
        self.credentials = CredentialCache()
        self.acl_cache = AclCache()
        authorizer = (
            AclAuthorizer.from_properties(config.originals, self.acl_cache)
            if config.authorizer_enabled
            else None
        )
        self.authorizer = RequestAuthorizer(authorizer)
        self.acl_store: AclStore | None = None
        self.credential_store: CredentialStore = None  # type: ignore[assignment]
        self.live_broker_epochs: dict[int, int] = {}
        self.controller_validator = ControllerEpochValidator(
            self._read_controller, self._read_own_broker_epoch, broker_epoch
        )
        self._zk: ZkClient | None = None
        self._brokers_pass = Coalescer(self._read_broker_epochs, "broker-epochs")
        self._controller_pass = Coalescer(self._read_controller_view, "controller-view")
        self._last_epoch_refresh = -EPOCH_REFRESH_INTERVAL_S

    async def start(self, zk: ZkClient) -> None:
        """Load the caches and arm their watches. Called again when an attempt was cut short by
        a ZooKeeper session expiry or connection loss (`BrokerZk._in_a_session`): the stores an
        earlier attempt made reload rather than being made twice."""
        self._zk = zk
        if self.credential_store is None:
            self.credential_store = CredentialStore(zk, self.credentials)
            await self.credential_store.start()
        else:
            await self.credential_store.resync()
        if self.authorizer.enabled:
            if self.acl_store is None:
                self.acl_store = AclStore(zk, self.acl_cache)
                await self.acl_store.start()
            else:
                await self.acl_store.resync()
        await self._read_broker_epochs()
        await self._read_controller_view()

    async def resync(self) -> None:
        """After a new ZooKeeper session: reload everything, re-arm every watch."""
        log.info("reloading SCRAM credentials, ACLs and broker epochs after a new session")
        await self.credential_store.resync()
        if self.acl_store is not None:
            await self.acl_store.resync()
        await self._read_broker_epochs()
        await self._read_controller_view()

    async def close(self) -> None:
        self._brokers_pass.cancel()
        self._controller_pass.cancel()
        if self.credential_store is not None:
            self.credential_store.close()
        if self.acl_store is not None:
            await self.acl_store.close()

    def refresh_broker_epochs(self) -> None:
        """A follower fetched with a broker epoch newer than the one we know (or for a broker we
        do not know as live): re-read `/brokers/ids` -- at most once per
        EPOCH_REFRESH_INTERVAL_S, since a fetch arrives many times a second and the epoch it
        names is only trusted once ZooKeeper shows it. Normally the watch has already done this;
        this is the safety net for a watch event lost to a connection loss."""
        now = time.monotonic()
        if now - self._last_epoch_refresh < EPOCH_REFRESH_INTERVAL_S:
            return
        self._last_epoch_refresh = now
        self._brokers_pass.request()

    def on_elected(self, controller_id: int, epoch: int) -> None:
        """This broker won the election: the exact view, without ZooKeeper."""
        self.controller_validator.observe(ControllerView(controller_id, epoch))

    # watches: the same bound method every time, so ZooKeeper holds each watch once

    def _on_controller_change(self, _event: Any) -> None:
        self._controller_pass.request()

    def _on_brokers_change(self, _event: Any) -> None:
        self._brokers_pass.request()

    # ZooKeeper reads

    @property
    def zk(self) -> ZkClient:
        if self._zk is None:
            from odradek.errors import InvariantError

            raise InvariantError("BrokerSecurity used before start()")
        return self._zk

    async def _controller_epoch(self) -> int:
        try:
            data, stat = await self.zk.get(ControllerEpochZNode.path())
            return ControllerEpochZNode.decode(data, stat.version).epoch
        except NoNodeError:
            return 0

    async def _controller_id(self, watch: Any = None) -> int:
        stat = await self.zk.exists(ControllerZNode.path(), watch)
        if stat is None:
            return NO_CONTROLLER
        try:
            data, stat = await self.zk.get(ControllerZNode.path())
            return ControllerZNode.decode(data, stat.version).broker_id
        except (NoNodeError, InvalidZNodeDataError):
            return NO_CONTROLLER

    async def _read_controller(self) -> ControllerView:
        """For the validator: ZooKeeper's pair after a sync (epoch first: module docstring)."""
        await self.zk.sync("/")
        epoch = await self._controller_epoch()
        return ControllerView(await self._controller_id(), epoch)

    async def _read_own_broker_epoch(self) -> int:
        await self.zk.sync("/")
        stat = await self.zk.exists(BrokerIdZNode.path(self.broker_id))
        return int(stat.czxid) if stat is not None else -1

    async def _read_controller_view(self) -> None:
        epoch = await self._controller_epoch()
        controller = await self._controller_id(self._on_controller_change)
        self.controller_validator.observe(ControllerView(controller, epoch))

    async def _read_broker_epochs(self) -> None:
        children = await self.zk.get_children(BrokerIdsZNode.path(), self._on_brokers_change)
        epochs: dict[int, int] = {}
        for child in children:
            try:
                broker_id = int(child)
            except ValueError:
                continue
            stat = await self.zk.exists(BrokerIdZNode.path(broker_id))
            if stat is not None:
                epochs[broker_id] = int(stat.czxid)
        self.live_broker_epochs.clear()
        self.live_broker_epochs.update(epochs)
        log.debug("live broker epochs: %s", epochs)
