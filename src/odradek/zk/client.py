"""An asyncio facade over kazoo: every ZooKeeper call is `async`, and many can be in flight.

kazoo has no asyncio handler; it runs its own threads (a connection thread that owns the socket,
a completion thread that runs result callbacks, a callback thread that runs watchers). This module
bridges each kazoo `*_async` call's IAsyncResult to an asyncio future with
`loop.call_soon_threadsafe`, so a coroutine that awaits a read does not hold a thread, and a
controller that issues 10,000 conditional writes sends them all before awaiting the first answer
(pipelining: ZooKeeper answers one session's requests in order, so the cost is one round trip plus
the server's work, not 10,000 round trips).

Threads and callbacks:

* `ZkClient` is bound to the event loop that runs `start()`; call its methods only from that
  loop's thread.
* Watch callbacks and session-state listeners always run on that loop's thread (handed over with
  `call_soon_threadsafe`). They are plain functions and must not block: enqueue an event and return.
* Watches are one-shot, as in ZooKeeper. kazoo does not re-arm watches after a reconnect: when the
  connection drops, every outstanding watch fires once with `WatchEventKind.NONE`, meaning "the
  watch is gone; re-read and watch again once connected".

Errors: kazoo's exceptions are translated by `odradek.zk.errors`; a call raises `NoNodeError`,
`BadVersionError`, `SessionExpiredError`, ... never a kazoo type. A request in flight when the
connection drops fails with ConnectionLoss inside kazoo; `retry_on_connection_loss` (the one retry
helper) resends it, because the session usually survives. A resent write may already have been
applied: callers of conditional writes must treat a BadVersionError after a retry the way Kafka
does (re-read and compare). Requests issued while disconnected wait in kazoo's queue until the
connection returns or the session is found expired.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import posixpath
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from kazoo.client import KazooClient, TransactionRequest
from kazoo.protocol.states import KazooState, WatchedEvent, ZnodeStat
from kazoo.retry import KazooRetry
from kazoo.security import ACL

from odradek.errors import OperatorError
from odradek.zk import bulk_read
from odradek.zk.acls import ZkCredentials
from odradek.zk.errors import (
    BadVersionError,
    ConnectionLossError,
    ControllerMovedError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
    ZkError,
    ZkRequestTooLargeError,
    is_kazoo_error,
    is_multi_placeholder,
    translate_kazoo_error,
)
from odradek.zk.znodes import ControllerEpochZNode

__all__ = [
    "CheckOp",
    "CreateOp",
    "DeleteOp",
    "OpResult",
    "SessionState",
    "SetDataOp",
    "WatchEvent",
    "WatchEventKind",
    "ZkClient",
    "ZkOp",
    "ZnodeStat",
    "op_size",
    "retry_on_connection_loss",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

# get_many of at least this many znodes goes through `bulk_read` (private sessions speaking the
# wire protocol, ~20-60 µs per read instead of kazoo's ~250-300 µs), over this many sessions.
BULK_READ_MIN = 500
BULK_READ_SESSIONS = 4

DEFAULT_MAX_MULTI_BYTES = 900_000  # ZooKeeper refuses requests over jute.maxbuffer (1 MiB)


# kazoo's states as Kafka's SessionState gauge names them (ZooKeeper's client States).
_KAFKA_SESSION_STATES = {
    KazooState.CONNECTED: "CONNECTED",
    KazooState.SUSPENDED: "DISCONNECTED",
    KazooState.LOST: "EXPIRED",
}


class SessionState(enum.Enum):
    """Session states reported to listeners (kazoo's CONNECTED / SUSPENDED / LOST)."""

    CONNECTED = "connected"  # connected, on a new or the same session
    SUSPENDED = "suspended"  # connection lost; the session may still be alive on the server
    EXPIRED = "expired"  # session gone: ephemerals deleted, watches lost; a new one follows


class WatchEventKind(enum.Enum):
    CREATED = "CREATED"
    DELETED = "DELETED"
    CHANGED = "CHANGED"
    CHILD = "CHILD"
    NONE = "NONE"  # the connection dropped and the watch with it; re-read and re-watch


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: WatchEventKind
    path: str | None  # None for NONE events


WatchCallback = Callable[[WatchEvent], None]
StateListener = Callable[[SessionState], None]


# Transaction operations. Results, by op: CreateOp -> the created path (with the sequence suffix
# if sequential), SetDataOp -> the new ZnodeStat, DeleteOp and CheckOp -> None.
@dataclass(frozen=True, slots=True)
class CreateOp:
    path: str
    data: bytes = b""
    ephemeral: bool = False
    sequence: bool = False


@dataclass(frozen=True, slots=True)
class SetDataOp:
    path: str
    data: bytes
    version: int = -1


@dataclass(frozen=True, slots=True)
class DeleteOp:
    path: str
    version: int = -1


@dataclass(frozen=True, slots=True)
class CheckOp:
    path: str
    version: int


ZkOp: TypeAlias = CreateOp | SetDataOp | DeleteOp | CheckOp
OpResult: TypeAlias = "str | ZnodeStat | None"

# Encoded sizes, to keep each transaction under ZooKeeper's 1 MiB request limit. A multi() op is
# a 9-byte header (type, done flag, error) then the op; strings and buffers carry a 4-byte length;
# the one ACL kazoo sends by default (world:anyone, all permissions) takes 27 bytes with its count;
# a transaction adds a 12-byte frame/request header and a 9-byte end marker.
_OP_HEADER = 9
_OPEN_ACL_BYTES = 4 + (4 + 4 + len("world") + 4 + len("anyone"))
_TRANSACTION_OVERHEAD = 12 + 9


def acl_bytes(acls: Sequence[ACL] | None) -> int:
    """Encoded size of a create's ACL list (None: kazoo's default open ACL)."""
    if acls is None:
        return _OPEN_ACL_BYTES
    return 4 + sum(4 + 4 + len(a.id.scheme.encode()) + 4 + len(a.id.id.encode()) for a in acls)


def op_size(op: ZkOp, chroot: str = "", create_acl_bytes: int = _OPEN_ACL_BYTES) -> int:
    """Bytes `op` adds to a multi() request (exact for the ACL size given)."""
    path_bytes = 4 + len(chroot.encode()) + len(op.path.encode())
    match op:
        case CreateOp():
            return _OP_HEADER + path_bytes + 4 + len(op.data) + create_acl_bytes + 4
        case SetDataOp():
            return _OP_HEADER + path_bytes + 4 + len(op.data) + 4
        case DeleteOp() | CheckOp():
            return _OP_HEADER + path_bytes + 4


def _add_to_transaction(
    transaction: TransactionRequest, op: ZkOp, acl_for: Callable[[str], list[ACL] | None]
) -> None:
    match op:
        case CreateOp():
            transaction.create(
                op.path,
                op.data,
                acl=acl_for(op.path),
                ephemeral=op.ephemeral,
                sequence=op.sequence,
            )
        case SetDataOp():
            transaction.set_data(op.path, op.data, op.version)
        case DeleteOp():
            transaction.delete(op.path, op.version)
        case CheckOp():
            transaction.check(op.path, op.version)


@dataclass(frozen=True, slots=True)
class _FailedOp:
    """The op that made a transaction abort: its index in the transaction and its error."""

    index: int
    error: ZkError


def _interpret_transaction(ops: Sequence[ZkOp], raw: list[Any]) -> list[OpResult] | _FailedOp:
    """Turn kazoo's transaction result list into per-op results, or the op that failed.

    A failed multi() does not raise in kazoo: the result list holds an exception object for every
    op. Only one is the cause; the rest are placeholders (see `is_multi_placeholder`).
    """
    if len(raw) != len(ops):
        raise ZkError(f"multi() returned {len(raw)} results for {len(ops)} ops")
    for index, result in enumerate(raw):
        if is_kazoo_error(result) and not is_multi_placeholder(result):
            error = translate_kazoo_error(result, ops[index].path)
            if not isinstance(error, ZkError):
                raise error
            return _FailedOp(index, error)
    if any(is_kazoo_error(r) for r in raw):
        raise ZkError("multi() aborted without naming the failed op")
    # kazoo gives True for delete and check; only creates (a path) and sets (a stat) have results.
    return [r if isinstance(r, str | ZnodeStat) else None for r in raw]


async def retry_on_connection_loss(
    attempt: Callable[[], Awaitable[T]],
    *,
    deadline_s: float,
    first: Awaitable[T] | None = None,
) -> T:
    """Await `attempt()` and call it again while it fails with ConnectionLossError.

    The one place that retries ZooKeeper requests. Connection loss fails only the requests that
    were in flight; the session normally survives, and a resent request waits in kazoo's queue
    until the client has reconnected. Gives up (re-raising) after `deadline_s` seconds; never
    retries SessionExpiredError or a server's refusal. `first`, if given, is an attempt already
    sent (so that callers can put many requests in flight before awaiting any).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    delay = 0.02
    pending = first if first is not None else attempt()
    while True:
        try:
            return await pending
        except ConnectionLossError:
            if loop.time() + delay >= deadline:
                raise
            log.debug("ZooKeeper connection lost during a request; retrying in %.2fs", delay)
        # Backoff only bounds a pathological loop; normally the retry just waits in kazoo's queue.
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)
        pending = attempt()


class _LoopWatcher:
    """A kazoo watcher that hands the event to the asyncio loop.

    Runs on kazoo's callback thread. Equality follows the wrapped callback, so that kazoo (which
    keeps watchers in a set per path) registers the same callback once per path however many times
    it is passed, exactly as it would the bare function.
    """

    __slots__ = ("callback", "loop")

    def __init__(self, callback: WatchCallback, loop: asyncio.AbstractEventLoop) -> None:
        self.callback = callback
        self.loop = loop

    def __call__(self, event: WatchedEvent) -> None:
        translated = WatchEvent(WatchEventKind(event.type), event.path)
        try:
            self.loop.call_soon_threadsafe(self.callback, translated)
        except RuntimeError:
            pass  # the loop is closed: nobody is left to tell

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _LoopWatcher)
            and other.callback == self.callback
            and other.loop is self.loop
        )

    def __hash__(self) -> int:
        return hash(self.callback)


def _settle(future: asyncio.Future[Any], result: Any, path: str | None) -> None:
    """Complete `future` from a finished kazoo IAsyncResult. Runs on the loop thread."""
    if future.done():  # cancelled by the caller, or kazoo reported twice
        return
    if result.successful():
        future.set_result(result.value)
    else:
        future.set_exception(translate_kazoo_error(result.exception, path))


class ZkClient:
    """One ZooKeeper session, used from one asyncio loop.

    Concurrency: every public method must be called on the thread of the loop that ran
    `start()`. Any number of calls may be in flight at once; ZooKeeper applies one session's
    requests in the order they were issued. Watch callbacks and state listeners run on the same
    loop thread.
    """

    def __init__(
        self,
        connect_string: str,
        *,
        session_timeout_s: float = 18.0,
        connection_loss_retry_s: float | None = None,
        client_id: tuple[int, bytes] | None = None,
        credentials: ZkCredentials | None = None,
        set_acl: bool = False,
    ) -> None:
        """`credentials`: authenticate with the `digest` scheme; `set_acl`: create znodes with
        ACLs for that identity (`zookeeper.set.acl`, see `odradek.zk.acls`)."""
        self.connect_string = connect_string
        hosts, slash, chroot = connect_string.partition("/")
        self._hosts = hosts
        self._chroot = posixpath.normpath("/" + chroot) if slash and chroot.strip("/") else ""
        self.session_timeout_s = session_timeout_s
        self.connection_loss_retry_s = (
            connection_loss_retry_s if connection_loss_retry_s is not None else session_timeout_s
        )
        if set_acl and credentials is None:
            raise ZkError("ZooKeeper ACLs need credentials to set them for")
        self._credentials = credentials if set_acl else None
        self._kazoo = KazooClient(
            hosts=connect_string,
            timeout=session_timeout_s,
            client_id=client_id,
            auth_data=credentials.auth_data if credentials is not None else None,
            default_acl=self._credentials.default_acl if self._credentials else None,
            # Reconnect forever, at most a second apart: kazoo's default backoff grows to an hour,
            # which would keep a broker away long after ZooKeeper came back.
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0),
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listeners: list[StateListener] = []
        self._closing = False
        # Kafka's ZooKeeperClientMetrics (ZooKeeperRequestLatencyMs) and SessionState, read by the
        # metrics scrape: counted on the loop thread as each request's answer arrives.
        self.request_count = 0
        self.request_latency_ms_total = 0.0
        self.request_latency_ms_max = 0.0
        self.session_state = "CONNECTING"  # written by kazoo's thread; a str swap is atomic

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, timeout: float = 30.0) -> None:
        """Connect; OperatorError (one line) if ZooKeeper is unreachable within `timeout`.

        Creates the chroot path if the connect string has one and it is missing, as a Kafka
        broker does at start-up.
        """
        self._loop = asyncio.get_running_loop()
        self._kazoo.add_listener(self._on_kazoo_state)
        connected = await asyncio.to_thread(self._start_blocking, timeout)
        if not connected:
            raise OperatorError(
                f"ZooKeeper at {self.connect_string} unreachable within {timeout:g}s"
            )
        if self._chroot and await self.exists("/") is None:
            await asyncio.to_thread(self._create_chroot_blocking, timeout)

    def _start_blocking(self, timeout: float) -> bool:
        event = self._kazoo.start_async()
        event.wait(timeout)
        if self._kazoo.connected:
            return True
        self._closing = True
        self._kazoo.stop()
        self._kazoo.close()
        return False

    def _create_chroot_blocking(self, timeout: float) -> None:
        # A chrooted session cannot name paths above its root, so a short root session does it.
        root = KazooClient(hosts=self._hosts, timeout=self.session_timeout_s)
        try:
            root.start(timeout)
            root.ensure_path(self._chroot)
        except Exception as exc:
            raise OperatorError(
                f"cannot create ZooKeeper chroot {self._chroot}: {translate_kazoo_error(exc)}"
            ) from None
        finally:
            root.stop()
            root.close()

    async def close(self) -> None:
        """End the session (its ephemeral znodes go at once). Pending and later calls fail with
        ClientClosedError (a SessionExpiredError); no state change is reported for our own close."""
        if self._closing:
            return
        self._closing = True
        await asyncio.to_thread(self._close_blocking)

    def _close_blocking(self) -> None:
        self._kazoo.stop()
        self._kazoo.close()

    @property
    def connected(self) -> bool:
        return bool(self._kazoo.connected)

    @property
    def session_id(self) -> int | None:
        client_id = self._kazoo.client_id
        return client_id[0] if client_id else None

    @property
    def session_password(self) -> bytes | None:
        client_id = self._kazoo.client_id
        return client_id[1] if client_id else None

    # -- session state -----------------------------------------------------------------------

    def add_state_listener(self, listener: StateListener) -> None:
        """Call `listener(SessionState)` on the loop thread at each session state change."""
        self._listeners.append(listener)

    def remove_state_listener(self, listener: StateListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _on_kazoo_state(self, state: str) -> None:
        # Runs on kazoo's connection thread: translate and hand over, nothing else.
        mapped = {
            KazooState.CONNECTED: SessionState.CONNECTED,
            KazooState.SUSPENDED: SessionState.SUSPENDED,
            KazooState.LOST: SessionState.EXPIRED,
        }.get(state)
        self.session_state = _KAFKA_SESSION_STATES.get(state, str(state))
        loop = self._loop
        if mapped is None or loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._dispatch_state, mapped)
        except RuntimeError:
            pass  # loop closed

    def _dispatch_state(self, state: SessionState) -> None:
        if self._closing:
            return
        log.info("ZooKeeper session %s", state.value)
        for listener in list(self._listeners):
            try:
                listener(state)
            except Exception:
                log.exception("ZooKeeper state listener %r failed", listener)

    # -- the bridge --------------------------------------------------------------------------

    def _bridge(self, async_result: Any, path: str | None) -> asyncio.Future[Any]:
        """An asyncio future completed (on the loop thread) when kazoo's result is ready."""
        loop = self._require_loop()
        future: asyncio.Future[Any] = loop.create_future()
        started = time.monotonic()
        future.add_done_callback(lambda _f: self._record_latency(started))

        def on_done(result: Any) -> None:  # kazoo's completion thread
            try:
                loop.call_soon_threadsafe(_settle, future, result, path)
            except RuntimeError:
                pass  # loop closed

        async_result.rawlink(on_done)
        return future

    def _record_latency(self, started: float) -> None:
        latency_ms = (time.monotonic() - started) * 1000
        self.request_count += 1
        self.request_latency_ms_total += latency_ms
        if latency_ms > self.request_latency_ms_max:
            self.request_latency_ms_max = latency_ms

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise ZkError("ZkClient used before start()")
        return self._loop

    def _watcher(self, watch: WatchCallback | None) -> _LoopWatcher | None:
        return _LoopWatcher(watch, self._require_loop()) if watch is not None else None

    async def _call(self, submit: Callable[[], asyncio.Future[T]]) -> T:
        return await retry_on_connection_loss(submit, deadline_s=self.connection_loss_retry_s)

    # -- single operations -------------------------------------------------------------------

    async def get(self, path: str, watch: WatchCallback | None = None) -> tuple[bytes, ZnodeStat]:
        watcher = self._watcher(watch)
        data, stat = await self._call(
            lambda: self._bridge(self._kazoo.get_async(path, watcher), path)
        )
        return (data if data is not None else b""), stat

    async def get_many(
        self, paths: Sequence[str], window: int = 5000
    ) -> list[tuple[bytes, ZnodeStat] | ZkError]:
        """Read many znodes, pipelined: up to `window` requests in flight, each bridged straight to
        a future (no task per read: at 100,000 reads the task objects alone cost seconds). Each
        result is (data, stat) or the read's own ZkError (NoNodeError for a missing znode); reads
        cut by a connection loss are retried, other errors (an expired session) raise.

        From BULK_READ_MIN paths on, the reads go over private sessions (`bulk_read`, after a
        `sync`), falling back to this session when those fail."""
        if len(paths) >= BULK_READ_MIN:
            try:
                return await bulk_read.read_many(
                    self.connect_string, paths, sessions=BULK_READ_SESSIONS
                )
            except ConnectionLossError as e:
                log.info("bulk read of %d znodes failed (%s): reading through kazoo", len(paths), e)
        results: list[tuple[bytes, ZnodeStat] | ZkError] = []
        for start in range(0, len(paths), window):
            chunk = paths[start : start + window]
            futures = [self._bridge(self._kazoo.get_async(path), path) for path in chunk]
            outcomes = await asyncio.gather(*futures, return_exceptions=True)
            for path, outcome in zip(chunk, outcomes, strict=True):
                if isinstance(outcome, ConnectionLossError):
                    try:
                        outcome = await self.get(path)
                    except ZkError as e:
                        outcome = e
                if isinstance(outcome, SessionExpiredError):
                    raise outcome
                if isinstance(outcome, ZkError):
                    results.append(outcome)
                elif isinstance(outcome, BaseException):
                    raise outcome
                else:
                    data, stat = outcome
                    results.append(((data if data is not None else b""), stat))
        return results

    async def sync(self, path: str = "/") -> None:
        """Wait until the server this session talks to has caught up with the leader (ZooKeeper's
        `sync`): a read issued after it sees every write committed before it began. Used where a
        lagging follower's stale answer would be mistaken for the truth (checking a controller
        request against `/controller_epoch`)."""
        await self._call(lambda: self._bridge(self._kazoo.sync_async(path), path))

    async def get_children(self, path: str, watch: WatchCallback | None = None) -> list[str]:
        watcher = self._watcher(watch)
        return await self._call(
            lambda: self._bridge(self._kazoo.get_children_async(path, watcher), path)
        )

    async def exists(self, path: str, watch: WatchCallback | None = None) -> ZnodeStat | None:
        """The znode's stat, or None. With `watch`, also fires when a missing znode is created."""
        watcher = self._watcher(watch)
        return await self._call(lambda: self._bridge(self._kazoo.exists_async(path, watcher), path))

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
    ) -> str:
        """Create a znode; returns its path (with the sequence suffix for sequential nodes).

        After a connection-loss retry, NodeExistsError may mean our own first attempt landed; a
        retried sequential create may leave an extra node (as with any ZooKeeper client).
        """
        acl = self._acl_for(path)
        return await self._call(
            lambda: self._bridge(
                self._kazoo.create_async(
                    path, data, acl=acl, ephemeral=ephemeral, sequence=sequence, makepath=makepath
                ),
                path,
            )
        )

    @property
    def _create_acl_bytes(self) -> int:
        # Sensitive paths get the shorter ACL: the world-readable one bounds every create.
        return acl_bytes(self._credentials.acls("/") if self._credentials is not None else None)

    def _acl_for(self, path: str) -> list[ACL] | None:
        """The ACL a znode created at `path` gets (None: kazoo's default, world-open)."""
        return self._credentials.acls(path) if self._credentials is not None else None

    async def set(self, path: str, data: bytes, version: int = -1) -> ZnodeStat:
        """Write a znode's data, conditionally on `version` unless it is -1."""
        return await self._call(
            lambda: self._bridge(self._kazoo.set_async(path, data, version), path)
        )

    async def delete(self, path: str, version: int = -1, recursive: bool = False) -> None:
        """Delete a znode; with `recursive`, its descendants first. Descendants that vanish
        meanwhile are fine; `version` applies to `path` only."""
        if recursive:
            await self._delete_children(path)
        await self._call(lambda: self._bridge(self._kazoo.delete_async(path, version), path))

    async def _delete_children(self, path: str) -> None:
        # Try to delete every child as if it were a leaf, in batched transactions (a topic with
        # thousands of partitions is mostly leaves); descend only into those that are not.
        try:
            children = await self.get_children(path)
        except NoNodeError:
            return
        child_paths = [posixpath.join(path, child) for child in children]
        results = await self.chunked_multi(None, [DeleteOp(p) for p in child_paths])
        inner = [
            p for p, r in zip(child_paths, results, strict=True) if isinstance(r, NotEmptyError)
        ]
        await asyncio.gather(*(self._delete_tree(p) for p in inner))
        failed = [
            r
            for r in results
            if isinstance(r, ZkError) and not isinstance(r, NotEmptyError | NoNodeError)
        ]
        if failed:
            raise failed[0]

    async def _delete_tree(self, path: str) -> None:
        await self._delete_children(path)
        try:
            await self.delete(path)
        except NoNodeError:
            pass

    async def ensure_paths(self, paths: Iterable[str]) -> None:
        """Create each path and its missing parents (empty data); all requests in flight at once."""
        await asyncio.gather(*(self._ensure_path(path) for path in paths))

    async def _ensure_path(self, path: str) -> None:
        acl = self._acl_for(path)
        await self._call(lambda: self._bridge(self._kazoo.ensure_path_async(path, acl), path))

    # -- transactions ------------------------------------------------------------------------

    def _submit_transaction(self, ops: Sequence[ZkOp]) -> asyncio.Future[Any]:
        transaction = self._kazoo.transaction()
        for op in ops:
            _add_to_transaction(transaction, op, self._acl_for)
        return self._bridge(transaction.commit_async(), None)

    async def _commit(
        self, ops: Sequence[ZkOp], first: asyncio.Future[Any] | None = None
    ) -> list[OpResult] | _FailedOp:
        raw = await retry_on_connection_loss(
            lambda: self._submit_transaction(ops),
            deadline_s=self.connection_loss_retry_s,
            first=first,
        )
        return _interpret_transaction(ops, raw)

    async def multi(self, ops: Sequence[ZkOp]) -> list[OpResult]:
        """Apply `ops` atomically; raise the error of the op that failed (all or nothing)."""
        if not ops:
            return []
        outcome = await self._commit(ops)
        if isinstance(outcome, _FailedOp):
            raise outcome.error
        return outcome

    @staticmethod
    def _epoch_check(epoch_zk_version: int | None) -> list[ZkOp]:
        if epoch_zk_version is None:
            return []
        return [CheckOp(ControllerEpochZNode.path(), epoch_zk_version)]

    @staticmethod
    def _controller_moved(
        epoch_zk_version: int | None, failure: _FailedOp
    ) -> ControllerMovedError | None:
        """ControllerMovedError if `failure` is the epoch check (op 0) of a checked transaction."""
        if (
            epoch_zk_version is not None
            and failure.index == 0
            and isinstance(failure.error, BadVersionError | NoNodeError)
        ):
            return ControllerMovedError(
                f"/controller_epoch is no longer at znode version {epoch_zk_version}"
            )
        return None

    async def checked_multi(self, epoch_zk_version: int, ops: Sequence[ZkOp]) -> list[OpResult]:
        """A controller write: `ops` in one transaction that first checks `/controller_epoch` is
        still at `epoch_zk_version`. ControllerMovedError if it is not (another controller was
        elected since); otherwise like `multi`. Returns the results of `ops` only."""
        outcome = await self._commit([*self._epoch_check(epoch_zk_version), *ops])
        if isinstance(outcome, _FailedOp):
            raise self._controller_moved(epoch_zk_version, outcome) or outcome.error
        return outcome[1:]

    async def chunked_multi(
        self,
        epoch_zk_version: int | None,
        ops: Sequence[ZkOp],
        max_bytes: int = DEFAULT_MAX_MULTI_BYTES,
    ) -> list[OpResult | ZkError]:
        """Apply many independent ops in transactions of at most `max_bytes`, all pipelined.

        Each transaction checks `/controller_epoch` first unless `epoch_zk_version` is None. The
        result list is aligned with `ops`: each op's result, or its own error. When one op fails,
        ZooKeeper aborts its whole transaction; the other ops are resent without it, so one
        partition's stale version does not fail its neighbours (the ops must not depend on each
        other). An op too large to send alone gets ZkRequestTooLargeError. Raises
        ControllerMovedError if the epoch check fails, and connection/session errors as they are.

        Steps: 1. split ops into chunks by encoded size; 2. submit every chunk's transaction before
        awaiting any (they are all in flight at once); 3. settle each chunk, resending survivors.
        """
        results: list[OpResult | ZkError] = [None] * len(ops)
        check = self._epoch_check(epoch_zk_version)
        budget = max_bytes - _TRANSACTION_OVERHEAD - sum(op_size(c, self._chroot) for c in check)
        chunks: list[list[int]] = []
        current: list[int] = []
        used = 0
        for index, op in enumerate(ops):
            size = op_size(op, self._chroot, self._create_acl_bytes)
            if size > budget:
                results[index] = ZkRequestTooLargeError(
                    f"{size}-byte op exceeds the {max_bytes}-byte transaction budget", path=op.path
                )
                continue
            if current and used + size > budget:
                chunks.append(current)
                current, used = [], 0
            current.append(index)
            used += size
        if current:
            chunks.append(current)

        in_flight = [self._submit_transaction([*check, *(ops[i] for i in c)]) for c in chunks]
        outcomes = await asyncio.gather(
            *(
                self._settle_chunk(epoch_zk_version, check, ops, chunk, first, results)
                for chunk, first in zip(chunks, in_flight, strict=True)
            ),
            return_exceptions=True,
        )
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        if errors:
            raise next((e for e in errors if isinstance(e, ControllerMovedError)), errors[0])
        return results

    async def _settle_chunk(
        self,
        epoch_zk_version: int | None,
        check: list[ZkOp],
        ops: Sequence[ZkOp],
        chunk: list[int],
        first: asyncio.Future[Any],
        results: list[OpResult | ZkError],
    ) -> None:
        pending = chunk
        attempt: asyncio.Future[Any] | None = first
        while pending:
            transaction = [*check, *(ops[i] for i in pending)]
            outcome = await self._commit(transaction, first=attempt)
            if not isinstance(outcome, _FailedOp):
                for index, result in zip(pending, outcome[len(check) :], strict=True):
                    results[index] = result
                return
            moved = self._controller_moved(epoch_zk_version, outcome)
            if moved is not None:
                raise moved
            failed = outcome.index - len(check)
            results[pending[failed]] = outcome.error
            pending = pending[:failed] + pending[failed + 1 :]
            attempt = None
