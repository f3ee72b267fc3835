"""A broker's registration at start-up (`BrokerZk._register_broker`) while an earlier
incarnation's `/brokers/ids/<id>` still lives.

The soak found it (round seed 822689643): a broker the nemesis restarted found its old
registration, waited, and gave up ("already registered ... by another broker") while ZooKeeper
was paused, although no session can expire while ZooKeeper does not serve. Only the time the
broker is connected counts towards giving up now. A stub stands in for ZooKeeper: what is tested
is the waiting rule, not ZooKeeper.

Issue 19: a restarted broker whose previous process died with its session open closes that
session and registers at once, when the registration's owner is the session its previous process
recorded and it holds every log directory that process held; otherwise it waits as before. A
corrupt or unreadable session record is ignored with a warning. Here on the in-memory ZooKeeper of
tests/fakes; with real processes in tests/integration/test_broker_restart.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from odradek.errors import OperatorError
from odradek.server import session_reclaim
from odradek.server.broker_zk import STARTUP_SESSION_ATTEMPTS, BrokerZk
from odradek.server.session_reclaim import (
    SESSION_FILE,
    RecordedSession,
    read_session_records,
    reclaimable,
    record_session,
    write_session_record,
)
from odradek.zk.errors import (
    ConnectionLossError,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from odradek.zk.znodes import BrokerIdZNode, ControllerZNode
from tests.fakes.controller_zk import FakeZkClient, FakeZooKeeper

OLD_SESSION, OUR_SESSION = 1, 2
SESSION_TIMEOUT_MS = 100  # the broker gives up after 0.1 + 5 s of connected waiting


class HeldRegistration:
    """`/brokers/ids/<id>` owned by `owner` (None: absent); `connected` as the client sees it."""

    session_id = OUR_SESSION
    session_password = bytes(16)
    connect_string = "zookeeper.invalid:2181"

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

    async def get_or_none(self, path: str) -> tuple[bytes, Any] | None:
        return await self.get(path) if self.owner is not None else None


class Config(dict[str, Any]):
    advertised_listeners: list[Any] = []
    zookeeper_connection_timeout_ms = 5000


def registering_broker(zk: Any, log_dirs: list[Path] | None = None, reclaim: bool = True) -> Any:
    broker = SimpleNamespace(
        config=Config(
            {
                "zookeeper.session.timeout.ms": SESSION_TIMEOUT_MS,
                "broker.rack": None,
                "zookeeper.session.reclaim.enable": reclaim,
            }
        ),
        broker_id=3,
        socket_servers=[],
        registered=asyncio.Event(),
        broker_epoch=-1,
        _zk=zk,
        _log_manager=SimpleNamespace(live_log_dirs=log_dirs or []),
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


class ExpiringOnCreate(HeldRegistration):
    """No old registration; the session expires under the first `expiries` creates."""

    def __init__(self, expiries: int) -> None:
        super().__init__()
        self.owner = None
        self.expiries = expiries

    async def create(self, path: str, data: bytes, ephemeral: bool = False) -> None:
        if self.expiries > 0:
            self.expiries -= 1
            self.session_id += 1  # the client's next session (kazoo opens one after an expiry)
            raise SessionExpiredError(path)
        await super().create(path, data, ephemeral)


def test_soak_session_expired_during_startup_registration_registers_in_the_new_session() -> None:
    """The soak (seed 436106115's round) found a broker that exited at start-up with a
    SessionExpiredError from `/brokers/ids/<id>`: a quorum loss outlived its first session
    while it registered. Kafka's broker retries in the new session; so does Odradek now."""
    zk = ExpiringOnCreate(expiries=2)
    broker = registering_broker(zk, reclaim=False)
    broker._register_broker = lambda: BrokerZk._register_broker(broker)
    broker._wait_for_session = lambda *a: BrokerZk._wait_for_session(broker, *a)
    broker._in_a_session = lambda *a: BrokerZk._in_a_session(broker, *a)
    asyncio.run(asyncio.wait_for(BrokerZk._register_at_startup(broker), timeout=30))
    assert zk.owner == OUR_SESSION
    assert broker.registered.is_set() and broker.broker_epoch == 7


def test_a_registration_after_an_expiry_waits_for_the_new_session() -> None:
    """The soak's next run: the five attempts were spent within a millisecond, each failing at
    once with the expiry because the client had no new session yet."""

    class Reconnecting(ExpiringOnCreate):
        async def create(self, path: str, data: bytes, ephemeral: bool = False) -> None:
            assert self.connected, "a registration attempt while no session is open"
            if self.expiries > 0:
                self.connected = False
                asyncio.get_running_loop().call_later(0.3, setattr, self, "connected", True)
            await super().create(path, data, ephemeral)

    zk = Reconnecting(expiries=1)
    broker = registering_broker(zk, reclaim=False)
    broker._register_broker = lambda: BrokerZk._register_broker(broker)
    broker._wait_for_session = lambda *a: BrokerZk._wait_for_session(broker, *a)
    broker._in_a_session = lambda *a: BrokerZk._in_a_session(broker, *a)
    asyncio.run(asyncio.wait_for(BrokerZk._register_at_startup(broker), timeout=30))
    assert zk.owner == OUR_SESSION and broker.registered.is_set()


def test_soak_a_connection_lost_under_the_startup_registration_registers_once_connected() -> None:
    """Soak run 8, round 5: broker 2 exited at start-up with ConnectionLossError at
    /brokers/ids/2 (ZooKeeper answered nothing past the client's deadline; the session lived).
    Kafka's broker waits for the connection and retries. The create had landed before the loss:
    the retry finds the registration is ours."""

    class LandedThenLost(HeldRegistration):
        def __init__(self) -> None:
            super().__init__()
            self.owner = None
            self.losses = 1

        async def create(self, path: str, data: bytes, ephemeral: bool = False) -> None:
            assert self.connected, "a registration attempt while disconnected"
            await super().create(path, data, ephemeral)
            if self.losses > 0:
                self.losses -= 1
                self.connected = False
                asyncio.get_running_loop().call_later(0.3, setattr, self, "connected", True)
                raise ConnectionLossError(path)

    zk = LandedThenLost()
    broker = registering_broker(zk, reclaim=False)
    broker._register_broker = lambda: BrokerZk._register_broker(broker)
    broker._wait_for_session = lambda *a: BrokerZk._wait_for_session(broker, *a)
    broker._in_a_session = lambda *a: BrokerZk._in_a_session(broker, *a)
    asyncio.run(asyncio.wait_for(BrokerZk._register_at_startup(broker), timeout=30))
    assert zk.losses == 0 and zk.owner == OUR_SESSION
    assert broker.registered.is_set() and broker.broker_epoch == 7


def test_a_session_that_expires_under_every_registration_attempt_ends_the_startup() -> None:
    zk = ExpiringOnCreate(expiries=STARTUP_SESSION_ATTEMPTS)
    broker = registering_broker(zk, reclaim=False)
    broker._register_broker = lambda: BrokerZk._register_broker(broker)
    broker._wait_for_session = lambda *a: BrokerZk._wait_for_session(broker, *a)
    broker._in_a_session = lambda *a: BrokerZk._in_a_session(broker, *a)
    with pytest.raises(OperatorError, match="expired during each of 5 attempts"):
        asyncio.run(asyncio.wait_for(BrokerZk._register_at_startup(broker), timeout=30))
    assert zk.owner is None and not broker.registered.is_set()


# ---------------------------------------------------------------------------------------------
# Reclaiming the registration of our own previous process (`odradek.server.session_reclaim`)
#
# The in-memory ZooKeeper of tests/fakes plays the server: the previous process is a session
# that created the registration (and `/controller`) and was never closed. Closing a session from
# another connection is played by `tree.expire_session`, behind the password check ZooKeeper does.


def password_of(session_id: int) -> bytes:
    return session_id.to_bytes(16, "big")


class BrokerSession(FakeZkClient):
    """A broker's session on the fake tree, with the part of ZkClient reclaiming uses; it
    counts the registrations ZooKeeper refused because the node existed (each one a wait)."""

    connect_string = "fake-zookeeper:2181"
    connected = True
    refused_creates = 0

    async def create(self, path: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().create(path, *args, **kwargs)
        except NodeExistsError:
            self.refused_creates += 1
            raise

    @property
    def session_password(self) -> bytes:
        return password_of(self.session_id)


class SessionCloser:
    """Stands in for `close_session`: ZooKeeper's answers, and a log of what was asked."""

    def __init__(self, tree: FakeZooKeeper) -> None:
        self.tree = tree
        self.calls: list[int] = []
        self.unreachable = False

    async def __call__(
        self, connect_string: str, session_id: int, password: bytes, *, timeout_s: float
    ) -> bool:
        self.calls.append(session_id)
        if self.unreachable:
            raise ConnectionLossError("no ZooKeeper server answered")
        if session_id in self.tree.expired_sessions or password != password_of(session_id):
            return False
        self.tree.expire_session(session_id)
        return True


@pytest.fixture
def tree() -> FakeZooKeeper:
    return FakeZooKeeper()


@pytest.fixture
def closer(tree: FakeZooKeeper, monkeypatch: pytest.MonkeyPatch) -> SessionCloser:
    fake = SessionCloser(tree)
    monkeypatch.setattr(session_reclaim, "close_session", fake)
    return fake


def previous_process(tree: FakeZooKeeper, log_dirs: list[Path], *, controller: bool) -> int:
    """A broker 3 process that registered (recording its session first) and was SIGKILLed:
    its session stays open. Returns the session id."""
    zk = BrokerSession(tree)
    record_session(zk, 3, log_dirs)
    tree.create(BrokerIdZNode.path(3), b"{}", ephemeral_owner=zk.session_id)
    if controller:
        tree.create(ControllerZNode.path(), b'{"brokerid":3}', ephemeral_owner=zk.session_id)
    return zk.session_id


async def register(broker: Any) -> None:
    await asyncio.wait_for(BrokerZk._register_broker(broker), timeout=30)


def test_a_restart_closes_its_previous_session_and_registers_at_once(
    tree: FakeZooKeeper, closer: SessionCloser, tmp_path: Path
) -> None:
    log_dirs = [tmp_path / "a", tmp_path / "b"]
    for d in log_dirs:
        d.mkdir()
    old_session = previous_process(tree, log_dirs, controller=True)
    old_epoch = tree.get(BrokerIdZNode.path(3))[1].czxid
    zk = BrokerSession(tree)
    broker = registering_broker(zk, log_dirs)

    asyncio.run(register(broker))

    assert zk.refused_creates == 0  # registered at the first try: no wait for the old session
    assert closer.calls == [old_session]
    _, stat = tree.get(BrokerIdZNode.path(3))
    assert stat.ephemeralOwner == zk.session_id
    assert broker.broker_epoch == stat.czxid > old_epoch
    # Every ephemeral of the dead process went with its session: a new election can start.
    assert tree.exists(ControllerZNode.path()) is None
    # Our own session is recorded for our successor, readable by us only.
    path = log_dirs[0] / SESSION_FILE
    assert stat_mode(path) == 0o600
    (record,) = read_session_records(log_dirs, 3)
    assert (record.session_id, record.password) == (zk.session_id, zk.session_password)
    assert record.log_dirs == tuple(str(d) for d in log_dirs)


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_session_that_expired_meanwhile_is_not_an_error(
    tree: FakeZooKeeper, closer: SessionCloser, tmp_path: Path
) -> None:
    old_session = previous_process(tree, [tmp_path], controller=False)
    zk = BrokerSession(tree)
    broker = registering_broker(zk, [tmp_path])
    original = tree.get

    def expires_right_after_the_read(path: str) -> Any:
        result = original(path)
        if old_session not in tree.expired_sessions:
            tree.expire_session(old_session)  # between our read and our close
        return result

    tree.get = expires_right_after_the_read  # type: ignore[method-assign]
    asyncio.run(register(broker))
    assert closer.calls == [old_session]
    assert tree.get(BrokerIdZNode.path(3))[1].ephemeralOwner == zk.session_id


def test_a_registration_held_by_another_process_is_left_alone(
    tree: FakeZooKeeper, closer: SessionCloser, tmp_path: Path
) -> None:
    """Two processes with broker.id 3 (an operator mistake): the other's session is not in our
    records, so nothing is closed, and we give up as before, with one line."""
    previous_process(tree, [tmp_path], controller=False)  # our own previous, long gone
    other = BrokerSession(tree)
    tree.expire_session(tree.get(BrokerIdZNode.path(3))[1].ephemeralOwner)
    tree.create(BrokerIdZNode.path(3), b"{}", ephemeral_owner=other.session_id)
    broker = registering_broker(BrokerSession(tree), [tmp_path])

    with pytest.raises(OperatorError, match="already registered"):
        asyncio.run(register(broker))
    assert closer.calls == []
    assert tree.get(BrokerIdZNode.path(3))[1].ephemeralOwner == other.session_id


@pytest.mark.parametrize(
    "change",
    ["a directory of the previous process is not ours now", "ZooKeeper unreachable for the close"],
)
def test_when_it_may_not_or_cannot_close_it_waits_for_the_expiry(
    tree: FakeZooKeeper, closer: SessionCloser, tmp_path: Path, change: str
) -> None:
    log_dirs = [tmp_path / "a", tmp_path / "b"]
    for d in log_dirs:
        d.mkdir()
    old_session = previous_process(tree, log_dirs, controller=False)
    if change.startswith("a directory"):
        ours = log_dirs[:1]  # b failed at start-up (or is configured away): not locked by us
    else:
        ours = log_dirs
        closer.unreachable = True
    broker = registering_broker(BrokerSession(tree), ours)

    async def scenario() -> None:
        registering = asyncio.create_task(register(broker))
        await asyncio.sleep(0.3)  # let it reach its wait; nothing may happen meanwhile
        assert not registering.done()
        tree.expire_session(old_session)  # the timeout, much later
        await registering

    asyncio.run(scenario())
    assert closer.calls == ([] if change.startswith("a directory") else [old_session])
    assert broker.registered.is_set()


def test_a_re_registration_after_an_expiry_records_the_new_session_and_closes_nothing(
    tree: FakeZooKeeper, closer: SessionCloser, tmp_path: Path
) -> None:
    zk = BrokerSession(tree)
    broker = registering_broker(zk, [tmp_path])
    asyncio.run(register(broker))
    first = zk.session_id
    tree.expire_session(first)
    zk.renew()
    asyncio.run(register(broker))
    assert closer.calls == []
    assert [r.session_id for r in read_session_records([tmp_path], 3)] == [zk.session_id]
    assert zk.session_id != first


@pytest.mark.parametrize(
    "content",
    [
        "",
        "version=0\nbroker.id=3\nsession.id=0x1001\n",  # torn: cut after the session id
        "version=0\nbroker.id=3\nsession.id=0x1001\nsession.password=00ff",  # torn mid-line
        "version=7\nbroker.id=3\nsession.id=0x1001\nsession.password="
        + "0" * 32
        + "\nlog.dirs=/a\n",
        "version=0\nbroker.id=3\nsession.id=zzz\nsession.password=" + "0" * 32 + "\nlog.dirs=/a\n",
        "version=0\nbroker.id=3\nsession.id=0x1001\nsession.password=abcd\nlog.dirs=/a\n",
        "version=0\nbroker.id=3\nsession.id=0x1001\nsession.password=" + "0" * 32 + "\n",
        "version=0\nbroker.id=4\nsession.id=0x1001\nsession.password="
        + "0" * 32
        + "\nlog.dirs=/a\n",
        "\x00\x01binary\xff garbage\n",
    ],
)
def test_a_corrupt_or_foreign_session_record_is_ignored_with_a_warning(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / SESSION_FILE).write_bytes(content.encode("latin-1"))
    with caplog.at_level(logging.WARNING, logger=session_reclaim.__name__):
        assert read_session_records([tmp_path], 3) == []
    assert "ignoring" in caplog.text


def test_an_unreadable_session_record_is_ignored_and_the_broker_still_registers(
    tree: FakeZooKeeper, closer: SessionCloser, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The record's path is a directory: it can be neither read nor replaced. The broker warns,
    registers anyway, and (the old registration being someone else's for all it knows) waits."""
    (tmp_path / SESSION_FILE).mkdir()
    old = BrokerSession(tree)
    tree.create(BrokerIdZNode.path(3), b"{}", ephemeral_owner=old.session_id)
    broker = registering_broker(BrokerSession(tree), [tmp_path])

    async def scenario() -> None:
        registering = asyncio.create_task(register(broker))
        await asyncio.sleep(0.3)
        assert not registering.done()
        tree.expire_session(old.session_id)
        await registering

    with caplog.at_level(logging.WARNING, logger=session_reclaim.__name__):
        asyncio.run(scenario())
    assert broker.registered.is_set() and closer.calls == []
    assert f"ignoring {tmp_path / SESSION_FILE}" in caplog.text
    assert "cannot record ZooKeeper session" in caplog.text


def test_the_record_is_replaced_atomically_with_owner_only_permissions(tmp_path: Path) -> None:
    leftover = tmp_path / (SESSION_FILE + ".tmp")
    leftover.write_text("a temporary file a crash left behind")
    leftover.chmod(0o644)
    record = RecordedSession(3, 0x100008A5C2E0003, password_of(7), (str(tmp_path),))
    write_session_record(tmp_path, record)
    assert not leftover.exists()
    assert stat_mode(tmp_path / SESSION_FILE) == 0o600
    assert read_session_records([tmp_path], 3) == [record]
    assert RecordedSession.decode(record.encode()) == record


@pytest.mark.parametrize(
    ("owner", "recorded_dirs", "locked_dirs", "closes"),
    [
        (0x1001, ["/d1", "/d2"], ["/d1", "/d2"], True),
        (0x1001, ["/d1"], ["/d1", "/d2"], True),  # a directory added since: still ours
        (0x1001, ["/d1", "/d2"], ["/d1"], False),  # /d2 may still be locked by it
        (0x1001, ["/d1", "/d2"], [], False),
        (0x2002, ["/d1"], ["/d1"], False),  # another session holds the registration
        (0, ["/d1"], ["/d1"], False),  # not an ephemeral
    ],
)
def test_reclaimable(
    owner: int, recorded_dirs: list[str], locked_dirs: list[str], closes: bool
) -> None:
    record = RecordedSession(3, 0x1001, password_of(1), tuple(recorded_dirs))
    assert (reclaimable(owner, [record], locked_dirs) is record) is closes


def test_without_the_opt_in_nothing_is_closed_and_the_old_registration_is_waited_for(
    tree: FakeZooKeeper, closer: SessionCloser, tmp_path: Path
) -> None:
    """`zookeeper.session.reclaim.enable` is off by default (session_reclaim says why): the
    session is still recorded, but the previous process's registration is left to expire."""
    log_dirs = [tmp_path / "a"]
    log_dirs[0].mkdir()
    old_session = previous_process(tree, log_dirs, controller=False)
    zk = BrokerSession(tree)
    broker = registering_broker(zk, log_dirs, reclaim=False)

    with pytest.raises(OperatorError, match="already registered"):
        asyncio.run(register(broker))

    assert closer.calls == []
    assert tree.get(BrokerIdZNode.path(3))[1].ephemeralOwner == old_session
    (record,) = read_session_records(log_dirs, 3)
    assert record.session_id == zk.session_id
