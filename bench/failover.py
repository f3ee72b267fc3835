"""Failover times on a local cluster as the number of partitions grows. Prints JSON, one object per
measurement, then one summary object per scenario saying how the time grows with N.

(a) `broker`: SIGKILL a broker (not the controller) that leads N partitions (RF=3 by default) and
    time, from the kill, until every one of them shows a new leader in the Metadata of every
    surviving broker. A killed broker is noticed when ZooKeeper expires its session, so the
    session expiry (`expired_s`) is reported too; `after_expiry_s` is the controller's share.
(b) `controller`: N partitions with leaders spread over the brokers; SIGKILL the controller. Times
    from the kill: `elected_s` (another broker holds `/controller`), `failover_logged_s` (the new
    controller's own "controller failover done in X s", i.e. loading every partition's state from
    ZooKeeper and bringing the brokers up to date), and `moved_s` (every partition the dead
    controller led shows a new leader in every survivor's Metadata; this includes its session
    expiry, since only then does it count as dead).
(c) `shutdown`: SIGTERM a broker leading N partitions (controlled shutdown); `moved_s` until the
    survivors' Metadata shows none of them led by it, `exited_s` until the process is gone, and
    `controller_work_s` from the controller's "controlled shutdown of broker id" to its last
    state-change log line.
`poll_s` is how long the Metadata poll that saw the move took (every survivor asked at once): the
move may have happened that much before `moved_s`. `applied_s` (`applied_after_expiry_s` for
`broker`) is when the last survivor logged applying its LeaderAndIsr, from its log's timestamps:
the new leaders are serving then, whatever a poll of a busy broker takes to answer. `visible_s`
(`visible_after_expiry_s`) is the same for the survivors' last UpdateMetadata line that moved
leaders: from then on a client's Metadata request to any survivor shows the moves.
(d) `restart`: SIGKILL a broker (not the controller) that leads N partitions (RF=3, so it hosts
    them all) and start it again at once. Times from the start command: `registered_s` (its
    `/brokers/ids` registration is back, with a new broker epoch) and `in_sync_s` (every one of
    the N partitions has a leader and the restarted broker in its ISR, in a survivor's Metadata:
    it is serving them as a follower again; leadership stays where the controller moved it until
    a preferred-replica election). Mode `reclaim` is the broker as it is (it closes its previous
    process's ZooKeeper session at start-up, `odradek.server.session_reclaim`); mode `wait`
    deletes its session record first, so it waits for the old session to expire, as before that
    change. `load_average` is the machine's 1-minute load when the kill happened.

Every measurement uses a fresh cluster in a temporary directory (or under `--dir`). Topics are
created with explicit assignments in chunks of `--topic-size` partitions through confluent-kafka's
AdminClient. Times are wall-clock seconds; Metadata is polled about every 100 ms (one full request
takes ~0.1-1 s at these sizes, which bounds the resolution).

    .venv/bin/python bench/failover.py
    .venv/bin/python bench/failover.py --only broker --broker-partitions 1000,10000
    .venv/bin/python bench/failover.py --only controller --controller-partitions 10000,30000,100000 \\
        --controller-replication-factor 2
    .venv/bin/python bench/failover.py --only shutdown --shutdown-partitions 10000
    .venv/bin/python bench/failover.py --only restart --restart-partitions 1000,10000 \\
        --restart-modes reclaim,wait

Never part of the test run.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from failover_cluster import (
    LAST_POLL_S,
    SETUP_TIMEOUT_S,
    STEADY_ISR,
    BenchTimeout,
    all_in_sync,
    all_led,
    assignment_led_by,
    assignment_spread,
    controller_work_s,
    create_partitions,
    emit,
    failover_line,
    last_log_line_s,
    leaders,
    log_offset,
    log_offsets,
    log_time,
    note,
    partition_views,
    registered,
    start_cluster,
    wait_for,
)

from odradek.errors import OdradekError
from odradek.server.session_reclaim import SESSION_FILE
from odradek.testing import tail

MEASURE_TIMEOUT_S = 900.0
# A broker's INFO line for an UpdateMetadata that moved leaders.
METADATA_LINE = "UpdateMetadata from controller"


# ---------------------------------------------------------------------------------------------
# Scenarios


def bench_broker(args: argparse.Namespace, count: int) -> dict[str, Any]:
    cluster = start_cluster(args, f"broker-{count}", STEADY_ISR)
    try:
        controller = cluster.controller_id()
        victim = next(b for b in cluster.broker_ids if b != controller)
        others = [b for b in cluster.broker_ids if b != victim]
        rf = min(args.broker_replication_factor, len(cluster.broker_ids))
        note(f"broker failure, {count} partitions led by broker {victim}: creating")
        created = create_partitions(
            cluster, assignment_led_by(victim, others, count, rf), args.topic_size, "led"
        )
        survivors = [cluster.broker(b) for b in others]
        wait_for(lambda: all_in_sync(survivors[0], created, rf), SETUP_TIMEOUT_S, "full ISRs")
        assert controller is not None
        since = log_offsets(cluster.broker(controller))
        offsets = {b.id: log_offset(b) for b in survivors}
        note("killing")
        started = time.perf_counter()
        started_wall = time.time()
        cluster.kill(victim)
        expired = wait_for(
            lambda: not registered(cluster, victim), MEASURE_TIMEOUT_S, "the session to expire"
        )
        moved = wait_for(
            lambda: all_led(survivors, created, lambda leader: leader not in (victim, -1)),
            MEASURE_TIMEOUT_S,
            "every partition to move",
        )
        applied = last_log_line_s(survivors, offsets, started_wall)
        visible = last_log_line_s(survivors, offsets, started_wall, METADATA_LINE)
        return {
            "bench": "failover",
            "scenario": "broker",
            "brokers": len(cluster.broker_ids),
            "partitions": count,
            "replication_factor": rf,
            "session_timeout_s": args.session_timeout_ms / 1000,
            "expired_s": round(expired - started, 3),
            "moved_s": round(moved - started, 3),
            "after_expiry_s": round(moved - expired, 3),
            "poll_s": round(LAST_POLL_S[0], 3),
            "applied_after_expiry_s": (
                None if applied is None else round(applied - (expired - started), 3)
            ),
            "visible_after_expiry_s": (
                None if visible is None else round(visible - (expired - started), 3)
            ),
            "controller_work_s": controller_work_s(
                cluster.broker(controller), since, f"dead [{victim}]"
            ),
        }
    finally:
        cluster.down(timeout=120)


def bench_controller(args: argparse.Namespace, count: int) -> dict[str, Any]:
    cluster = start_cluster(args, f"controller-{count}")
    try:
        rf = min(args.controller_replication_factor, len(cluster.broker_ids))
        note(f"controller failover, {count} partitions, RF={rf}: creating")
        created = create_partitions(
            cluster, assignment_spread(cluster.broker_ids, count, rf), args.topic_size, "spread"
        )
        controller = cluster.controller_id()
        assert controller is not None
        view = leaders(cluster.broker(controller)) or {}
        led = {p for p in created if view.get(p) == controller}
        survivors = [b for b in cluster.brokers if b.id != controller]
        offsets = {b.id: log_offset(b) for b in survivors}
        note(f"killing controller {controller}, which leads {len(led)} partitions")
        result: dict[str, Any] = {
            "bench": "failover",
            "scenario": "controller",
            "brokers": len(cluster.broker_ids),
            "partitions": count,
            "replication_factor": rf,
            "led_by_dead_controller": len(led),
            "session_timeout_s": args.session_timeout_ms / 1000,
        }
        started = time.perf_counter()
        started_wall = time.time()
        cluster.kill(controller)
        new_controller: list[int] = []

        def elected() -> bool:
            try:
                current = cluster.controller_id()
            except OdradekError:
                return False
            if current is not None and current != controller:
                new_controller.append(current)
                return True
            return False

        # The first winner may not finish (if it loses its session meanwhile, another broker
        # takes over): wait for a failover line from whoever is the controller then.
        logged: list[dict[str, Any]] = []

        def failover_logged() -> bool:
            try:
                current = cluster.controller_id()
            except OdradekError:
                return False
            if current is None or current == controller:
                return False
            line = failover_line(cluster.broker(current), offsets[current])
            if line is not None:
                logged.append({"broker": current, **line})
            return line is not None

        try:
            elected_at = wait_for(elected, MEASURE_TIMEOUT_S, "a new controller")
            result["elected_s"] = round(elected_at - started, 3)
            result["first_elected"] = new_controller[0]
            logged_at = wait_for(
                failover_logged, MEASURE_TIMEOUT_S, "the controller's failover log line"
            )
            result["controller"] = logged[-1]["broker"]
            result["failover_logged_s"] = logged[-1]["seconds"]
            result["failover_log"] = logged[-1]["what"]
            result["log_line_seen_s"] = round(logged_at - started, 3)
            # With RF=1 the dead controller's partitions have nowhere to go.
            moved = wait_for(
                lambda: (
                    rf == 1
                    or all_led(survivors, led, lambda leader: leader not in (controller, -1))
                ),
                MEASURE_TIMEOUT_S,
                "the dead controller's partitions to move",
            )
            result["moved_s"] = round(moved - started, 3) if rf > 1 else None
            result["poll_s"] = round(LAST_POLL_S[0], 3)
            result["applied_s"] = last_log_line_s(survivors, offsets, started_wall)
            result["visible_s"] = last_log_line_s(survivors, offsets, started_wall, METADATA_LINE)
        except BenchTimeout as e:
            result["error"] = str(e)
            try:
                result["controller_at_timeout"] = cluster.controller_id()
            except OdradekError:
                pass
        result["completed_failovers"] = [
            {"broker": b.id, **line}
            for b in survivors
            if (line := failover_line(b, offsets[b.id])) is not None
        ]
        return result
    finally:
        cluster.down(timeout=180)


def bench_shutdown(args: argparse.Namespace, count: int) -> dict[str, Any]:
    cluster = start_cluster(args, f"shutdown-{count}", STEADY_ISR)
    try:
        controller = cluster.controller_id()
        victim = next(b for b in cluster.broker_ids if b != controller)
        others = [b for b in cluster.broker_ids if b != victim]
        rf = min(args.shutdown_replication_factor, len(cluster.broker_ids))
        note(f"controlled shutdown of broker {victim} leading {count} partitions: creating")
        created = create_partitions(
            cluster, assignment_led_by(victim, others, count, rf), args.topic_size, "led"
        )
        survivors = [cluster.broker(b) for b in others]
        wait_for(lambda: all_in_sync(survivors[0], created, rf), SETUP_TIMEOUT_S, "full ISRs")
        assert controller is not None
        since = log_offsets(cluster.broker(controller))
        offsets = {b.id: log_offset(b) for b in survivors}
        result: dict[str, Any] = {}

        def terminate() -> None:
            result["clean"] = cluster.terminate(victim, timeout=MEASURE_TIMEOUT_S)
            result["exited"] = time.perf_counter()

        note("terminating")
        started = time.perf_counter()
        started_wall = time.time()
        thread = threading.Thread(target=terminate)
        thread.start()
        moved = wait_for(
            lambda: all_led(survivors, created, lambda leader: leader not in (victim, -1)),
            MEASURE_TIMEOUT_S,
            "every partition to move",
        )
        thread.join(MEASURE_TIMEOUT_S)
        return {
            "bench": "failover",
            "scenario": "shutdown",
            "brokers": len(cluster.broker_ids),
            "partitions": count,
            "replication_factor": rf,
            "moved_s": round(moved - started, 3),
            "poll_s": round(LAST_POLL_S[0], 3),
            "applied_s": last_log_line_s(survivors, offsets, started_wall),
            "visible_s": last_log_line_s(survivors, offsets, started_wall, METADATA_LINE),
            "exited_s": round(result["exited"] - started, 3),
            "clean_exit": result["clean"],
            "controller_work_s": controller_work_s(
                cluster.broker(controller), since, f"controlled shutdown of broker {victim}"
            ),
        }
    finally:
        cluster.down(timeout=120)


RESTART_PHASES = {
    "logs_loaded": re.compile(r"loaded \d+ logs from"),
    "zookeeper_connected": re.compile(r"ZooKeeper session connected"),
    "registered": re.compile(r"registered /brokers/ids/"),
}


def restart_phases(text: str, started_wall: float) -> dict[str, float]:
    """When the restarted broker's log says it got past each phase, in seconds from the start
    command (log lines have millisecond timestamps; `logs_loaded` includes the interpreter's
    start-up, its imports and the log recovery after the kill)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        for name, pattern in RESTART_PHASES.items():
            if name not in found and pattern.search(line):
                at = log_time(line)
                if at is not None:
                    found[name] = round(at - started_wall, 3)
    return found


