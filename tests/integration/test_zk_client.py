"""ZkClient and ZooKeeperServer against a real ZooKeeper server (the session's `zookeeper`).

Each scenario is a coroutine run with `asyncio.run` under an overall deadline; waits are on
asyncio events with deadlines, never fixed sleeps.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from odradek.errors import NotControllerError, OperatorError
from odradek.zk.client import (
    SessionState,
    WatchEvent,
    WatchEventKind,
    ZkClient,
)
from odradek.zk.errors import (
    BadVersionError,
    ClientClosedError,
    ConnectionLossError,
    ControllerMovedError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
    ZkRequestTooLargeError,
)
from odradek.zk.ops import CheckOp, CreateOp, DeleteOp, SetDataOp, op_size
from odradek.zk.retry import retry_on_connection_loss
from odradek.zk.server import (
    ZooKeeperServer,
    find_classpath,
    four_letter_word,
    server_mode,
    wait_for_mode,
)
from odradek.zk.znodes import PERSISTENT_PATHS, ControllerEpochZNode
from tests.fixtures.zookeeper import ZooKeeperHandle, expire_session, free_port

SCENARIO_TIMEOUT_S = 60.0


def run(scenario: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(scenario, SCENARIO_TIMEOUT_S))


async def connected(connect_string: str, **kwargs: Any) -> ZkClient:
    client = ZkClient(connect_string, **kwargs)
    await client.start(timeout=10.0)
    return client


async def wait_for(predicate: Callable[[], bool], changed: asyncio.Event, timeout: float) -> None:
    """Wait until `predicate()` holds, re-checking whenever `changed` is set."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await changed.wait()
            changed.clear()


# -- the server ----------------------------------------------------------------------------


def test_srvr_reports_a_mode_when_serving(zookeeper: ZooKeeperHandle) -> None:
    zookeeper.ensure_running()
    assert server_mode("127.0.0.1", zookeeper.port) == "standalone"
    assert wait_for_mode("127.0.0.1", zookeeper.port, timeout=5.0) == "standalone"
    assert four_letter_word("127.0.0.1", zookeeper.port, "ruok") == "imok"


def test_srvr_readiness_times_out_on_a_closed_port() -> None:
    started = time.monotonic()
    with pytest.raises(OperatorError, match="not serving"):
        wait_for_mode("127.0.0.1", free_port(), timeout=0.5)
    assert time.monotonic() - started < 5.0
    assert server_mode("127.0.0.1", free_port()) is None


def test_server_refuses_a_port_in_use(zookeeper: ZooKeeperHandle, tmp_path: Path) -> None:
    zookeeper.ensure_running()
    second = ZooKeeperServer(zookeeper.port, tmp_path / "second")
    with pytest.raises(OperatorError, match=f"port {zookeeper.port} is in use"):
        second.start(timeout=10.0)
    assert not second.is_running


def test_missing_jars_and_java_are_one_line_operator_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(OperatorError, match=r"zookeeper\.jar not found") as missing_jar:
        find_classpath([tmp_path])
    assert "\n" not in str(missing_jar.value)

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(OperatorError, match="java not found") as missing_java:
        ZooKeeperServer(free_port(), tmp_path / "zk").start(timeout=5.0)
    assert "\n" not in str(missing_java.value)


def test_server_stop_kill_and_restart_keep_data(tmp_path: Path) -> None:
    server = ZooKeeperServer(free_port(), tmp_path / "zk", fsync=False)
    server.start(timeout=30.0)
    try:
        pid = server.pid
        assert pid is not None and server.is_running

        async def write() -> None:
            client = await connected(server.connect_string)
            await client.create("/kept", b"yes")
            await client.close()

        run(write())
        server.kill()
        assert not server.is_running and server.pid is None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        server.start(timeout=30.0)

        async def read() -> None:
            client = await connected(server.connect_string)
            assert (await client.get("/kept"))[0] == b"yes"
            await client.close()

        run(read())
    finally:
        server.stop()
    assert not server.is_running


