"""An in-memory ZooKeeper, and the controller's ZooKeeper facade over it, for pure-logic tests.

This is the project's only ZooKeeper fake. It fakes ZooKeeper's *rules* rather than the answers of
individual calls: the controller's correctness rests on conditional writes on znode versions, on
all-or-nothing transactions fenced by the version of `/controller_epoch`, and on one-shot watches, so
the fake implements exactly those and the real `ControllerZk` (znode encoding, batching, per-partition
results) runs unchanged on top of it. `FakeControllerZk` is that facade plus the helpers a test needs
to play the other actors: brokers registering, admins creating and deleting topics, leaders changing
their ISR, another broker winning the controller election.

What the tree does, as ZooKeeper does:

* znodes carry data, a version (bumped by every set), a cversion (bumped by every child create or
  delete; sequential children get it as a `%010d` suffix), czxid / mzxid from one zxid counter (a
  broker's epoch is the czxid of its registration) and an ephemeral owner;
* create needs the parent (NoNodeError) and refuses an existing path (NodeExistsError) and children of
  ephemerals; set and delete are conditional on a version (-1: any) and fail with BadVersionError;
  delete of a znode with children fails with NotEmptyError;
* `multi` applies all of its ops or none and raises the error of the op that failed;
* `checked_multi` and `chunked_multi` (ZkClient's controller helpers) check the version of
  `/controller_epoch` first and raise ControllerMovedError when it moved, writing nothing: a deposed
  controller's writes never land. `chunked_multi` then applies each op on its own and reports each op's
  result or its own error (BadVersionError for a stale version, NodeExistsError for a state znode that
  exists), which is what the production helper's resend-the-survivors loop amounts to;
* watches are per session and one-shot: data watches (`get`, and `exists` also on a missing znode)
  fire CREATED / CHANGED / DELETED, child watches (`get_children`) fire CHILD when a child is created or
  deleted and DELETED when the znode itself goes. They fire synchronously once the operation or the
  whole transaction is done (the controller's callbacks only enqueue an event, so that is safe);
* sessions: `FakeZooKeeper.client()` opens one. `expire_session` deletes its ephemerals (firing the
  other sessions' watches), drops its watches and makes its calls raise SessionExpiredError until
  `FakeZkClient.renew()` opens a new session.

Not modelled: ACLs, chroots, connection loss (every call either happens or fails cleanly), the 1 MB
request limit, quotas.

For the tests' own checks the tree keeps `writes`, every change in commit order (path, data before and
after, whether it was a controller write fenced by the epoch check), and `on_next_fenced_write` runs a
callback just before the next fenced transaction applies, which is how a test makes a leader's ISR
write race the controller's.

Concurrency: single-threaded. Every method runs synchronously on the calling thread (the async ones
never suspend); watch callbacks run inside the call that triggered them.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kazoo.protocol.states import ZnodeStat

from odradek.controller.context import LeaderAndIsr, TopicPartition
from odradek.controller.controller_zk import ControllerZk
from odradek.zk.client import WatchCallback, WatchEvent, WatchEventKind, ZkClient
from odradek.zk.errors import (
    BadVersionError,
    ConnectionLossError,
    ControllerMovedError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
    ZkError,
    ZkOperationError,
)
from odradek.zk.ops import CheckOp, CreateOp, DeleteOp, SetDataOp, ZkOp
from odradek.zk.znodes import (
    BrokerIdsZNode,
    BrokerIdZNode,
    BrokerInfo,
    ControllerEpochZNode,
    ControllerZNode,
    DeleteTopicsTopicZNode,
    DeleteTopicsZNode,
    EndPoint,
    IsrChangeNotificationSequenceZNode,
    IsrChangeNotificationZNode,
    LogDirEventNotificationZNode,
    TopicConfigZNode,
    TopicPartitionStateZNode,
    TopicPartitionsZNode,
    TopicPartitionZNode,
    TopicsZNode,
    TopicZNode,
)
from odradek.zk.znodes import TopicPartition as ZkTopicPartition

ROOT = "/"
NO_SESSION = 0
ANY_VERSION = -1

# The persistent paths a Kafka cluster has once its first broker started.
STANDARD_PATHS = (
    BrokerIdsZNode.path(),
    TopicsZNode.path(),
    DeleteTopicsZNode.path(),
    IsrChangeNotificationZNode.path(),
    LogDirEventNotificationZNode.path(),
    "/config/topics",
    "/config/brokers",
    "/config/changes",
)


@dataclass(frozen=True, slots=True)
class ZNode:
    """One znode. Immutable: every change replaces it, so a transaction can stage on a copy."""

    data: bytes
    version: int
    cversion: int
    czxid: int
    mzxid: int
    ephemeral_owner: int
    children: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ZNodeWrite:
    """One committed change, for tests' checks. `before`/`after` are None for create/delete;
    `fenced` is true for writes made in a transaction that checked `/controller_epoch`."""

    zxid: int
    path: str
    before: bytes | None
    after: bytes | None
    version: int
    session_id: int
    fenced: bool


@dataclass(slots=True)
class _Watch:
    session_id: int
    callback: WatchCallback


def _parent(path: str) -> str:
    return posixpath.dirname(path) or ROOT


def _check_path(path: str) -> None:
    if not path.startswith("/") or (path != ROOT and path.endswith("/")) or "//" in path:
        raise ZkOperationError(f"bad path {path!r}", path=path)


class FakeZooKeeper:
    """The znode tree and its watches: the server side, shared by every session.

    Concurrency: one thread; each call completes (watch callbacks included) before it returns.
    """

    def __init__(self, *, standard_paths: bool = True) -> None:
        self._nodes: dict[str, ZNode] = {ROOT: ZNode(b"", 0, 0, 0, 0, NO_SESSION)}
        self._zxid = 0
        self._next_session = 0x1000
        self.expired_sessions: set[int] = set()
        self._data_watches: dict[str, list[_Watch]] = {}
        self._child_watches: dict[str, list[_Watch]] = {}
        self.writes: list[ZNodeWrite] = []
        self.fenced_transactions = 0
        self._fenced_write_hooks: list[Callable[[], None]] = []
        if standard_paths:
            for path in STANDARD_PATHS:
                self.create(path, makepath=True)

    # sessions

    def client(self) -> FakeZkClient:
        """A new session on this tree (ZkClient's API)."""
        return FakeZkClient(self)

    def new_session_id(self) -> int:
        self._next_session += 1
        return self._next_session

    def expire_session(self, session_id: int) -> None:
        """What ZooKeeper does when a session times out: its ephemerals go, its watches go."""
        self.expired_sessions.add(session_id)
        for table in (self._data_watches, self._child_watches):
            for path in list(table):
                table[path] = [w for w in table[path] if w.session_id != session_id]
        ephemerals = sorted(p for p, n in self._nodes.items() if n.ephemeral_owner == session_id)
        for path in ephemerals:
            self.delete(path)

    # reads (synchronous; FakeZkClient adds watches and session checks)

    def exists(self, path: str) -> ZnodeStat | None:
        node = self._nodes.get(path)
        return self._stat(node) if node is not None else None

    def get(self, path: str) -> tuple[bytes, ZnodeStat]:
        node = self._nodes.get(path)
        if node is None:
            raise NoNodeError(f"NoNodeError at {path}", path=path)
        return node.data, self._stat(node)

    def get_children(self, path: str) -> list[str]:
        if path not in self._nodes:
            raise NoNodeError(f"NoNodeError at {path}", path=path)
        return sorted(self._nodes[path].children)

    def paths(self) -> list[str]:
        return sorted(self._nodes)

    # writes (synchronous, unfenced: what brokers, leaders and admins do)

    def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral_owner: int = NO_SESSION,
        sequence: bool = False,
        makepath: bool = False,
        session_id: int = NO_SESSION,
    ) -> str:
        if makepath:
            missing = []
            parent = _parent(path)
            while parent not in self._nodes:
                missing.append(parent)
                parent = _parent(parent)
            for ancestor in reversed(missing):
                self.create(ancestor, session_id=session_id)
        results = self._commit(
            [CreateOp(path, data, ephemeral=ephemeral_owner != NO_SESSION, sequence=sequence)],
            session_id=ephemeral_owner or session_id,
            atomic=True,
        )
        return results[0]  # type: ignore[return-value]

    def set(
        self, path: str, data: bytes, version: int = ANY_VERSION, *, session_id: int = NO_SESSION
    ) -> ZnodeStat:
        results = self._commit([SetDataOp(path, data, version)], session_id=session_id, atomic=True)
        return results[0]  # type: ignore[return-value]

    def delete(
        self,
        path: str,
        version: int = ANY_VERSION,
        *,
        recursive: bool = False,
        session_id: int = NO_SESSION,
    ) -> None:
        if recursive and path in self._nodes:
            for child in sorted(self._nodes[path].children):
                self.delete(posixpath.join(path, child), recursive=True, session_id=session_id)
        self._commit([DeleteOp(path, version)], session_id=session_id, atomic=True)

    def multi(self, ops: Sequence[ZkOp], *, session_id: int = NO_SESSION) -> list[Any]:
        """All or nothing; raises the error of the op that failed."""
        return self._commit(ops, session_id=session_id, atomic=True)

    def checked_multi(
        self, epoch_zk_version: int, ops: Sequence[ZkOp], *, session_id: int = NO_SESSION
    ) -> list[Any]:
        """A controller write: `/controller_epoch` must be at `epoch_zk_version`, then `multi`."""
        return self._commit(
            ops, session_id=session_id, atomic=True, epoch_zk_version=epoch_zk_version
        )

    def chunked_multi(
        self, epoch_zk_version: int | None, ops: Sequence[ZkOp], *, session_id: int = NO_SESSION
    ) -> list[Any]:
        """Each op applied on its own, in order; a result or the op's own error per op."""
        return self._commit(
            ops, session_id=session_id, atomic=False, epoch_zk_version=epoch_zk_version
        )

    def on_next_fenced_write(self, callback: Callable[[], None]) -> None:
        """Run `callback` (which may change the tree) just before the next fenced transaction."""
        self._fenced_write_hooks.append(callback)

    # watches

    def add_data_watch(self, path: str, session_id: int, callback: WatchCallback) -> None:
        self._add_watch(self._data_watches, path, session_id, callback)

    def add_child_watch(self, path: str, session_id: int, callback: WatchCallback) -> None:
        self._add_watch(self._child_watches, path, session_id, callback)

    def watch_count(self, session_id: int | None = None, path: str | None = None) -> int:
        """Armed watches, optionally of one session and/or on one path."""
        return sum(
            1
            for table in (self._data_watches, self._child_watches)
            for watched, watches in table.items()
            for w in watches
            if (session_id is None or w.session_id == session_id)
            and (path is None or watched == path)
        )

    @staticmethod
    def _add_watch(
        table: dict[str, list[_Watch]], path: str, session_id: int, callback: WatchCallback
    ) -> None:
        watches = table.setdefault(path, [])
        # kazoo keeps one registration per (path, watcher): passing the same callback twice
        # before it fires registers it once.
        if not any(w.session_id == session_id and w.callback == callback for w in watches):
            watches.append(_Watch(session_id, callback))

    def _fire(self, events: list[tuple[dict[str, list[_Watch]], str, WatchEventKind]]) -> None:
        due: list[tuple[_Watch, WatchEvent]] = []
        for table, path, kind in events:
            for watch in table.pop(path, []):
                due.append((watch, WatchEvent(kind, path)))
        for watch, event in due:
            watch.callback(event)

    # the engine

    def _check_controller_epoch(self, epoch_zk_version: int) -> None:
        node = self._nodes.get(ControllerEpochZNode.path())
        if node is None or node.version != epoch_zk_version:
            raise ControllerMovedError(
                f"/controller_epoch is no longer at znode version {epoch_zk_version}"
            )

    @staticmethod
    def _stat(node: ZNode) -> ZnodeStat:
        return ZnodeStat(
            czxid=node.czxid,
            mzxid=node.mzxid,
            ctime=node.czxid,
            mtime=node.mzxid,
            version=node.version,
            cversion=node.cversion,
            aversion=0,
            ephemeralOwner=node.ephemeral_owner,
            dataLength=len(node.data),
            numChildren=len(node.children),
            pzxid=node.mzxid,
        )

    def _commit(
        self,
        ops: Sequence[ZkOp],
        *,
        session_id: int,
        atomic: bool,
        epoch_zk_version: int | None = None,
    ) -> list[Any]:
        """Apply `ops` to a staged copy; publish it, record the writes and fire the watches.

        A fenced commit (`epoch_zk_version` given) first runs the race hooks, then checks
        `/controller_epoch`, so a hook that deposes the controller fences this very write.
        """
        if session_id in self.expired_sessions:
            raise SessionExpiredError("session expired")
        fenced = epoch_zk_version is not None
        if epoch_zk_version is not None:
            self.fenced_transactions += 1
            hooks, self._fenced_write_hooks = self._fenced_write_hooks, []
            for hook in hooks:
                hook()
            self._check_controller_epoch(epoch_zk_version)
        staged = dict(self._nodes)
        writes: list[ZNodeWrite] = []
        events: list[tuple[dict[str, list[_Watch]], str, WatchEventKind]] = []
        results: list[Any] = []
        zxid = self._zxid
        for op in ops:
            try:
                result = self._apply(staged, op, zxid + 1, session_id, fenced, writes, events)
            except ZkError as error:
                if atomic:
                    raise
                results.append(error)
                continue
            zxid += 1
            results.append(result)
        self._nodes = staged
        self._zxid = zxid
        self.writes.extend(writes)
        self._fire(events)
        return results

    def _apply(
        self,
        nodes: dict[str, ZNode],
        op: ZkOp,
        zxid: int,
        session_id: int,
        fenced: bool,
        writes: list[ZNodeWrite],
        events: list[tuple[dict[str, list[_Watch]], str, WatchEventKind]],
    ) -> Any:
        _check_path(op.path)
        path = op.path
        match op:
            case CreateOp():
                parent_path = _parent(path)
                parent = nodes.get(parent_path)
                if parent is None:
                    raise NoNodeError(f"NoNodeError at {path}", path=path)
                if parent.ephemeral_owner != NO_SESSION:
                    raise ZkOperationError(
                        f"NoChildrenForEphemeralsError at {path}", path=path, zk_code=-108
                    )
                if op.sequence:
                    path = f"{path}{parent.cversion:010d}"
                if path in nodes:
                    raise NodeExistsError(f"NodeExistsError at {path}", path=path)
                owner = session_id if op.ephemeral else NO_SESSION
                if op.ephemeral and owner == NO_SESSION:
                    raise ZkOperationError(f"ephemeral {path} without a session", path=path)
                nodes[path] = ZNode(op.data, 0, 0, zxid, zxid, owner)
                nodes[parent_path] = dataclasses.replace(
                    parent,
                    cversion=parent.cversion + 1,
                    children=parent.children | {posixpath.basename(path)},
                )
                writes.append(ZNodeWrite(zxid, path, None, op.data, 0, session_id, fenced))
                events.append((self._data_watches, path, WatchEventKind.CREATED))
                events.append((self._child_watches, parent_path, WatchEventKind.CHILD))
                return path
            case SetDataOp():
                node = nodes.get(path)
                if node is None:
                    raise NoNodeError(f"NoNodeError at {path}", path=path)
                if op.version != ANY_VERSION and op.version != node.version:
                    raise BadVersionError(f"BadVersionError at {path}", path=path)
                nodes[path] = dataclasses.replace(
                    node, data=op.data, version=node.version + 1, mzxid=zxid
                )
                writes.append(
                    ZNodeWrite(zxid, path, node.data, op.data, node.version + 1, session_id, fenced)
                )
                events.append((self._data_watches, path, WatchEventKind.CHANGED))
                return self._stat(nodes[path])
            case DeleteOp():
                node = nodes.get(path)
                if node is None:
                    raise NoNodeError(f"NoNodeError at {path}", path=path)
                if op.version != ANY_VERSION and op.version != node.version:
                    raise BadVersionError(f"BadVersionError at {path}", path=path)
                if node.children:
                    raise NotEmptyError(f"NotEmptyError at {path}", path=path)
                del nodes[path]
                parent_path = _parent(path)
                parent = nodes[parent_path]
                nodes[parent_path] = dataclasses.replace(
                    parent,
                    cversion=parent.cversion + 1,
                    children=parent.children - {posixpath.basename(path)},
                )
                writes.append(
                    ZNodeWrite(zxid, path, node.data, None, node.version, session_id, fenced)
                )
                events.append((self._data_watches, path, WatchEventKind.DELETED))
                events.append((self._child_watches, path, WatchEventKind.DELETED))
                events.append((self._child_watches, parent_path, WatchEventKind.CHILD))
                return None
            case CheckOp():
                node = nodes.get(path)
                if node is None:
                    raise NoNodeError(f"NoNodeError at {path}", path=path)
                if op.version != node.version:
                    raise BadVersionError(f"BadVersionError at {path}", path=path)
                return None
        raise TypeError(f"not a ZooKeeper op: {op!r}")