def bench_restart(args: argparse.Namespace, count: int, mode: str) -> dict[str, Any]:
    cluster = start_cluster(
        args, f"restart-{mode}-{count}", {"zookeeper.session.reclaim.enable": "true"}
    )
    try:
        controller = cluster.controller_id()
        victim = next(b for b in cluster.broker_ids if b != controller)
        others = [b for b in cluster.broker_ids if b != victim]
        note(f"restart ({mode}) of broker {victim} leading {count} partitions (RF=3): creating")
        created = create_partitions(
            cluster, assignment_led_by(victim, others, count, 3), args.topic_size, "led"
        )
        survivor = cluster.broker(others[0])
        broker = cluster.broker(victim)
        epoch_before = cluster.registered_epochs()[victim]
        since = log_offset(broker)
        note("killing and restarting")
        load = os.getloadavg()[0]
        cluster.kill(victim)
        if mode == "wait":
            (broker.data_dir / SESSION_FILE).unlink()
        started, started_wall = time.perf_counter(), time.time()
        cluster.start_broker(victim, wait=False)

        def registered_anew() -> bool:
            if not cluster.is_alive(victim):
                raise BenchTimeout(f"the restarted broker exited: {tail(broker.log, 1).strip()}")
            try:
                epoch = cluster.registered_epochs().get(victim)
            except OdradekError:
                return False
            return epoch is not None and epoch != epoch_before

        def in_sync() -> bool:
            view = partition_views(survivor)
            return view is not None and all(
                p in view and view[p][0] >= 0 and victim in view[p][1] for p in created
            )

        registered_at = wait_for(registered_anew, MEASURE_TIMEOUT_S, "the registration")
        in_sync_at = wait_for(in_sync, MEASURE_TIMEOUT_S, "every ISR to include it again")
        with open(broker.log, "rb") as file:
            file.seek(since)
            text = file.read().decode(errors="replace")
        return {
            "bench": "failover",
            "scenario": "restart",
            "mode": mode,
            "brokers": len(cluster.broker_ids),
            "partitions": count,
            "replication_factor": 3,
            "session_timeout_s": args.session_timeout_ms / 1000,
            "registered_s": round(registered_at - started, 3),
            "in_sync_s": round(in_sync_at - started, 3),
            "closed_old_session": "of our previous process: its registration" in text,
            "phases_s": restart_phases(text, started_wall),
            "load_average": round(load, 2),
        }
    finally:
        cluster.down(timeout=180)


