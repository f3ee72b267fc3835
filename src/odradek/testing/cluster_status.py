"""What ZooKeeper says about a cluster: registered brokers, the controller, partition health.

`read_status` is the report behind `odradek cluster status` (and `LocalCluster.status`); the
readers it is built from (`zk_session`, `readread_registrations`, `read_controller`) also serve the
launcher's waits. Everything is read straight from the znodes the brokers and the controller
write, so the report is right even when no broker answers.

Concurrency: coroutines for any event loop. `read_status` opens and closes its own ZooKeeper
session; the other readers use the session they are given, on which concurrent reads are fine
(ZooKeeper pipelines one session's requests).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from odradek.testing.cluster_files import LocalBroker
from odradek.testing.processes import ProcessState
from odradek.zk.client import ZkClient
from odradek.zk.errors import InvalidZNodeDataError
from odradek.zk.znodes import (
    BrokerIdsZNode,
    BrokerIdZNode,
    ControllerEpochZNode,
    ControllerZNode,
    DeleteTopicsZNode,
    TopicPartitionStateZNode,
    TopicsZNode,
    TopicZNode,
)

_ZK_SESSION_TIMEOUT_S = 10.0


@contextlib.asynccontextmanager
async def zk_session(connect: str, timeout: float) -> Any:
    """A ZooKeeper session for a few reads, closed on exit. `timeout` bounds the connect
    (OperatorError when it runs out) and the retries of a read after a lost connection."""
    zk = ZkClient(connect, session_timeout_s=_ZK_SESSION_TIMEOUT_S, connection_loss_retry_s=timeout)
    await zk.start(timeout=timeout)
    try:
        yield zk
    finally:
        await zk.close()


async def read_registrations(zk: ZkClient) -> dict[int, Any]:
    """Broker id -> decoded `/brokers/ids/<id>` (a BrokerInfo, with the broker epoch)."""
    ids = sorted(int(c) for c in await zk.children_or_empty(BrokerIdsZNode.path()) if c.isdigit())
    found = await asyncio.gather(*(zk.get_or_none(BrokerIdZNode.path(i)) for i in ids))
    return {
        broker_id: BrokerIdZNode.decode(broker_id, data, stat.czxid)
        for broker_id, got in zip(ids, found, strict=True)
        if got is not None
        for data, stat in (got,)
    }


async def read_controller(zk: ZkClient) -> int | None:
    """The broker id in `/controller`, or None while there is no controller."""
    got = await zk.get_or_none(ControllerZNode.path())
    return ControllerZNode.decode(got[0], got[1].version).broker_id if got else None


def empty_counts() -> dict[str, int]:
    """Zeroed partition counts, as `read_status` reports them per topic and in total."""
    return {"partitions": 0, "online": 0, "offline": 0, "under_replicated": 0}


async def read_status(connect: str, connect_timeout: float = 10.0) -> dict[str, Any]:
    """Brokers, controller and per-topic partition health, read from ZooKeeper.

    Every read of a level is issued before the first answer is awaited (ZooKeeper pipelines one
    session's requests), so 10,000 partition states cost about one round trip plus the server's
    work. A partition is online when its leader is registered, offline otherwise (leader -1, a
    dead leader, or no state znode yet), and under-replicated when its ISR is smaller than its
    assigned replicas. Returns {"registered": {id: {...}}, "controller": {"id", "epoch"} | None,
    "topics": {name: counts and lists}, "totals": counts}; OperatorError if unreachable.
    """
    async with zk_session(connect, connect_timeout) as zk:
        registrations, controller_raw, epoch_raw, topic_names, deleting = await asyncio.gather(
            read_registrations(zk),
            zk.get_or_none(ControllerZNode.path()),
            zk.get_or_none(ControllerEpochZNode.path()),
            zk.children_or_empty(TopicsZNode.path()),
            zk.children_or_empty(DeleteTopicsZNode.path()),
        )
        topic_names = sorted(topic_names)
        assignments = await asyncio.gather(
            *(zk.get_or_none(TopicZNode.path(t)) for t in topic_names)
        )
        decoded = {
            name: TopicZNode.decode(name, got[0], got[1].version)
            for name, got in zip(topic_names, assignments, strict=True)
            if got is not None
        }
        keys = [(t, p) for t, a in decoded.items() for p in sorted(a.partitions)]
        states = await asyncio.gather(
            *(zk.get_or_none(TopicPartitionStateZNode.path(t, p)) for t, p in keys),
            return_exceptions=True,
        )

    registered = {
        broker_id: {
            "endpoint": f"{info.endpoints[0].host}:{info.endpoints[0].port}"
            if info.endpoints
            else None,
            "rack": info.rack,
            "broker_epoch": info.broker_epoch,
        }
        for broker_id, info in registrations.items()
    }
    controller = None
    if controller_raw is not None:
        epoch = (
            ControllerEpochZNode.decode(epoch_raw[0], epoch_raw[1].version).epoch
            if epoch_raw is not None
            else None
        )
        controller_id = ControllerZNode.decode(controller_raw[0], controller_raw[1].version)
        controller = {"id": controller_id.broker_id, "epoch": epoch}

    topics: dict[str, dict[str, Any]] = {
        topic: {
            **empty_counts(),
            "marked_for_deletion": topic in deleting,
            "offline_partitions": [],
            "under_replicated_partitions": [],
        }
        for topic in decoded
    }
    totals = empty_counts()
    for (topic, partition), got in zip(keys, states, strict=True):
        entry = topics[topic]
        replicas = list(decoded[topic].partitions[partition].replicas)
        leader, isr = -1, []
        if isinstance(got, BaseException):
            raise got
        if got is not None:
            try:
                state = TopicPartitionStateZNode.decode(got[0], got[1].version)
                leader, isr = state.leader, list(state.isr)
            except InvalidZNodeDataError:
                pass  # an undecodable state counts as offline, like a missing one
        detail = {"topic": topic, "partition": partition, "leader": leader}
        detail.update({"replicas": replicas, "isr": isr})
        entry["partitions"] += 1
        if leader >= 0 and leader in registrations:
            entry["online"] += 1
        else:
            entry["offline"] += 1
            entry["offline_partitions"].append(detail)
        if len(isr) < len(replicas):
            entry["under_replicated"] += 1
            entry["under_replicated_partitions"].append(detail)
    for entry in topics.values():
        for key in totals:
            totals[key] += entry[key]
    return {
        "registered": registered,
        "controller": controller,
        "topics": topics,
        "totals": totals,
    }


def local_status(
    directory: Path,
    bootstrap: str,
    zookeeper: dict[str, Any],
    local: Mapping[int, LocalBroker],
    processes: Mapping[int, tuple[int | None, ProcessState]],
    view: dict[str, Any] | None,
) -> dict[str, Any]:
    """`odradek cluster status` of a local cluster: ZooKeeper's view (`read_status`, None when
    ZooKeeper could not be read) merged with what the cluster directory and the process table
    say about each broker (`local`: the brokers of cluster.json; `processes`: pid and state)."""
    zookeeper["reachable"] = view is not None
    registered: dict[int, Any] = view["registered"] if view else {}
    brokers = []
    for broker_id in sorted(set(processes) | set(registered)):
        broker = local.get(broker_id)
        pid, state = processes.get(broker_id, (None, None))
        registration = registered.get(broker_id)
        brokers.append(
            {
                "id": broker_id,
                "registered": (broker_id in registered) if view else None,
                "process_alive": (state is not ProcessState.DEAD) if state else None,
                "process": state.value if state else None,
                "pid": pid if state is not ProcessState.DEAD else None,
                "endpoint": registration["endpoint"]
                if registration
                else (broker.bootstrap if broker else None),
                "rack": registration["rack"] if registration else (broker.rack if broker else None),
                "broker_epoch": registration["broker_epoch"] if registration else None,
            }
        )
    result: dict[str, Any] = {
        "directory": str(directory),
        "bootstrap": bootstrap,
        "zookeeper": zookeeper,
        "brokers": brokers,
    }
    if view is not None:
        result.update({k: v for k, v in view.items() if k != "registered"})
    else:
        result.update({"controller": None, "topics": {}, "totals": empty_counts()})
    return result