class FakeZkClient:
    """One session on a `FakeZooKeeper`, with the part of `ZkClient`'s API the controller uses.

    Concurrency: the async methods never suspend, so a caller on one event loop sees each call
    happen atomically, as ZooKeeper orders one session's requests.
    """

    def __init__(self, tree: FakeZooKeeper) -> None:
        self.tree = tree
        self.session_id = tree.new_session_id()
        self.connected = True
        # get_children of these paths fails once with ConnectionLossError, as a request does
        # when the connection stays lost past the client's retry deadline.
        self.lose_connection_on_children: set[str] = set()
        # The next multi lands but its answer is lost: "resend" -- the client resends it and
        # returns what the resend meets; "lose" -- it gives up with ConnectionLossError.
        self.next_multi_answer_lost: str | None = None

    @property
    def expired(self) -> bool:
        return self.session_id in self.tree.expired_sessions

    def renew(self) -> None:
        """A new session after an expiry (kazoo reconnects with a fresh session)."""
        self.session_id = self.tree.new_session_id()

    def _live(self) -> None:
        if self.expired:
            raise SessionExpiredError("session expired")

    async def get(self, path: str, watch: WatchCallback | None = None) -> tuple[bytes, ZnodeStat]:
        self._live()
        result = self.tree.get(path)
        if watch is not None:
            self.tree.add_data_watch(path, self.session_id, watch)
        return result

    async def get_many(self, paths: Sequence[str], window: int = 5000) -> list[Any]:
        self._live()
        results: list[Any] = []
        for path in paths:
            try:
                results.append(self.tree.get(path))
            except ZkError as e:
                results.append(e)
        return results

    async def get_children(self, path: str, watch: WatchCallback | None = None) -> list[str]:
        self._live()
        if path in self.lose_connection_on_children:
            self.lose_connection_on_children.discard(path)
            raise ConnectionLossError(path)
        children = self.tree.get_children(path)
        if watch is not None:
            self.tree.add_child_watch(path, self.session_id, watch)
        return children

    # The real client's, over this fake's get and get_children.
    get_or_none = ZkClient.get_or_none
    children_or_empty = ZkClient.children_or_empty

    async def exists(self, path: str, watch: WatchCallback | None = None) -> ZnodeStat | None:
        self._live()
        stat = self.tree.exists(path)
        if watch is not None:
            self.tree.add_data_watch(path, self.session_id, watch)
        return stat

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
    ) -> str:
        self._live()
        return self.tree.create(
            path,
            data,
            ephemeral_owner=self.session_id if ephemeral else NO_SESSION,
            sequence=sequence,
            makepath=makepath,
            session_id=self.session_id,
        )

    async def set(self, path: str, data: bytes, version: int = ANY_VERSION) -> ZnodeStat:
        self._live()
        return self.tree.set(path, data, version, session_id=self.session_id)

    async def delete(self, path: str, version: int = ANY_VERSION, recursive: bool = False) -> None:
        self._live()
        self.tree.delete(path, version, recursive=recursive, session_id=self.session_id)

    async def multi(self, ops: Sequence[ZkOp]) -> list[Any]:
        self._live()
        lost, self.next_multi_answer_lost = self.next_multi_answer_lost, None
        if lost is not None:
            self.tree.multi(ops, session_id=self.session_id)
            if lost == "lose":
                raise ConnectionLossError("the answer to a multi that landed")
        return self.tree.multi(ops, session_id=self.session_id)

    async def checked_multi(self, epoch_zk_version: int, ops: Sequence[ZkOp]) -> list[Any]:
        self._live()
        return self.tree.checked_multi(epoch_zk_version, ops, session_id=self.session_id)

    async def chunked_multi(
        self, epoch_zk_version: int | None, ops: Sequence[ZkOp], max_bytes: int = 0
    ) -> list[Any]:
        del max_bytes  # no request limit in memory: one chunk behaves like many
        self._live()
        return self.tree.chunked_multi(epoch_zk_version, ops, session_id=self.session_id)

    def add_state_listener(self, listener: Callable[..., None]) -> None:
        del listener  # sessions change only when a test says so

    def remove_state_listener(self, listener: Callable[..., None]) -> None:
        del listener


