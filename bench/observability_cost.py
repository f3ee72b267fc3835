"""What scraping metrics and serving the console cost a broker that is the bottleneck.

The question of the operability issue: does watching a broker (a Prometheus scrape of its
`/metrics`, the web console's pages open in a browser) cost it throughput? A broker only loses
throughput to them when it has no CPU to spare, so this bench makes the broker the bottleneck:

* one broker (a local cluster, `metrics.listener` on, as `odradek cluster up` sets it) and a topic
  of `--partitions` partitions;
* the native load generator (`bench/native/loadgen.c`, librdkafka in C, as `bench/peers.py`
  builds it) produces `--records` 100-byte records per round (acks=1, linger 5 ms, 1 MB batches)
  as fast as the broker takes them;
* the broker gets a fixed CPU budget, `--broker-cpu` of one CPU (a cgroup's CFS quota; needs
  root and the cgroup v1 `cpu` controller or cgroup v2), so that it, not the load generator, is
  the bottleneck: its throughput is then its budget over its CPU per record, and whatever the
  watchers make it do comes out of that budget. Without the budget the broker here had CPU to
  spare and the rounds measured the load generator. With `--pin` (the default when the machine
  has 2 or more CPUs) the broker's threads run on CPU 0 and everything else (ZooKeeper, the load
  generator, the console, the scraper, this script) on the others, as a console and Prometheus
  would run on other machines. The broker's CPU per round is reported, so a round in which it
  did not use its budget shows;
* rounds alternate A B B A ... (so a slow drift of the machine falls on both equally), each
  after a `sync` and, as root, an emptied page cache (the topic keeps 64 MB a partition), so
  that no round pays for another's writeback or page reclaim:
  A: nobody watches; B: a scraper fetches the whole `/metrics` every `--interval` seconds (1 s
  by default, fifteen times Prometheus's default) and an `odradek console` process is polled as
  by two open browser tabs (the overview's live fragment every 2 s, a topic's live partitions
  table every 6 s: a `/metrics?topic=...` scrape of the broker and ListOffsets);
* the cost is 1 - (B's records/s / A's records/s), from the medians, and per adjacent A/B pair
  (their median and spread are printed too); the broker's CPU-seconds per million records with
  and without watchers as well.

    .venv/bin/python bench/observability_cost.py --records 3000000 --rounds 8 --broker-cpu 0.25
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from peers import build_loadgen  # noqa: E402

from odradek.testing import LocalCluster  # noqa: E402
from odradek.testing.console_process import ConsoleProcess  # noqa: E402

TOPIC = "observed"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process `pid` (now and, by inheritance, threads it starts later) on `cpus`."""
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(task), cpus)
        except ProcessLookupError:
            pass


