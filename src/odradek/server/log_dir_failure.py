"""The broker's log directory failure handler (Kafka's LogDirFailureHandler thread, KIP-112).

The log layer's failure channel calls `on_offline` once per failed directory, possibly from deep
inside a log operation (an append, a flush, a checkpoint write), so this only queues the directory
and wakes the handler task. The task, for each directory:

1. stops its partitions in the replica manager and forgets its logs
   (`odradek.cluster.log_dir_failure`);
2. if no log directory is left, halts the broker as Kafka does ("Shutdown broker because all log
   dirs ... have failed"): it cannot serve anything, and a clean shutdown would write to failed
   disks;
3. writes `/log_dir_event_notification/log_dir_event_<seq>` so that the controller sends this
   broker LeaderAndIsr for all its replicas, learns from the KAFKA_STORAGE_ERROR answers which are
   offline, marks them offline and moves their leadership; retried until ZooKeeper takes it.

Directories that fail during start-up (before the replica manager exists) wait in the queue until
`start`, which the broker calls once it has registered.

Concurrency: event loop thread only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from odradek.cluster.log_dir_failure import handle_log_dir_failure
from odradek.zk.ops import CreateOp
from odradek.zk.znodes import LogDirEventNotificationSequenceZNode

if TYPE_CHECKING:
    from odradek.cluster.replica_manager import ReplicaManager
    from odradek.zk.client import ZkClient

log = logging.getLogger(__name__)

NOTIFICATION_RETRY_BACKOFF_S = 0.5


def halt_broker(reason: str) -> None:
    """Kafka's Exit.halt(1): no shutdown hooks, no writes to the failed disks."""
    log.critical("halting the broker: %s", reason)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    sys.stderr.flush()
    os._exit(1)


class LogDirFailureHandler:
    """Queue of failed directories and the task that handles them (see the module docstring)."""

    def __init__(
        self,
        broker_id: int,
        replica_manager: Callable[[], ReplicaManager | None],
        zk: Callable[[], ZkClient | None],
        halt: Callable[[str], None] = halt_broker,
    ) -> None:
        self.broker_id = broker_id
        self._replica_manager = replica_manager
        self._zk = zk
        self._halt = halt
        self._pending: list[Path] = []
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.handled: list[Path] = []

    def on_offline(self, log_dir: Path) -> None:
        """The failure channel's listener: queue and wake (never blocks, never does I/O)."""
        self._pending.append(log_dir)
        if self._wakeup is not None:
            self._wakeup.set()

    def start(self) -> None:
        wakeup = self._wakeup = asyncio.Event()
        if self._pending:
            wakeup.set()
        self._task = asyncio.get_running_loop().create_task(self._run(wakeup))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def _run(self, wakeup: asyncio.Event) -> None:
        while True:
            await wakeup.wait()
            wakeup.clear()
            while self._pending:
                log_dir = self._pending.pop(0)
                try:
                    await self._handle(log_dir)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("handling the failure of log directory %s failed", log_dir)

    async def _handle(self, log_dir: Path) -> None:
        replica_manager = self._replica_manager()
        if replica_manager is None:
            return
        # 1. stop the directory's partitions
        handle_log_dir_failure(replica_manager, log_dir)
        self.handled.append(log_dir)
        # 2. nothing left to serve from
        if not replica_manager.log_manager.live_log_dirs:
            self._halt(f"all log directories have failed (last: {log_dir})")
            return
        # 3. tell the controller
        await self._notify_controller()

    async def _notify_controller(self) -> None:
        data = LogDirEventNotificationSequenceZNode.encode(self.broker_id)
        while True:
            zk = self._zk()
            if zk is None:
                return
            try:
                await zk.multi(
                    [CreateOp(LogDirEventNotificationSequenceZNode.path(), data, sequence=True)]
                )
                log.info(
                    "told the controller that a log directory of broker %d failed", self.broker_id
                )
                return
            except Exception as e:
                log.warning("cannot write the log directory event (%s); retrying", e)
                await asyncio.sleep(NOTIFICATION_RETRY_BACKOFF_S)