@dataclass(frozen=True, slots=True)
class PartitionStateWrite:
    """A committed change of one partition state znode, decoded (None: the znode did not exist /
    was deleted). `by_controller` is true for fenced writes."""

    tp: TopicPartition
    before: LeaderAndIsr | None
    after: LeaderAndIsr | None
    by_controller: bool
    zxid: int


class FakeControllerZk(ControllerZk):
    """The real `ControllerZk` over a `FakeZooKeeper` session, plus helpers that play the other
    actors of a cluster (brokers, admins, leaders, a rival controller). Helpers are synchronous and
    write as those actors would: unfenced, and conditional on versions where Kafka's are.

    `tree` may be shared by several facades (one per controller candidate); `client` is this
    facade's own session, which is also what `KafkaController.zk_client` should be.
    """

    def __init__(self, tree: FakeZooKeeper | None = None) -> None:
        self.tree = tree if tree is not None else FakeZooKeeper()
        self.client = self.tree.client()
        self._broker_sessions: dict[int, int] = {}
        super().__init__(self.client)  # type: ignore[arg-type]

    # brokers

    def register_broker(self, broker_id: int, *, rack: str | None = None) -> BrokerInfo:
        """Create `/brokers/ids/<id>` as an ephemeral of the broker's own session; its czxid is
        the broker epoch, so every registration gets a new one."""
        session = self.tree.new_session_id()
        self._broker_sessions[broker_id] = session
        path = BrokerIdZNode.path(broker_id)
        data = BrokerIdZNode.encode(
            [EndPoint.plaintext("localhost", 9000 + broker_id)], rack=rack, timestamp_ms=0
        )
        self.tree.create(path, data, ephemeral_owner=session)
        raw, stat = self.tree.get(path)
        return BrokerIdZNode.decode(broker_id, raw, stat.czxid)

    def deregister_broker(self, broker_id: int) -> None:
        """The broker's session ends (crash or shutdown): its registration disappears."""
        session = self._broker_sessions.pop(broker_id)
        self.tree.expire_session(session)

    def registered_broker_ids(self) -> set[int]:
        return {int(c) for c in self.tree.get_children(BrokerIdsZNode.path())}

    # controller election

    def elect_controller(self, broker_id: int) -> tuple[int, int]:
        """Make `broker_id` controller as a rival would: replace `/controller`, bump the epoch.
        Returns (epoch, epoch znode version) — what that controller's fenced writes must name."""
        session = self.tree.new_session_id()
        if self.tree.exists(ControllerZNode.path()) is not None:
            self.tree.delete(ControllerZNode.path())
        if self.tree.exists(ControllerEpochZNode.path()) is None:
            self.tree.create(ControllerEpochZNode.path(), ControllerEpochZNode.encode(0))
        epoch, version = self.controller_epoch()
        self.tree.multi(
            [
                CreateOp(
                    ControllerZNode.path(), ControllerZNode.encode(broker_id, 0), ephemeral=True
                ),
                SetDataOp(
                    ControllerEpochZNode.path(), ControllerEpochZNode.encode(epoch + 1), version
                ),
            ],
            session_id=session,
        )
        return self.controller_epoch()

    def controller_epoch(self) -> tuple[int, int]:
        """(epoch, znode version) of `/controller_epoch`, or (0, -1) before the first election."""
        stat = self.tree.exists(ControllerEpochZNode.path())
        if stat is None:
            return 0, -1
        data, stat = self.tree.get(ControllerEpochZNode.path())
        decoded = ControllerEpochZNode.decode(data, stat.version)
        return decoded.epoch, decoded.zk_version

    def controller_id(self) -> int:
        if self.tree.exists(ControllerZNode.path()) is None:
            return -1
        data, stat = self.tree.get(ControllerZNode.path())
        return ControllerZNode.decode(data, stat.version).broker_id

    # topics

    def create_topic(
        self,
        topic: str,
        assignment: Mapping[int, Sequence[int]],
        *,
        config: Mapping[str, str] | None = None,
        topic_id: str | None = None,
    ) -> None:
        """What an admin does: the config znode first, then the assignment (which the controller
        watches), as Kafka's AdminZkClient does."""
        self.tree.create(TopicConfigZNode.path(topic), TopicConfigZNode.encode(config or {}))
        self.tree.create(
            TopicZNode.path(topic),
            TopicZNode.encode({p: tuple(r) for p, r in assignment.items()}, topic_id),
        )

    def topic_assignment(self, topic: str) -> dict[int, tuple[int, ...]] | None:
        if self.tree.exists(TopicZNode.path(topic)) is None:
            return None
        data, stat = self.tree.get(TopicZNode.path(topic))
        decoded = TopicZNode.decode(topic, data, stat.version)
        return {p: tuple(a.replicas) for p, a in decoded.partitions.items()}

    def topics(self) -> set[str]:
        return set(self.tree.get_children(TopicsZNode.path()))

    def add_partitions(self, topic: str, added: Mapping[int, Sequence[int]]) -> None:
        """Partition expansion: rewrite the assignment with the new partitions, keeping the id."""
        data, stat = self.tree.get(TopicZNode.path(topic))
        current = TopicZNode.decode(topic, data, stat.version)
        partitions: dict[int, Any] = dict(current.partitions)
        for partition, replicas in added.items():
            if partition in partitions:
                raise ValueError(f"{topic}-{partition} exists already")
            partitions[partition] = tuple(replicas)
        self.tree.set(
            TopicZNode.path(topic), TopicZNode.encode(partitions, current.topic_id), stat.version
        )

    def set_topic_config(self, topic: str, config: Mapping[str, str]) -> None:
        path = TopicConfigZNode.path(topic)
        if self.tree.exists(path) is None:
            self.tree.create(path, TopicConfigZNode.encode(config))
        else:
            self.tree.set(path, TopicConfigZNode.encode(config))

    def request_topic_deletion(self, topic: str) -> None:
        """What DeleteTopics does: queue the topic under `/admin/delete_topics`."""
        self.tree.create(DeleteTopicsTopicZNode.path(topic), DeleteTopicsTopicZNode.encode())

    def topics_queued_for_deletion(self) -> set[str]:
        return set(self.tree.get_children(DeleteTopicsZNode.path()))

    # partition states

    def partition_state(self, tp: TopicPartition) -> LeaderAndIsr | None:
        path = TopicPartitionStateZNode.path(*tp)
        if self.tree.exists(path) is None:
            return None
        data, stat = self.tree.get(path)
        return TopicPartitionStateZNode.decode(data, stat.version, path)

    def _existing_state(self, tp: TopicPartition) -> LeaderAndIsr:
        state = self.partition_state(tp)
        if state is None:
            raise NoNodeError(f"no state for {tp}", path=TopicPartitionStateZNode.path(*tp))
        return state

    def partition_states(self) -> dict[TopicPartition, LeaderAndIsr]:
        """Every partition state znode in the tree."""
        states: dict[TopicPartition, LeaderAndIsr] = {}
        for topic in self.topics():
            if self.tree.exists(TopicPartitionsZNode.path(topic)) is None:
                continue
            for child in self.tree.get_children(TopicPartitionsZNode.path(topic)):
                state = self.partition_state((topic, int(child)))
                if state is not None:
                    states[(topic, int(child))] = state
        return states

    def write_partition_state(
        self,
        tp: TopicPartition,
        *,
        leader: int,
        leader_epoch: int,
        isr: Sequence[int],
        controller_epoch: int,
    ) -> LeaderAndIsr:
        """Seed a partition state as an earlier controller left it (unconditional, unfenced)."""
        path = TopicPartitionStateZNode.path(*tp)
        data = TopicPartitionStateZNode.encode(
            leader=leader, leader_epoch=leader_epoch, isr=isr, controller_epoch=controller_epoch
        )
        if self.tree.exists(path) is None:
            self.tree.create(path, data, makepath=True)
        else:
            self.tree.set(path, data)
        return self._existing_state(tp)

    def leader_update_isr(
        self, tp: TopicPartition, isr: Sequence[int], *, notify: bool = True
    ) -> LeaderAndIsr:
        """What a leader does when it shrinks or expands the ISR: a write conditional on the
        version it knows (here: the current one), keeping leader, leader epoch and controller
        epoch; then an ISR change notification for the controller, unless `notify` is false
        (the test sends it later with `notify_isr_change`)."""
        current = self._existing_state(tp)
        if current.leader not in isr:
            raise ValueError(f"leader {current.leader} must stay in its ISR {list(isr)}")
        self.tree.set(
            TopicPartitionStateZNode.path(*tp),
            TopicPartitionStateZNode.encode(
                leader=current.leader,
                leader_epoch=current.leader_epoch,
                isr=isr,
                controller_epoch=current.controller_epoch,
            ),
            current.zk_version,
        )
        if notify:
            self.notify_isr_change([tp])
        return self._existing_state(tp)

    def notify_isr_change(self, partitions: Iterable[TopicPartition]) -> str:
        return self.tree.create(
            IsrChangeNotificationSequenceZNode.path(),
            IsrChangeNotificationSequenceZNode.encode(
                sorted(ZkTopicPartition(t, p) for t, p in partitions)
            ),
            sequence=True,
        )

    def partition_state_writes(self, since: int = 0) -> list[PartitionStateWrite]:
        """Changes of partition state znodes among `tree.writes[since:]`, decoded."""
        decoded = (decode_partition_state_write(w) for w in self.tree.writes[since:])
        return [w for w in decoded if w is not None]

    def partitions_parent_exists(self, topic: str) -> bool:
        return self.tree.exists(TopicPartitionsZNode.path(topic)) is not None

    def partition_znode_exists(self, tp: TopicPartition) -> bool:
        return self.tree.exists(TopicPartitionZNode.path(*tp)) is not None


def decode_partition_state_write(write: ZNodeWrite) -> PartitionStateWrite | None:
    """`write` decoded if it changed a partition state znode, else None."""
    tp = _state_path_partition(write.path)
    if tp is None:
        return None
    before = (
        TopicPartitionStateZNode.decode(write.before, write.version - 1, write.path)
        if write.before is not None
        else None
    )
    after = (
        TopicPartitionStateZNode.decode(write.after, write.version, write.path)
        if write.after is not None
        else None
    )
    return PartitionStateWrite(tp, before, after, write.fenced, write.zxid)


def _state_path_partition(path: str) -> TopicPartition | None:
    """(topic, partition) for `/brokers/topics/<t>/partitions/<p>/state`, else None."""
    parts = path.split("/")
    if (
        len(parts) == 7
        and parts[1] == "brokers"
        and parts[2] == "topics"
        and parts[4] == "partitions"
        and parts[6] == "state"
        and parts[5].isdigit()
    ):
        return parts[3], int(parts[5])
    return None


__all__ = [
    "FakeControllerZk",
    "FakeZkClient",
    "FakeZooKeeper",
    "PartitionStateWrite",
    "ZNode",
    "ZNodeWrite",
    "decode_partition_state_write",
]