def test_run_foreground_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    code = (
        "import sys; from pathlib import Path; from odradek.zk.server import run_foreground; "
        f"sys.exit(run_foreground({port}, Path({str(tmp_path / 'zk')!r})))"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        assert wait_for_mode("127.0.0.1", port, timeout=30.0) == "standalone"
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30.0)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, output
    assert b"serving on 127.0.0.1:" in output
    assert server_mode("127.0.0.1", port) is None  # the JVM went with it


# -- the client: single operations ---------------------------------------------------------


def test_create_get_set_delete(zk_chroot: str) -> None:
    async def scenario() -> None:
        client = await connected(zk_chroot)
        try:
            assert await client.exists("/a") is None
            assert await client.create("/a", b"one") == "/a"
            data, stat = await client.get("/a")
            assert (data, stat.version) == (b"one", 0)

            stat = await client.set("/a", b"two", version=0)
            assert stat.version == 1
            with pytest.raises(BadVersionError) as stale:
                await client.set("/a", b"three", version=0)
            assert stale.value.path == "/a"
            assert (await client.get("/a"))[0] == b"two"

            with pytest.raises(NodeExistsError):
                await client.create("/a")
            with pytest.raises(NoNodeError):
                await client.get("/missing")
            with pytest.raises(NoNodeError):
                await client.create("/no/parent")
            assert await client.create("/deep/er/node", b"x", makepath=True) == "/deep/er/node"

            first = await client.create("/a/seq_", sequence=True)
            second = await client.create("/a/seq_", sequence=True)
            assert first < second and first.startswith("/a/seq_")
            assert sorted(await client.get_children("/a")) == sorted(
                p.rsplit("/", 1)[1] for p in (first, second)
            )

            await client.create("/eph", ephemeral=True)
            assert (await client.get("/eph"))[1].ephemeralOwner == client.session_id

            with pytest.raises(NotEmptyError):
                await client.delete("/a")
            with pytest.raises(BadVersionError):
                await client.delete("/a", version=0, recursive=True)
            await client.delete("/a", version=1, recursive=True)
            assert await client.exists("/a") is None
            await client.delete("/deep", recursive=True)
            assert await client.get_children("/") == ["eph"]

            await client.ensure_paths(PERSISTENT_PATHS)
            await client.ensure_paths(PERSISTENT_PATHS)  # idempotent
            for path in PERSISTENT_PATHS:
                assert await client.exists(path) is not None
        finally:
            await client.close()

    run(scenario())


def test_many_calls_in_flight_at_once(zk_chroot: str) -> None:
    async def scenario() -> None:
        client = await connected(zk_chroot)
        try:
            await client.create("/p")
            paths = await asyncio.gather(
                *(client.create(f"/p/{i}", str(i).encode()) for i in range(500))
            )
            assert paths == [f"/p/{i}" for i in range(500)]
            values = await asyncio.gather(*(client.get(f"/p/{i}") for i in range(500)))
            assert [v[0] for v in values] == [str(i).encode() for i in range(500)]
        finally:
            await client.close()

    run(scenario())


# -- watches -------------------------------------------------------------------------------


def test_watches_arrive_on_the_event_loop_thread(zk_chroot: str) -> None:
    async def scenario() -> None:
        client = await connected(zk_chroot)
        writer = await connected(zk_chroot)
        loop_thread = threading.get_ident()
        events: list[tuple[WatchEvent, int]] = []
        arrived = asyncio.Event()

        def on_event(event: WatchEvent) -> None:
            events.append((event, threading.get_ident()))
            arrived.set()

        try:
            await client.create("/w", b"0")
            await client.get("/w", watch=on_event)
            await client.get_children("/w", watch=on_event)
            assert await client.exists("/later", watch=on_event) is None

            await writer.set("/w", b"1")
            await writer.create("/w/child")
            await writer.create("/later")
            await wait_for(lambda: len(events) >= 3, arrived, timeout=10.0)

            assert {(e.kind, e.path) for e, _ in events} == {
                (WatchEventKind.CHANGED, "/w"),
                (WatchEventKind.CHILD, "/w"),
                (WatchEventKind.CREATED, "/later"),
            }
            assert {thread for _, thread in events} == {loop_thread}
        finally:
            await writer.close()
            await client.close()

    run(scenario())


