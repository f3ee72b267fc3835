"""The ZooKeeper of a local cluster: one server, or an ensemble of three (or five) members.

`ZooKeeperEnsemble` starts `size` real ZooKeeper servers from the installed jars
(`odradek.zk.server`): a standalone server when `size` is 1, otherwise members of one quorum
(QuorumPeerMain, `server.N=` lines naming every member). On loopback the members share 127.0.0.1
and get ports of their own; in a `NetworkLab` each member is a node of its own (`zk1`, `zk2`, ...)
with Kafka's usual ports (2181, 2888, 3888) on its own address, so that a test can partition
members from each other and from the brokers.

Files: `DIR/zookeeper/` for a single server (as before ensembles existed) or
`DIR/zookeeper-<id>/` for a member (`zoo.cfg`, `myid`, `version-2/`); each logs to
`DIR/zookeeper[-<id>].log`.

Faults for tests: `kill`, `pause`/`resume` (SIGSTOP/SIGCONT) and `restart` of one member;
`modes()` tells which member leads. A quorum (a majority of members) must run for the ensemble to
serve; `start()` starts every member before it waits for any.

Concurrency: one owner thread; methods block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from odradek.errors import OperatorError
from odradek.testing.netns import NetworkLab
from odradek.testing.processes import free_ports
from odradek.zk.server import QuorumPeer, ZooKeeperServer, server_mode

CLIENT_PORT = 2181
QUORUM_PORT = 2888
ELECTION_PORT = 3888


def node_name(server_id: int) -> str:
    """The `NetworkLab` node a member runs in."""
    return f"zk{server_id}"


@dataclass
class ZooKeeperEnsemble:
    directory: Path
    size: int
    network: NetworkLab | None = None
    fsync: bool = False
    # The client port of a single server on loopback, when the caller chose it.
    client_port: int | None = None

    def __post_init__(self) -> None:
        if self.size < 1:
            raise OperatorError(f"--zookeepers must be at least 1, not {self.size}")
        self.peers = self._peers()
        self.servers: dict[int, ZooKeeperServer] = {}
        for peer in self.peers:
            data_dir = self.member_dir(peer.id)
            self.servers[peer.id] = ZooKeeperServer(
                peer.client_port,
                data_dir,
                self.directory / (data_dir.name + ".log"),
                fsync=self.fsync,
                host=peer.host,
                server_id=peer.id if self.size > 1 else None,
                ensemble=self.peers if self.size > 1 else (),
                command_prefix=(
                    self.network.exec_prefix(node_name(peer.id)) if self.network else ()
                ),
            )

    def _peers(self) -> tuple[QuorumPeer, ...]:
        if self.network is not None:
            return tuple(
                QuorumPeer(
                    i,
                    self.network.add_node(node_name(i)).address,
                    CLIENT_PORT,
                    QUORUM_PORT,
                    ELECTION_PORT,
                )
                for i in range(1, self.size + 1)
            )
        if self.size == 1 and self.client_port is not None:
            return (QuorumPeer(1, "127.0.0.1", self.client_port, 0, 0),)
        ports = free_ports(3 * self.size, "127.0.0.1")
        return tuple(
            QuorumPeer(i, "127.0.0.1", *ports[3 * (i - 1) : 3 * i]) for i in range(1, self.size + 1)
        )

    def member_dir(self, server_id: int) -> Path:
        return self.directory / ("zookeeper" if self.size == 1 else f"zookeeper-{server_id}")

    @property
    def connect(self) -> str:
        return ",".join(p.connect for p in self.peers)

    @property
    def ids(self) -> list[int]:
        return [p.id for p in self.peers]

    def start(self, timeout: float = 60.0) -> None:
        """Start every member, then wait until each serves (an ensemble elects a leader first)."""
        try:
            for server in self.servers.values():
                server.start(timeout, wait=False)
            for server in self.servers.values():
                server.wait_until_serving(timeout)
        except BaseException:
            self.stop(kill=True)
            raise

    def server(self, server_id: int) -> ZooKeeperServer:
        try:
            return self.servers[server_id]
        except KeyError:
            raise OperatorError(f"no ZooKeeper server {server_id} (servers: {self.ids})") from None

    def kill(self, server_id: int) -> None:
        self.server(server_id).kill()

    def pause(self, server_id: int) -> None:
        self.server(server_id).pause()

    def resume(self, server_id: int) -> None:
        self.server(server_id).resume()

    def restart(self, server_id: int, timeout: float = 60.0, wait: bool = True) -> None:
        """Start a member that was killed, with its data; with `wait`, until it serves (which
        needs a quorum of members running)."""
        server = self.server(server_id)
        server.resume()
        server.kill()
        server.start(timeout, wait=wait)

    @contextlib.contextmanager
    def paused(self, *server_ids: int) -> Iterator[None]:
        for server_id in server_ids:
            self.pause(server_id)
        try:
            yield
        finally:
            for server_id in server_ids:
                self.resume(server_id)

    def modes(self) -> dict[int, str | None]:
        """Each member's `Mode:` (leader, follower, standalone), None if it does not serve."""
        return {p.id: server_mode(p.host, p.client_port, timeout=1.0) for p in self.peers}

    def leader(self) -> int | None:
        return next(
            (i for i, mode in self.modes().items() if mode in ("leader", "standalone")), None
        )

    def pids(self) -> dict[int, int | None]:
        return {i: s.pid for i, s in self.servers.items()}

    def describe(self) -> list[dict[str, Any]]:
        """The members as cluster.json records them."""
        return [
            {
                "id": p.id,
                "host": p.host,
                "port": p.client_port,
                "pid": self.servers[p.id].pid,
                "dir": str(self.member_dir(p.id)),
                "config": str(self.servers[p.id].config_file),
            }
            for p in self.peers
        ]

    def stop(self, kill: bool = False) -> None:
        for server in self.servers.values():
            server.resume()
            if kill:
                server.kill()
            else:
                server.stop()
