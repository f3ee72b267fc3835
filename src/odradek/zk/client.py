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
helper, `retry`) resends it, because the session usually survives. A resent write may already have been
applied: callers of conditional writes must treat a BadVersionError after a retry the way Kafka
does (re-read and compare). Requests issued while disconnected wait in kazoo's queue until the
connection returns or the session is found expired.

Transactions (`multi`, `checked_multi`, `chunked_multi`) are in `multi`, a base of `ZkClient`;
their typed ops in `ops`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import posixpath
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState, WatchedEvent, ZnodeStat
from kazoo.retry import KazooRetry
from kazoo.security import ACL

from odradek.errors import OperatorError
from odradek.zk import bulk_read
from odradek.zk.acls import ZkCredentials
from odradek.zk.errors import (
    ConnectionLossError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
    ZkError,
    translate_kazoo_error,
)
from odradek.zk.multi import ZkMulti
from odradek.zk.ops import DeleteOp, acl_bytes
from odradek.zk.retry import retry_on_connection_loss

__all__ = [
    "SessionState",
    "WatchEvent",
    "WatchEventKind",
    "ZkClient",
    "ZnodeStat",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

# get_many of at least this many znodes goes through `bulk_read` (private sessions speaking the
# wire protocol with multiReads of a thousand znodes, ~3-4 µs per read instead of kazoo's
# ~250-300 µs), over at most this many sessions. A bulk read costs ~3-5 ms whatever its size (a
# session opened and closed), which kazoo's reads pass at about 50 znodes.
BULK_READ_MIN = 64
BULK_READ_SESSIONS = 2


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


class ZkClient(ZkMulti):
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

    async def get_or_none(self, path: str) -> tuple[bytes, ZnodeStat] | None:
        """`get`, or None when the znode does not exist."""
        try:
            return await self.get(path)
        except NoNodeError:
            return None

    async def children_or_empty(self, path: str) -> list[str]:
        """`get_children`, or no children when the znode does not exist."""
        try:
            return await self.get_children(path)
        except NoNodeError:
            return []

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