def test_a_watch_is_one_shot_and_registered_once(zk_chroot: str) -> None:
    async def scenario() -> None:
        client = await connected(zk_chroot)
        events: list[WatchEvent] = []
        arrived = asyncio.Event()

        def on_event(event: WatchEvent) -> None:
            events.append(event)
            arrived.set()

        try:
            await client.create("/once")
            await client.create("/marker")
            # The same callback twice on one path is one watch, as with bare kazoo callbacks.
            await client.get("/once", watch=on_event)
            await client.get("/once", watch=on_event)
            await client.set("/once", b"1")
            await client.set("/once", b"2")  # no watch left: must not be reported
            await client.get("/marker", watch=on_event)
            await client.set("/marker", b"m")
            # ZooKeeper delivers one session's events in order: once /marker's event is here,
            # any duplicate or late event for /once would already have arrived.
            await wait_for(lambda: any(e.path == "/marker" for e in events), arrived, 10.0)
            assert [e.path for e in events] == ["/once", "/marker"]
        finally:
            await client.close()

    run(scenario())


# -- transactions --------------------------------------------------------------------------


def test_multi_raises_the_failed_ops_error_and_applies_nothing(zk_chroot: str) -> None:
    async def scenario() -> None:
        client = await connected(zk_chroot)
        try:
            await client.create("/b", b"v0")
            with pytest.raises(BadVersionError) as failure:
                await client.multi(
                    [CreateOp("/new"), SetDataOp("/b", b"v1", version=7), CreateOp("/new2")]
                )
            assert failure.value.path == "/b"
            assert await client.exists("/new") is None  # all or nothing

            with pytest.raises(NodeExistsError):
                await client.multi([CreateOp("/new"), CreateOp("/b")])
            with pytest.raises(NoNodeError):
                await client.multi([DeleteOp("/absent")])
            with pytest.raises(BadVersionError):
                await client.multi([CheckOp("/b", 3), DeleteOp("/b")])

            results = await client.multi(
                [
                    CreateOp("/new", b"n"),
                    SetDataOp("/b", b"v1", version=0),
                    CheckOp("/b", 1),
                    CreateOp("/new/s_", sequence=True),
                    DeleteOp("/new/s_0000000000"),
                ]
            )
            assert results[0] == "/new"
            assert results[1].version == 1
            assert results[2] is None
            assert results[3] == "/new/s_0000000000"
            assert results[4] is None
            assert await client.multi([]) == []
        finally:
            await client.close()

    run(scenario())


def test_checked_multi_fails_once_the_controller_epoch_moves(zk_chroot: str) -> None:
    async def scenario() -> None:
        client = await connected(zk_chroot)
        rival = await connected(zk_chroot)
        try:
            with pytest.raises(ControllerMovedError):  # no /controller_epoch at all
                await client.checked_multi(0, [CreateOp("/x")])
            await client.create(ControllerEpochZNode.path(), ControllerEpochZNode.encode(1))
            epoch_version = (await client.get(ControllerEpochZNode.path()))[1].version

            assert await client.checked_multi(epoch_version, [CreateOp("/x", b"1")]) == ["/x"]
            # A plain op failure is still reported as that op's error.
            with pytest.raises(NodeExistsError):
                await client.checked_multi(epoch_version, [CreateOp("/x")])

            # Another broker wins an election: it bumps the epoch with a conditional write.
            await rival.set(ControllerEpochZNode.path(), ControllerEpochZNode.encode(2), 0)

            with pytest.raises(ControllerMovedError) as moved:
                await client.checked_multi(epoch_version, [SetDataOp("/x", b"zombie")])
            assert isinstance(moved.value, NotControllerError)
            assert moved.value.code.name == "not_controller"
            assert (await client.get("/x"))[0] == b"1"
        finally:
            await rival.close()
            await client.close()

    run(scenario())


