"""Closing a ZooKeeper session from another connection (`odradek.zk.session_close`), against a real
ZooKeeper: what a restarted broker does to its previous process's session (issue 19).

* a live session: closed, its ephemeral znodes deleted by the time the answer comes, and its owner
  learns that its session expired;
* a session that has already ended, or a wrong password: False, and nothing changes (the owner of
  a live session keeps it and its ephemerals);
* no server answering: ConnectionLossError, quickly.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from odradek.zk.client import SessionState, ZkClient
from odradek.zk.errors import ConnectionLossError
from odradek.zk.session_close import close_session
from tests.fixtures.zookeeper import free_port

SCENARIO_TIMEOUT_S = 60.0


def run(scenario: Any) -> None:
    asyncio.run(asyncio.wait_for(scenario, SCENARIO_TIMEOUT_S))


async def owner_with_ephemeral(connect: str) -> tuple[ZkClient, list[SessionState]]:
    """A client (30 s session timeout) holding the ephemeral `/registration`."""
    client = ZkClient(connect, session_timeout_s=30.0)
    states: list[SessionState] = []
    await client.start()
    client.add_state_listener(states.append)
    await client.create("/registration", b"x", ephemeral=True)
    return client, states


async def wait_for(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_a_live_session_is_closed_with_its_ephemerals(zk_chroot: str) -> None:
    async def scenario() -> None:
        owner, states = await owner_with_ephemeral(zk_chroot)
        observer = ZkClient(zk_chroot)
        await observer.start()
        try:
            session_id, password = owner.session_id, owner.session_password
            assert session_id and password
            started = time.monotonic()
            assert await close_session(zk_chroot, session_id, password) is True
            assert time.monotonic() - started < 5.0  # the session timeout is 30 s
            # Gone when the answer came: a read through another session after a sync sees it.
            await observer.sync("/")
            assert await observer.exists("/registration") is None
            # And the owner is told its session expired (kazoo then opens a new one).
            await wait_for(lambda: SessionState.EXPIRED in states, 30.0)
            # Closing it again: ZooKeeper no longer knows it.
            assert await close_session(zk_chroot, session_id, password) is False
        finally:
            await owner.close()
            await observer.close()

    run(scenario())


def test_a_wrong_password_changes_nothing(zk_chroot: str) -> None:
    async def scenario() -> None:
        owner, states = await owner_with_ephemeral(zk_chroot)
        try:
            session_id, password = owner.session_id, owner.session_password
            assert session_id and password
            wrong = bytes(b ^ 0xFF for b in password)
            assert await close_session(zk_chroot, session_id, wrong) is False
            assert await owner.exists("/registration") is not None
            assert owner.session_id == session_id and SessionState.EXPIRED not in states
        finally:
            await owner.close()

    run(scenario())


def test_no_server_answering_is_a_connection_loss() -> None:
    async def scenario() -> None:
        started = time.monotonic()
        with pytest.raises(ConnectionLossError):
            await close_session(f"127.0.0.1:{free_port()}", 0x1234, bytes(16), timeout_s=2.0)
        assert time.monotonic() - started < 5.0

    run(scenario())