class CpuBudget:
    """A cgroup with a CFS quota of `share` of one CPU, for one process and all its threads."""

    def __init__(self, share: float) -> None:
        period = 100_000
        v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
        base = Path("/sys/fs/cgroup") if v2 else Path("/sys/fs/cgroup/cpu")
        self.path = base / f"odradek-bench-{os.getpid()}"
        self.path.mkdir()
        if v2:
            (self.path / "cpu.max").write_text(f"{int(share * period)} {period}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(period))
            (self.path / "cpu.cfs_quota_us").write_text(str(int(share * period)))

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def throttled_s(self) -> float:
        """Time the group spent throttled so far (it was out of budget)."""
        for line in (self.path / "cpu.stat").read_text().splitlines():
            key, value = line.split()
            if key == "throttled_usec":
                return int(value) / 1e6
            if key == "throttled_time":
                return int(value) / 1e9
        return 0.0

    def remove(self) -> None:
        try:
            self.path.rmdir()  # once its processes are gone
        except OSError:
            pass


class Isolation:
    """With `--isolate`: every other process on the machine moved off the broker's CPU for the
    bench (their own affinities given back at the end), so that the broker's budget is there
    for it in every round even when other work shares the machine."""

    def __init__(self) -> None:
        self.saved: dict[int, set[int]] = {}

    def apply(self, broker_pid: int, broker_cpus: set[int]) -> None:
        broker_tasks = {int(t) for t in os.listdir(f"/proc/{broker_pid}/task")}
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == broker_pid:
                continue
            try:
                tasks = [int(t) for t in os.listdir(f"/proc/{entry}/task")]
            except OSError:
                continue
            for task in tasks:
                if task in broker_tasks:
                    continue
                try:
                    cpus = os.sched_getaffinity(task)
                    if cpus & broker_cpus and cpus - broker_cpus:
                        os.sched_setaffinity(task, cpus - broker_cpus)
                        self.saved[task] = cpus
                except OSError:  # gone, or a kernel thread bound to its CPU
                    pass

    def undo(self) -> None:
        for task, cpus in self.saved.items():
            try:
                os.sched_setaffinity(task, cpus)
            except OSError:
                pass


def settle() -> None:
    """Every round starts from the same memory: the last round's writes on disk and the page
    cache emptied (as root), so that no round pays for another's writeback or reclaim."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1")
    except OSError:
        pass


def fetch(url: str) -> int:
    with urllib.request.urlopen(url, timeout=30) as answer:
        body = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{url}: HTTP {answer.status}")
    return len(body)


class Watchers(threading.Thread):
    """A Prometheus-like scraper every `interval` s, and two browser tabs on the console."""

    def __init__(self, metrics_url: str, console_url: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.metrics_url = metrics_url
        self.console_url = console_url
        self.interval = interval
        self.stopped = threading.Event()
        self.scrapes = 0
        self.scrape_bytes = 0
        self.pages = 0
        self.errors: list[str] = []

    def run(self) -> None:
        started = time.monotonic()
        next_scrape = next_overview = next_topic = started
        while not self.stopped.is_set():
            now = time.monotonic()
            try:
                if now >= next_scrape:
                    self.scrape_bytes = fetch(self.metrics_url)
                    self.scrapes += 1
                    next_scrape += self.interval
                if now >= next_overview:
                    fetch(self.console_url + "fragments/overview")
                    self.pages += 1
                    next_overview += 2.0
                if now >= next_topic:
                    fetch(self.console_url + f"topics/{TOPIC}/partitions")
                    self.pages += 1
                    next_topic += 6.0
            except Exception as e:  # a failed fetch is reported, never hidden
                self.errors.append(repr(e)[:200])
                self.stopped.wait(0.5)
            wait = min(next_scrape, next_overview, next_topic) - time.monotonic()
            if wait > 0:
                self.stopped.wait(wait)


def produce(loadgen: Path, bootstrap: str, partitions: int, records: int) -> dict[str, Any]:
    run = subprocess.run(
        [
            str(loadgen),
            "produce",
            bootstrap,
            TOPIC,
            str(partitions),
            str(records),
            "100",
            "1",
            "none",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode != 0 or not lines:
        raise RuntimeError(f"load generator failed: {run.stderr.strip()[-300:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    if result.get("failed"):
        raise RuntimeError(f"load generator: {result['failed']} records failed")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=8, help="A/B pairs")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument(
        "--isolate",
        action="store_true",
        help="move every other process on the machine off the broker's CPU meanwhile (root)",
    )
    parser.add_argument(
        "--broker-cpu", type=float, default=0.25, help="the broker's CPU budget (0: none)"
    )
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    pinned = args.pin if args.pin is not None else len(cpus) >= 2
    results: dict[str, list[dict[str, float]]] = {"unwatched": [], "watched": []}
    watcher_totals = {"scrapes": 0, "pages": 0, "scrape_bytes": 0, "console_cpu_s": 0.0}
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="odradek-observability-cost-") as directory:
        work = Path(directory)
        loadgen, librdkafka = build_loadgen(work)
        if pinned:  # this script, and so everything it starts from now on, off the broker's CPU
            os.sched_setaffinity(0, set(cpus[1:]))
        cluster = LocalCluster.up(
            work / "cluster",
            1,
            timeout=120,
            overrides={"log.retention.check.interval.ms": "2000"},
        )
        console: ConsoleProcess | None = None
        budget = CpuBudget(args.broker_cpu) if args.broker_cpu > 0 else None
        isolation = Isolation() if args.isolate and pinned else None
        try:
            broker = cluster.brokers[0]
            assert broker.pid is not None and broker.metrics is not None
            if pinned:
                pin(broker.pid, {cpus[0]})
            if budget is not None:
                budget.add(broker.pid)
            if isolation is not None:
                isolation.apply(broker.pid, {cpus[0]})
            admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 0})
            # Old segments go as the rounds write new ones, so the page cache does not fill.
            retention = {"retention.bytes": str(64 << 20), "segment.bytes": str(16 << 20)}
            topic = NewTopic(TOPIC, args.partitions, 1, config=retention)
            for future in admin.create_topics([topic]).values():
                future.result(60)
            del admin
            console = ConsoleProcess.start(cluster.directory, work / "console.log", timeout=60)
            produce(loadgen, cluster.bootstrap_servers, args.partitions, args.records // 5)
            order = []
            for pair in range(args.rounds):
                order += ["unwatched", "watched"] if pair % 2 == 0 else ["watched", "unwatched"]
            for index, mode in enumerate(order):
                settle()
                watchers = None
                if mode == "watched":
                    watchers = Watchers(broker.metrics, console.url, args.interval)
                    watchers.start()
                console_cpu = cpu_seconds(console.process.pid)
                throttled = budget.throttled_s() if budget else 0.0
                cpu = cpu_seconds(broker.pid)
                started = time.monotonic()
                result = produce(loadgen, cluster.bootstrap_servers, args.partitions, args.records)
                elapsed = time.monotonic() - started
                broker_cpu = cpu_seconds(broker.pid) - cpu
                if watchers is not None:
                    watchers.stopped.set()
                    watchers.join(60)
                    watcher_totals["scrapes"] += watchers.scrapes
                    watcher_totals["pages"] += watchers.pages
                    watcher_totals["scrape_bytes"] = watchers.scrape_bytes
                    watcher_totals["console_cpu_s"] += (
                        cpu_seconds(console.process.pid) - console_cpu
                    )
                    errors += watchers.errors
                row = {
                    "records_per_s": float(result["records_per_s"]),
                    "broker_cpu_percent": 100 * broker_cpu / elapsed,
                    "broker_cpu_s_per_million": broker_cpu / args.records * 1e6,
                    "broker_throttled_percent": 100
                    * ((budget.throttled_s() if budget else 0.0) - throttled)
                    / elapsed,
                }
                results[mode].append(row)
                print(
                    json.dumps(
                        {
                            "round": index,
                            "mode": mode,
                            **{k: round(v, 2) for k, v in row.items()},
                            **(
                                {"scrapes": watchers.scrapes, "console_pages": watchers.pages}
                                if watchers
                                else {}
                            ),
                        }
                    ),
                    flush=True,
                )
        finally:
            if isolation is not None:
                isolation.undo()
            if console is not None:
                console.stop()
            cluster.down()
            cluster.kill_all()
            if budget is not None:
                budget.remove()
    # Pairs in the order they ran: (0,1), (2,3), ... each one unwatched and one watched round.
    ratios = [
        w["records_per_s"] / u["records_per_s"]
        for u, w in zip(results["unwatched"], results["watched"], strict=True)
    ]
    unwatched = statistics.median(r["records_per_s"] for r in results["unwatched"])
    watched = statistics.median(r["records_per_s"] for r in results["watched"])
    cpu_u = statistics.median(r["broker_cpu_s_per_million"] for r in results["unwatched"])
    cpu_w = statistics.median(r["broker_cpu_s_per_million"] for r in results["watched"])
    print(
        json.dumps(
            {
                "summary": "produce throughput of a saturated broker watched (full /metrics every"
                f" {args.interval:g} s, the console's overview and a topic page open) vs"
                f" unwatched, {args.rounds} alternating pairs of {args.records} records",
                "load_generator": librdkafka,
                "pinned": f"broker on CPU {cpus[0]}, the rest on {cpus[1:]}" if pinned else False,
                "broker_cpu_budget": args.broker_cpu or None,
                "others_moved_off_the_brokers_cpu": len(isolation.saved) if isolation else 0,
                "records_per_s_unwatched": round(unwatched),
                "records_per_s_watched": round(watched),
                "cost_percent_from_medians": round(100 * (1 - watched / unwatched), 2),
                "cost_percent_median_of_pairs": round(100 * (1 - statistics.median(ratios)), 2),
                "pair_ratios": [round(r, 4) for r in ratios],
                "broker_cpu_percent_median": round(
                    statistics.median(
                        r["broker_cpu_percent"] for r in results["unwatched"] + results["watched"]
                    ),
                    1,
                ),
                "broker_cpu_s_per_million_unwatched": round(cpu_u, 3),
                "broker_cpu_s_per_million_watched": round(cpu_w, 3),
                **watcher_totals,
                "console_cpu_s": round(watcher_totals["console_cpu_s"], 2),
                "errors": errors[:5],
                "load_average": os.getloadavg(),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