def test_chunked_multi_of_twenty_thousand_creates(zk_chroot: str) -> None:
    async def scenario() -> None:
        client = await connected(zk_chroot)
        try:
            await client.create(ControllerEpochZNode.path(), b"1")
            await client.create("/many")
            ops = [CreateOp(f"/many/n{i:05d}", b"v") for i in range(20_000)]
            results = await client.chunked_multi(0, ops)
            assert results == [op.path for op in ops]
            children = await client.get_children("/many")
            assert len(children) == 20_000
            await client.delete("/many", recursive=True)
            assert await client.exists("/many") is None
        finally:
            await client.close()

    run(scenario())


def test_chunked_multi_isolates_failed_ops_across_chunks(zk_chroot: str) -> None:
    async def scenario() -> None:
        client = await connected(zk_chroot)
        try:
            await client.create("/c")
            for i in range(0, 300, 50):
                await client.create(f"/c/{i}")  # every 50th create will collide
            ops: list[Any] = [CreateOp(f"/c/{i}", b"x") for i in range(300)]
            ops.append(CreateOp("/c/huge", b"x" * 5000))
            results = await client.chunked_multi(None, ops, max_bytes=2_000)
            for i in range(300):
                if i % 50 == 0:
                    assert isinstance(results[i], NodeExistsError), i
                    assert results[i].path == f"/c/{i}"
                else:
                    assert results[i] == f"/c/{i}", i
            assert isinstance(results[300], ZkRequestTooLargeError)
            assert len(await client.get_children("/c")) == 300

            await client.create(ControllerEpochZNode.path(), b"5")
            await client.set(ControllerEpochZNode.path(), b"6")  # znode version is now 1
            with pytest.raises(ControllerMovedError):
                await client.chunked_multi(0, [DeleteOp(f"/c/{i}") for i in range(300)], 2_000)
            assert len(await client.get_children("/c")) == 300
        finally:
            await client.close()

    run(scenario())


def test_op_size_matches_the_bytes_kazoo_sends() -> None:
    from kazoo.protocol.serialization import CheckVersion, Create, Delete, SetData
    from kazoo.security import OPEN_ACL_UNSAFE

    header = 9  # each op of a multi() is preceded by a MultiHeader
    chroot = "/t0123"
    cases = [
        (CreateOp("/a/b", b"xyz"), Create(chroot + "/a/b", b"xyz", OPEN_ACL_UNSAFE, 0)),
        (SetDataOp("/a", b"12345", 3), SetData(chroot + "/a", b"12345", 3)),
        (DeleteOp("/a/\u00e9", 1), Delete(chroot + "/a/\u00e9", 1)),
        (CheckOp("/controller_epoch", 7), CheckVersion(chroot + "/controller_epoch", 7)),
    ]
    for op, request in cases:
        assert op_size(op, chroot) == header + len(request.serialize()), op


def test_retry_on_connection_loss_retries_only_connection_loss() -> None:
    async def scenario() -> None:
        calls: list[int] = []

        async def flaky() -> str:
            calls.append(1)
            if len(calls) < 3:
                raise ConnectionLossError("dropped")
            return "ok"

        assert await retry_on_connection_loss(flaky, deadline_s=10.0) == "ok"
        assert len(calls) == 3

        async def expired() -> str:
            calls.append(1)
            raise SessionExpiredError("gone")

        calls.clear()
        with pytest.raises(SessionExpiredError):
            await retry_on_connection_loss(expired, deadline_s=10.0)
        assert len(calls) == 1

        async def always_lost() -> str:
            raise ConnectionLossError("dropped")

        started = time.monotonic()
        with pytest.raises(ConnectionLossError):
            await retry_on_connection_loss(always_lost, deadline_s=0.3)
        assert time.monotonic() - started < 3.0

    run(scenario())


