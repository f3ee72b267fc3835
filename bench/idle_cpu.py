"""Idle CPU of a 3-broker cluster holding many RF=3 partitions, with and without fetch sessions.

Nothing is produced or consumed: the only work is the followers' replica fetchers long-polling
their leaders (and the brokers' own timers). For each mode, one fresh cluster: `--partitions`
partitions (default 10,000) with RF=3, leaders spread evenly, in topics of `--topic-size`; once
every partition is led and fully in sync, and after `--settle` seconds, each broker's CPU time
(user + system, from /proc/<pid>/stat) is sampled over `--seconds` (default 30) and reported as
a percentage of one core.

Modes (side by side, in one run, alternating when `--rounds` > 1):
* `full`: `max.incremental.fetch.session.cache.slots=0`, so the leaders grant no sessions and
  every follower fetch names every partition — Odradek before fetch sessions (and Kafka's behaviour
  with sessions turned off);
* `sessions`: the default (1,000 slots): after the first full fetch, incremental fetches.

    .venv/bin/python bench/idle_cpu.py                          # 10,000 partitions, 30 s
    .venv/bin/python bench/idle_cpu.py --partitions 1000 --seconds 10 --modes sessions
    .venv/bin/python bench/idle_cpu.py --modes sessions --py-spy /tmp/profiles   # collapsed stacks

Prints one JSON object per measurement, then a summary. Never part of the test run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from failover_cluster import assignment_spread, create_partitions, note
from scratch import temporary_directory

from odradek.testing import LocalCluster

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MODES = {
    "full": {"max.incremental.fetch.session.cache.slots": "0"},
    "sessions": {},
}


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def wait_in_sync(cluster: LocalCluster, timeout: float) -> float:
    started = time.monotonic()
    deadline = started + timeout
    while True:
        status = cluster.status()
        totals = _totals(status)
        if totals and totals["offline"] == 0 and totals["under_replicated"] == 0:
            return time.monotonic() - started
        if time.monotonic() > deadline:
            raise TimeoutError(f"not in sync after {timeout:g}s: {totals}")
        time.sleep(2)


def _totals(status: dict[str, Any]) -> dict[str, int] | None:
    for value in status.values():
        if isinstance(value, dict) and "totals" in value:
            return value["totals"]
    return status.get("totals")


def measure(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    base = args.dir or temporary_directory("odradek-bench-idle-")
    directory = base / f"{mode}-{time.strftime('%H%M%S')}"
    overrides = {"controller.socket.timeout.ms": "120000", **MODES[mode]}
    cluster = LocalCluster.up(directory, 3, overrides=overrides, timeout=300)
    try:
        note(f"{mode}: creating {args.partitions} partitions")
        started = time.monotonic()
        create_partitions(
            cluster,
            assignment_spread(cluster.broker_ids, args.partitions, 3),
            args.topic_size,
            "idle",
        )
        created_s = time.monotonic() - started
        sync_s = wait_in_sync(cluster, 1800)
        note(f"{mode}: in sync; settling {args.settle}s, then measuring {args.seconds}s")
        time.sleep(args.settle)
        pids = {b.id: b.pid for b in cluster.brokers}
        before = {b: cpu_seconds(pid) for b, pid in pids.items() if pid}
        t0 = time.monotonic()
        profiler = None
        if args.py_spy:
            # Sampled from outside the broker (py-spy's own CPU is not counted against it).
            args.py_spy.mkdir(parents=True, exist_ok=True)
            profiler = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "py-spy"),
                    "record",
                    "--pid",
                    str(pids[1]),
                    "--duration",
                    str(int(args.seconds)),
                    "--format",
                    "raw",
                    "--output",
                    str(args.py_spy / f"idle-{mode}-broker-1.txt"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        time.sleep(args.seconds)
        if profiler is not None:
            profiler.wait(timeout=60)
        elapsed = time.monotonic() - t0
        after = {b: cpu_seconds(pid) for b, pid in pids.items() if pid}
        per_broker = {
            str(b): round(100 * (after[b] - before[b]) / elapsed, 1) for b in sorted(before)
        }
        return {
            "bench": "idle_cpu",
            "mode": mode,
            "brokers": 3,
            "partitions": args.partitions,
            "replication_factor": 3,
            "seconds": round(elapsed, 1),
            "cpu_percent_per_broker": per_broker,
            "cpu_percent_mean": round(sum(per_broker.values()) / len(per_broker), 1),
            "create_s": round(created_s, 1),
            "in_sync_s": round(sync_s, 1),
        }
    finally:
        cluster.down(timeout=300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--topic-size", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--modes", default="full,sessions")
    parser.add_argument("--dir", type=Path)
    parser.add_argument(
        "--py-spy", type=Path, help="also profile broker 1 with py-spy into this directory"
    )
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    for _round in range(args.rounds):
        for mode in args.modes.split(","):
            result = measure(args, mode)
            emit(result)
            results.setdefault(mode, []).append(result["cpu_percent_mean"])
    emit({"bench": "idle_cpu", "summary": {m: min(v) for m, v in results.items()}})


if __name__ == "__main__":
    main()
