"""The controller's own work for one event over N partitions, in-process: no ZooKeeper server, no
brokers, no sockets, so that the figures repeat on a loaded machine where `bench/failover.py`'s
wall-clock times vary by tens of percent.

A `KafkaController` runs on the fake ZooKeeper (`tests/fakes/controller_zk.py`, the real
`ControllerZk` over an in-memory tree) with a recording channel (`tests/fakes/channel.py`) and
the state-change log written to a file, as a broker writes it. Three brokers; broker 1 is the
controller; N partitions (topics of 2,000) with AR [2, x, y] (RF=3, led by broker 2). Scenarios:

* `broker`: broker 2's session ends; the BrokerChange event (elect leaders for its N partitions,
  take it out of every ISR, queue LeaderAndIsr/UpdateMetadata);
* `shutdown`: broker 2 asks for a controlled shutdown; the ControlledShutdown event (move its N
  leaderships);
* `failover`: controller 1's ZooKeeper session ends and broker 3's controller starts: its
  Startup event (read every partition's state, bring every broker up to date with LeaderAndIsr
  for all N x 3 replicas and UpdateMetadata).

Per round, one JSON line: `cpu_s` (the process's CPU time during the event: the least noisy
figure here), `wall_s`, `gc_collections` during the event, `encode_s` (encoding the requests the
event queued, as the channel's senders do afterwards), and the 1-minute load average. The fake
ZooKeeper's reads and writes cost Python time of their own (not kazoo's and the server's), so
compare trees with this, not with production.

    .venv/bin/python bench/controller_events.py --partitions 1000,10000 --rounds 3
    # an older tree (e.g. `git archive <commit> src tests | tar -x -C /tmp/old`):
    .venv/bin/python bench/controller_events.py --tree /tmp/old

Never part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

from scratch import temporary_directory

TOPIC_SIZE = 2000


def _import_tree(tree: Path) -> None:
    sys.path.insert(0, str(tree))
    sys.path.insert(0, str(tree / "src"))


async def _nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


def measure(scenario: str, partitions: int, profile: Path | None = None) -> dict[str, Any]:
    from kio.serial import entity_writer
    from tests.fakes.channel import RecordingChannelManager
    from tests.fakes.controller_zk import FakeControllerZk, FakeZooKeeper
    from tests.stateful.test_controller_state_machines import InlineEventQueue

    from odradek.controller import events as ev
    from odradek.controller.controller import KafkaController
    from odradek.controller.states import attach_state_change_log_file

    try:
        # The module that builds the channel manager at failover: where it is patched below.
        from odradek.controller import failover as failover_module
    except ImportError:  # a --tree from before the failover moved out of controller.py
        from odradek.controller import controller as failover_module  # type: ignore[no-redef]

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    tree = FakeZooKeeper()
    admin = FakeControllerZk(tree)
    channels: list[Any] = []

    def new_channel(controller_id: int, timeout: float, *_rest: Any) -> Any:
        channels.append(RecordingChannelManager(controller_id, timeout))
        return channels[-1]

    log_dir = str(temporary_directory("odradek-bench-controller-events-"))
    handler = attach_state_change_log_file(log_dir)
    with mock.patch.object(failover_module, "ControllerChannelManager", new_channel):
        for broker_id in (1, 2, 3):
            admin.register_broker(broker_id)

        def new_controller(broker_id: int, zk: Any) -> tuple[Any, Any]:
            """Broker `broker_id`'s controller on its own session, events run inline."""
            controller = KafkaController(
                broker_id,
                zk.client,
                request_timeout=30.0,
                unclean_leader_election_default=False,
                delete_topic_enable=True,
                register_broker=_nothing,
            )
            queue = InlineEventQueue()
            controller.event_manager = queue
            return controller, queue

        zk = FakeControllerZk(tree)
        controller, queue = new_controller(1, zk)

        def drain() -> None:
            while queue.events:
                loop.run_until_complete(controller.process(queue.events.popleft()))

        queue.put(ev.Startup())
        drain()
        others = (1, 3)
        for start in range(0, partitions, TOPIC_SIZE):
            count = min(TOPIC_SIZE, partitions - start)
            admin.create_topic(
                f"led-{start // TOPIC_SIZE}",
                {p: (2, others[p % 2], others[(p + 1) % 2]) for p in range(count)},
            )
        drain()
        sent_before = len(channels[-1].sent) if scenario != "failover" else 0
        if scenario == "broker":
            admin.deregister_broker(2)
            event = queue.events.popleft()
        elif scenario == "failover":
            # Controller 1's session ends (its broker stays registered: only the controller
            # moves); broker 3's controller starts and takes over.
            tree.expire_session(zk.client.session_id)
            controller, queue = new_controller(3, FakeControllerZk(tree))
            event = ev.Startup()
        else:
            future = loop.create_future()
            epoch = controller.context.live_brokers[2].broker_epoch
            event = ev.ControlledShutdown(2, epoch, future)
        collections: list[int] = []

        def count(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                collections.append(info["generation"])

        gc.callbacks.append(count)
        profiler = cProfile.Profile() if profile else None
        wall, cpu = time.perf_counter(), time.process_time()
        if profiler:
            profiler.enable()
        loop.run_until_complete(controller.process(event))
        if profiler:
            profiler.disable()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        gc.callbacks.remove(count)
        channel = channels[-1]
        if profiler and profile:
            profiler.dump_stats(profile / f"{scenario}-{partitions}.prof")
        queued = channel.sent[sent_before:]
        encode = time.process_time()
        for request in queued:
            entity = request.request
            if hasattr(entity, "body") and hasattr(entity, "entity"):
                continue  # an EncodedRequest: its body was encoded during the event
            entity_writer(type(entity))(io.BytesIO(), entity)
        encode = time.process_time() - encode
    logging.getLogger("state.change").removeHandler(handler)
    handler.close()
    loop.close()
    return {
        "bench": "controller_events",
        "scenario": scenario,
        "partitions": partitions,
        "cpu_s": round(cpu, 3),
        "wall_s": round(wall, 3),
        "gc_collections": len(collections),
        "requests": len(queued),
        "encode_s": round(encode, 3),
        "load_average": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenarios", default="broker,shutdown,failover")
    parser.add_argument("--partitions", default="10000")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--profile",
        type=Path,
        help="a directory: write cProfile statistics of each event there (SCENARIO-N.prof); "
        "the profiler roughly doubles cpu_s",
    )
    parser.add_argument(
        "--tree",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="the source tree to import odradek (src/) and the fakes (tests/) from",
    )
    args = parser.parse_args()
    _import_tree(args.tree.resolve())
    for _ in range(args.rounds):
        for scenario in [s.strip() for s in args.scenarios.split(",") if s.strip()]:
            for partitions in [int(n) for n in args.partitions.split(",") if n.strip()]:
                result = measure(scenario, partitions, args.profile)
                result["tree"] = str(args.tree)
                print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