# -- sessions ------------------------------------------------------------------------------


def test_start_against_an_unreachable_port_fails_fast() -> None:
    async def scenario() -> None:
        client = ZkClient(f"127.0.0.1:{free_port()}")
        started = time.monotonic()
        with pytest.raises(OperatorError, match="unreachable") as failure:
            await client.start(timeout=1.0)
        assert time.monotonic() - started < 5.0
        assert "\n" not in str(failure.value)

    run(scenario())


def test_session_expiry_is_reported_and_a_new_session_follows(
    zookeeper: ZooKeeperHandle, zk_chroot: str
) -> None:
    async def scenario() -> None:
        client = await connected(zk_chroot, session_timeout_s=6.0)
        observer = await connected(zk_chroot)
        states: list[tuple[SessionState, int]] = []
        changed = asyncio.Event()

        def on_state(state: SessionState) -> None:
            states.append((state, threading.get_ident()))
            changed.set()

        client.add_state_listener(on_state)
        try:
            await client.create("/registration", ephemeral=True)
            old_session = client.session_id
            assert old_session is not None and client.session_password is not None

            def expired() -> bool:
                return any(s is SessionState.EXPIRED for s, _ in states)

            # The owner may reattach to its session before the second client closes it; then
            # the session survives, so expire again until the owner hears of it.
            async with asyncio.timeout(30.0):
                while not expired():
                    await asyncio.to_thread(
                        expire_session,
                        zookeeper.connect_string,
                        old_session,
                        client.session_password,
                    )
                    try:
                        await wait_for(expired, changed, timeout=5.0)
                    except TimeoutError:
                        continue

            await wait_for(lambda: states[-1][0] is SessionState.CONNECTED, changed, 15.0)
            assert {thread for _, thread in states} == {threading.get_ident()}
            assert client.session_id not in (None, old_session)
            assert await observer.exists("/registration") is None  # the ephemeral went with it
            await client.create("/registration", ephemeral=True)  # the new session works
        finally:
            await observer.close()
            await client.close()

    run(scenario())


def test_a_restart_suspends_the_session_and_drops_watches(
    zookeeper: ZooKeeperHandle, zk_chroot: str
) -> None:
    async def scenario() -> None:
        client = await connected(zk_chroot, session_timeout_s=20.0)
        states: list[SessionState] = []
        watch_events: list[WatchEvent] = []
        changed = asyncio.Event()

        def on_state(state: SessionState) -> None:
            states.append(state)
            changed.set()

        def on_watch(event: WatchEvent) -> None:
            watch_events.append(event)
            changed.set()

        client.add_state_listener(on_state)
        try:
            await client.create("/still-here", b"1", ephemeral=True)
            await client.get("/still-here", watch=on_watch)
            session = client.session_id

            await asyncio.to_thread(zookeeper.stop)
            await wait_for(lambda: SessionState.SUSPENDED in states, changed, 15.0)
            # Issued while disconnected: waits in kazoo's queue until the server is back.
            pending_read = asyncio.ensure_future(client.get("/still-here"))
            await asyncio.to_thread(zookeeper.start)
            await wait_for(lambda: states[-1] is SessionState.CONNECTED, changed, 20.0)

            assert (await pending_read)[0] == b"1"
            assert client.session_id == session  # same session: the ephemeral survived
            assert SessionState.EXPIRED not in states
            assert [e.kind for e in watch_events] == [WatchEventKind.NONE]
        finally:
            zookeeper.ensure_running()
            await client.close()

    run(scenario())


def test_calls_after_close_fail_with_a_project_error(zk_chroot: str) -> None:
    async def scenario() -> None:
        client = await connected(zk_chroot)
        await client.close()
        with pytest.raises(ClientClosedError):
            await client.get("/")

    run(scenario())
