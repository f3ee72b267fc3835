"""Waiting on a local cluster and reading ZooKeeper's view of it: the half of `LocalCluster`
that talks to the running processes rather than starting and signalling them.

`ClusterView` is a mixin of `odradek.testing.local_cluster.LocalCluster` (which holds the
fields it reads); it is not used on its own. Its methods block; they run their ZooKeeper reads and
broker requests on a private event loop (`run_sync`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from odradek.errors import ClusterTimeoutError, OperatorError
from odradek.testing.cluster_files import LocalBroker, ZooKeeperInfo, run_sync, tail
from odradek.testing.cluster_status import read_controller, read_registrations, zk_session

if TYPE_CHECKING:
    from odradek.testing.processes import ClusterProcess

T = TypeVar("T")

_POLL_INTERVAL_S = 0.05


class ClusterView:
    """Waiting and ZooKeeper reads for `LocalCluster` (module docstring)."""

    directory: Path
    zookeeper: ZooKeeperInfo
    client_config: Path | None
    _brokers: dict[int, LocalBroker]
    _processes: dict[int, ClusterProcess]
    _log_offsets: dict[int, int]

    def broker(self, broker_id: int) -> LocalBroker:
        raise NotImplementedError

    # -- waiting ------------------------------------------------------------------------------

    def wait_for(
        self, condition: Callable[[], T], timeout: float, what: str, interval: float = 0.05
    ) -> T:
        """Poll `condition()` until it returns something truthy, and return that.

        ClusterTimeoutError naming `what` when `timeout` seconds pass first.
        """
        deadline = time.monotonic() + timeout
        while True:
            result = condition()
            if result:
                return result
            if time.monotonic() >= deadline:
                raise ClusterTimeoutError(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(interval)

    def _raise_if_exited(self, broker_ids: Iterable[int]) -> None:
        for broker_id in broker_ids:
            process = self._processes.get(broker_id)
            if process is not None and process.alive:
                continue
            broker = self._brokers[broker_id]
            code = process.popen.returncode if process and process.popen else None
            self._processes.pop(broker_id, None)
            broker.pid = None
            last = tail(broker.log, 20, self._log_offsets.get(broker_id, 0)).strip()
            errors = [line for line in last.splitlines() if "odradek: error:" in line]
            summary = errors[-1].split("odradek: error:", 1)[1].strip() if errors else ""
            status = f"exit code {code}" if code is not None else "exited"
            message = f"broker {broker_id} exited during start-up ({status})"
            message += f": {summary}" if summary else f"; last lines of {broker.log}:\n{last}"
            raise OperatorError(message)

    def registered_epochs(self) -> dict[int, int]:
        """Broker id -> broker epoch (the czxid of its `/brokers/ids` znode: a new one at every
        registration) of every registered broker."""

        async def read() -> dict[int, int]:
            async with zk_session(self.zookeeper.connect, 10.0) as zk:
                return {i: b.broker_epoch for i, b in (await read_registrations(zk)).items()}

        return run_sync(read)

    def _wait_for_cluster(
        self,
        broker_ids: list[int],
        previous_epochs: Mapping[int, int],
        timeout: float,
        need_controller: bool,
    ) -> None:
        """Wait until each of `broker_ids` is registered with an epoch other than its previous
        one (a registration left by a killed predecessor does not count) and, if asked, a
        registered broker holds `/controller`. Fails fast if a broker process exits."""

        async def poll() -> None:
            deadline = time.monotonic() + timeout
            async with zk_session(self.zookeeper.connect, timeout) as zk:
                while True:
                    self._raise_if_exited(broker_ids)
                    registered = await read_registrations(zk)
                    missing = [
                        i
                        for i in broker_ids
                        if i not in registered
                        or registered[i].broker_epoch == previous_epochs.get(i)
                    ]
                    controller = await read_controller(zk) if need_controller else None
                    if (
                        not missing
                        and (not need_controller or controller in registered)
                        and await self._metadata_ready(broker_ids, set(registered))
                    ):
                        return
                    if time.monotonic() >= deadline:
                        waiting = (
                            f"brokers {missing} to register"
                            if missing
                            else "a controller to be elected"
                        )
                        raise ClusterTimeoutError(
                            f"timed out after {timeout:g}s waiting for {waiting} "
                            f"(see the logs in {self.directory})"
                        )
                    await asyncio.sleep(_POLL_INTERVAL_S)

        run_sync(poll)

    async def _metadata_ready(self, broker_ids: list[int], registered: set[int]) -> bool:
        """Has every broker in `broker_ids` had its first UpdateMetadata (it lists every
        registered broker and names a controller)? Until then a client bootstrapping from it
        would see an empty cluster."""
        from odradek.errors import NetworkError
        from odradek.network.client import BrokerConnection
        from odradek.protocol.build import build
        from odradek.protocol.codec import ApiKey, request_class

        request = build(
            request_class(ApiKey.METADATA, 12), {"topics": [], "allow_auto_topic_creation": False}
        )
        security = self.client_security()
        for broker_id in broker_ids:
            broker = self.broker(broker_id)
            try:
                connection = await BrokerConnection.connect(
                    broker.host, broker.port, timeout=5, security=security
                )
                try:
                    answer = await connection.send(ApiKey.METADATA, 12, request, timeout=5)
                finally:
                    connection.close()
            except NetworkError:
                return False
            if answer.controller_id < 0 or not registered <= {b.node_id for b in answer.brokers}:
                return False
        return True

    def client_properties(self) -> dict[str, str]:
        """The client properties the harness connects with ({} for PLAINTEXT)."""
        if self.client_config is None:
            return {}
        from odradek.server.config import parse_properties

        return parse_properties(self.client_config.read_text())

    def client_security(self) -> Any:
        """`client_properties` as a `ClientSecurity` for the project's own client."""
        from odradek.security.client_config import client_security

        return client_security(self.client_properties())

    # -- ZooKeeper's view ---------------------------------------------------------------------

    def controller_id(self) -> int | None:
        """The broker id in `/controller`, or None while there is no controller."""

        async def read() -> int | None:
            async with zk_session(self.zookeeper.connect, 10.0) as zk:
                return await read_controller(zk)

        return run_sync(read)

    def registered_brokers(self) -> list[int]:
        """Broker ids with a registration in `/brokers/ids`."""
        return sorted(self.registered_epochs())
