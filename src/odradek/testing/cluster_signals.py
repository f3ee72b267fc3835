"""Stopping a local cluster's processes: SIGKILL (`kill`), SIGSTOP/SIGCONT (`stop`, `cont`),
SIGTERM with a deadline (`terminate`, the broker's controlled shutdown), the whole cluster
(`down`, the controller last; `kill_all` for emergencies), and its private ZooKeeper.

`ClusterSignals` is a mixin of `odradek.testing.local_cluster.LocalCluster` (which holds the
fields it uses, and starts the processes); it is not used on its own. Its methods block.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from odradek.errors import OperatorError
from odradek.testing.cluster_view import ClusterView
from odradek.testing.processes import ClusterProcess, ProcessState, request_exit

if TYPE_CHECKING:
    from odradek.testing.zookeeper_ensemble import ZooKeeperEnsemble


class ClusterSignals(ClusterView):
    """Signals and stopping for `LocalCluster` (module docstring)."""

    _ensemble: ZooKeeperEnsemble | None

    if TYPE_CHECKING:  # defined by LocalCluster

        def _save(self, broker_ids: Iterable[int] | None = None) -> None: ...

    # -- signals ------------------------------------------------------------------------------

    def kill(self, broker_id: int) -> bool:
        """SIGKILL the broker (a crash) and wait until it is gone; False if it was not running."""
        self.broker(broker_id)
        process = self._processes.get(broker_id)
        if process is None or not process.alive:
            self._forget(broker_id)
            return False
        process.kill()
        self._forget(broker_id)
        return True

    def stop(self, broker_id: int, timeout: float = 10) -> None:
        """SIGSTOP: the broker freezes, keeping its sockets and (until it expires) its session.
        Returns once the kernel reports it stopped (signal delivery is asynchronous)."""
        self._signal_running(broker_id, signal.SIGSTOP, ProcessState.STOPPED, timeout)

    def cont(self, broker_id: int, timeout: float = 10) -> None:
        """SIGCONT: resume a broker frozen by `stop`; returns once it runs again."""
        self._signal_running(broker_id, signal.SIGCONT, ProcessState.RUNNING, timeout)

    def _signal_running(
        self, broker_id: int, signum: int, expected: ProcessState, timeout: float
    ) -> None:
        self.broker(broker_id)
        process = self._processes.get(broker_id)
        if process is None or not process.signal(signum):
            raise OperatorError(f"broker {broker_id} is not running")
        self.wait_for(
            lambda: process.state() in (expected, ProcessState.DEAD),
            timeout,
            f"broker {broker_id} to be {expected.value}",
            interval=0.01,
        )

    def terminate(self, broker_id: int, timeout: float = 60) -> bool:
        """SIGTERM (the broker's controlled shutdown), wait up to `timeout`, then SIGKILL.

        True if the broker exited by itself, False if it had to be killed or was not running.
        """
        self.broker(broker_id)
        process = self._processes.get(broker_id)
        if process is None or not process.alive:
            self._forget(broker_id)
            return False
        request_exit(process)
        clean = process.wait(timeout)
        if not clean:
            process.kill()
        self._forget(broker_id)
        return clean

    def _forget(self, broker_id: int) -> None:
        self._processes.pop(broker_id, None)
        if self._brokers[broker_id].pid is not None:
            self._brokers[broker_id].pid = None
            self._save([broker_id])

    def down(self, timeout: float = 60) -> None:
        """SIGTERM the brokers in parallel, SIGKILL those still alive after `timeout`, then stop
        the private ZooKeeper. The directory (data, logs, cluster.json) stays.

        The controller goes last: every other broker's controlled shutdown is a request to the
        controller, and a controller busy shutting down itself may leave such a request
        unanswered until it times out (`controller.socket.timeout.ms`, 30 s by default).
        """
        running = {i: p for i, p in self._processes.items() if p.alive}
        deadline = time.monotonic() + timeout
        try:
            controller = self.controller_id() if running else None
        except OperatorError:  # ZooKeeper unreachable: no controller can be told anything
            controller = None
        last = [controller] if controller in running else []
        for phase in ([i for i in running if i not in last], last):
            for broker_id in phase:
                request_exit(running[broker_id])
            for broker_id in phase:
                process = running[broker_id]
                if not process.wait(deadline - time.monotonic()):
                    process.kill()
        for broker in self._brokers.values():
            broker.pid = None
        self._processes.clear()
        self._stop_zookeeper(kill=False)
        self._save()

    def kill_all(self) -> None:
        """SIGKILL every process of the cluster, ZooKeeper too, and reap them. For emergencies:
        failed start-ups and the test harness's exit hook."""
        for process in list(self._processes.values()):
            with contextlib.suppress(OperatorError):
                process.kill()
        self._processes.clear()
        for broker in self._brokers.values():
            broker.pid = None
        self._stop_zookeeper(kill=True)
        with contextlib.suppress(OSError):
            self._save()

    def _zookeeper_process(self) -> ClusterProcess | None:
        """The private ZooKeeper of a cluster loaded from cluster.json (one started by this
        object is `_ensemble` instead)."""
        info = self.zookeeper
        if info.pid is None or info.config_file is None:
            return None
        return ClusterProcess(info.pid, str(info.config_file))

    def _stop_zookeeper(self, kill: bool) -> None:
        if self._ensemble is not None:
            self._ensemble.stop(kill=kill)
            self._ensemble = None
        elif self.zookeeper.servers:
            for process in self._zookeeper_member_processes():
                if not process.alive:
                    continue
                if kill:
                    process.kill()
                else:
                    process.signal(signal.SIGCONT)
                    process.signal(signal.SIGTERM)
                    if not process.wait(10.0):
                        process.kill()
        else:
            process = self._zookeeper_process()
            if process is not None and process.alive:
                if kill:
                    process.kill()
                else:
                    process.signal(signal.SIGTERM)
                    if not process.wait(10.0):
                        process.kill()
        self.zookeeper.pid = None
        for member in self.zookeeper.servers:
            member["pid"] = None

    def _zookeeper_member_processes(self) -> list[ClusterProcess]:
        """The members of an ensemble of a cluster loaded from cluster.json."""
        return [
            ClusterProcess(m["pid"], m["config"])
            for m in self.zookeeper.servers
            if m.get("pid") is not None
        ]