def growth(scenario: str, key: str, results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """How `key` grows with the partition count: per size, the seconds per 1,000 partitions,
    and the ratio of the largest to the smallest time against the ratio of their sizes."""
    points = [(r["partitions"], r[key]) for r in results if r.get(key) is not None]
    if not points:
        return None
    points.sort()
    summary: dict[str, Any] = {
        "bench": "failover_growth",
        "scenario": scenario,
        "measure": key,
        "points": [{"partitions": n, "seconds": s} for n, s in points],
        "seconds_per_1000": [round(1000 * s / n, 4) for n, s in points],
    }
    if len(points) > 1 and points[0][1] > 0:
        summary["time_ratio"] = round(points[-1][1] / points[0][1], 2)
        summary["size_ratio"] = round(points[-1][0] / points[0][0], 2)
    return summary


def run_restarts(args: argparse.Namespace) -> None:
    for mode in [m.strip() for m in args.restart_modes.split(",") if m.strip()]:
        if mode not in ("reclaim", "wait"):
            raise SystemExit(f"--restart-modes: unknown mode {mode!r} (reclaim, wait)")
        results = []
        for count in [int(n) for n in args.restart_partitions.split(",") if n.strip()]:
            try:
                result = bench_restart(args, count, mode)
            except BenchTimeout as e:
                result = {"bench": "failover", "scenario": "restart", "mode": mode}
                result.update(partitions=count, error=str(e))
            emit(result)
            results.append(result)
        for key in ("registered_s", "in_sync_s"):
            summary = growth(f"restart-{mode}", key, results)
            if summary is not None:
                emit(summary)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(f"signal {signum}")  # so that every cluster is brought down


def main() -> None:
    global MEASURE_TIMEOUT_S
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default="broker,controller,shutdown,restart")
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--broker-partitions", default="1000,10000")
    parser.add_argument("--broker-replication-factor", type=int, default=3)
    parser.add_argument("--controller-partitions", default="10000,30000,100000")
    parser.add_argument("--controller-replication-factor", type=int, default=2)
    parser.add_argument("--shutdown-partitions", default="10000")
    parser.add_argument("--shutdown-replication-factor", type=int, default=3)
    parser.add_argument("--restart-partitions", default="1000,10000")
    parser.add_argument("--restart-modes", default="reclaim,wait")
    parser.add_argument("--topic-size", type=int, default=2000)
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--timeout", type=float, default=MEASURE_TIMEOUT_S)
    parser.add_argument("--dir", type=Path)
    parser.add_argument(
        "--system",
        choices=["odradek", "kafka"],
        default="odradek",
        help="the cluster measured: Odradek, or Apache Kafka 3.9 in ZooKeeper mode"
        " (scenarios broker, controller, shutdown)",
    )
    args = parser.parse_args()
    MEASURE_TIMEOUT_S = args.timeout  # a command-line setting, set once

    scenarios = {
        "broker": (
            bench_broker,
            args.broker_partitions,
            ["after_expiry_s", "controller_work_s", "moved_s"],
        ),
        "controller": (
            bench_controller,
            args.controller_partitions,
            ["failover_logged_s", "moved_s"],
        ),
        "shutdown": (
            bench_shutdown,
            args.shutdown_partitions,
            ["moved_s", "exited_s", "controller_work_s"],
        ),
    }
    for name in [s.strip() for s in args.only.split(",") if s.strip()]:
        if name == "restart":
            if args.system != "odradek":
                raise SystemExit("--only restart: Odradek only")
            run_restarts(args)
            continue
        run, sizes, keys = scenarios[name]
        results = []
        for count in [int(n) for n in sizes.split(",") if n.strip()]:
            try:
                result = run(args, count)
            except BenchTimeout as e:
                result = {"bench": "failover", "scenario": name, "partitions": count}
                result["error"] = str(e)
            result["system"] = args.system
            emit(result)
            results.append(result)
        for key in keys:
            summary = growth(name, key, results)
            if summary is not None:
                emit(summary)


if __name__ == "__main__":
    main()
