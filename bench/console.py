"""The web console at 10,000 partitions: how fast its pages render, and what it costs the brokers.

One run, one 3-broker local cluster (`metrics.listener` on, as `odradek cluster up` sets it):

1. one CreateTopics request makes a topic of `--partitions` (10,000) partitions;
2. `odradek console --cluster-dir` starts beside it (its own process, as a user runs it);
3. each page is fetched over HTTP `--samples` times, sequentially, and timed end to end (the
   request, ZooKeeper's snapshot or the console's cached one, ListOffsets, metrics, rendering):
   the overview, the topics list, a filtered topics list, the big topic's page (its first 100
   partitions with high watermarks and every replica's log end offset), a later page of it, and
   its record browser (partition 0: its offsets, and no records);
   the first fetch of each is reported apart from the median (it may wait for a refresh);
4. the cost: confluent-kafka produces `--records` 100-byte records (acks=1) into a small topic
   per round; rounds alternate A, B, C, A, B, C: without a console process at all; with the
   console running and a poller doing what a browser tab on the overview does (its live fragment
   every 2 s); and the same plus the big topic's page (its live partitions table every 6 s, which
   needs the log end offsets of the page's replicas: a `/metrics?topic=big&partition=0-99`
   scrape of each broker). The ratio of the medians, in records/s and in the brokers' CPU
   seconds per record, is the cost. The console's own CPU is
   reported too: on this 2-core machine it competes with the brokers for the same cores.
5. between 3 and 4, on the idle cluster, one broker's CPU per scrape and the scrape's time, for
   `--scrapes` scrapes of each kind: every hosted replica's log end offset (what the topic page
   asked for before the filter), one page of the big topic's (what it asks for now), and the
   overview's totals.
6. between 3 and 4, still idle (nothing produced): the brokers' CPU-seconds per second over
   `--idle-seconds` without a console, with the overview's poller, and with the topic page's too
   (the console's scrapes are then nearly all the brokers do, so their cost shows directly).
7. right after 5, `--cold-starts` (3) more consoles, each started afresh (its first ZooKeeper
   snapshot, no client connection yet), whose very first requests are the big topic's page, its
   page 50, its record browser and the topics list: the first fetch as a user who opens a
   bookmarked topic page meets it.

`--rounds 0` skips step 4 and `--skip-idle` step 6:

    .venv/bin/python bench/console.py                      # 10,000 partitions, 3 rounds
    .venv/bin/python bench/console.py --partitions 2000 --records 200000 --rounds 2
    .venv/bin/python bench/console.py --rounds 0 --skip-idle --cold-starts 5   # the pages only
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from odradek.testing import LocalCluster
from odradek.testing.console_process import ConsoleProcess

VALUE = b"v" * 100
BIG = "big"
LOAD = "load"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fetch(url: str) -> tuple[float, str]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as answer:
        text = answer.read().decode()
        if answer.status != 200:
            raise RuntimeError(f"{url}: HTTP {answer.status}")
    return time.perf_counter() - started, text


def produce(bootstrap: str, records: int) -> float:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "1",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_000_000,
            "log_level": 0,
        }
    )
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(LOAD, value=VALUE)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10000 == 0:
            producer.poll(0)
    if producer.flush(300):
        raise RuntimeError("records not acknowledged")
    return records / (time.perf_counter() - started)


class Poller(threading.Thread):
    """What an open browser tab does: the overview's live fragment every 2 s, and with
    `topic_page` the big topic's live partitions table every 6 s too."""

    def __init__(self, base: str, topic_page: bool) -> None:
        super().__init__(daemon=True)
        self.base = base
        self.topic_page = topic_page
        self.stopped = threading.Event()
        self.requests = 0

    def run(self) -> None:
        tick = 0
        while not self.stopped.is_set():
            fetch(self.base + "fragments/overview")
            self.requests += 1
            if self.topic_page and tick % 3 == 0:
                fetch(self.base + f"topics/{BIG}/partitions")
                self.requests += 1
            tick += 1
            self.stopped.wait(2.0)


def time_pages(base: str, samples: int) -> dict[str, dict[str, float]]:
    pages = {
        "overview": "",
        "topics": "topics",
        "topics_filtered": f"topics?q={BIG}",
        "big_topic_page": f"topics/{BIG}",
        "big_topic_page_50": f"topics/{BIG}?page=50",
        "big_topic_records": f"topics/{BIG}/records?partition=0",
    }
    result = {}
    for name, path in pages.items():
        first, _ = fetch(base + path)
        times = [fetch(base + path)[0] for _ in range(samples)]
        result[name] = {
            "first_ms": round(first * 1000, 1),
            "median_ms": round(statistics.median(times) * 1000, 1),
            "max_ms": round(max(times) * 1000, 1),
        }
        print(json.dumps({"page": name, **result[name]}), flush=True)
    return result


def cold_starts(
    cluster: LocalCluster, directory: Path, starts: int
) -> dict[str, dict[str, object]]:
    """The first fetch of each page by a console that has just started, `starts` times."""
    pages = {
        "big_topic_page": f"topics/{BIG}",
        "big_topic_page_50": f"topics/{BIG}?page=50",
        "big_topic_records": f"topics/{BIG}/records?partition=0",
        "topics": "topics",
    }
    firsts: dict[str, list[float]] = {name: [] for name in pages}
    for _ in range(starts):
        console = ConsoleProcess.start(cluster.directory, directory / "cold.log", timeout=60)
        try:
            for name, path in pages.items():
                firsts[name].append(fetch(console.url + path)[0])
        finally:
            console.stop()
    result = {}
    for name, times in firsts.items():
        result[name] = {
            "first_ms": [round(t * 1000, 1) for t in times],
            "max_ms": round(max(times) * 1000, 1),
        }
        print(json.dumps({"cold_start": name, **result[name]}), flush=True)
    return result


def scrape_cost(metrics_url: str, pid: int, scrapes: int) -> dict[str, dict[str, float]]:
    """One broker's CPU-milliseconds per scrape, and the scrape's median wall time, by kind."""
    ends = "name[]=kafka_log_log_logendoffset_value"
    kinds = {
        "all_replicas_log_end_offsets": f"?{ends}",
        "one_page_of_the_big_topic": f"?{ends}&topic={BIG}&partition=0-99",
        "overview_totals": "?name[]=kafka_server_brokertopicmetrics_messagesinpersec_count",
    }
    result = {}
    for kind, query in kinds.items():
        fetch(metrics_url + query)
        cpu = cpu_seconds(pid)
        times = [fetch(metrics_url + query)[0] for _ in range(scrapes)]
        result[kind] = {
            "broker_cpu_ms_per_scrape": round((cpu_seconds(pid) - cpu) / scrapes * 1000, 2),
            "median_ms": round(statistics.median(times) * 1000, 2),
            "bytes": len(fetch(metrics_url + query)[1]),
        }
        print(json.dumps({"scrape": kind, **result[kind]}), flush=True)
    return result


def idle_cost(cluster: LocalCluster, directory: Path, seconds: float) -> dict[str, float]:
    """The brokers' CPU-s per second on the idle cluster, by what watches it."""
    brokers = [b.pid for b in cluster.brokers]
    result = {}
    for mode in ("without", "overview", "overview_and_topic_page"):
        console = poller = None
        if mode != "without":
            console = ConsoleProcess.start(cluster.directory, directory / "idle.log", timeout=60)
            poller = Poller(console.url, topic_page=mode != "overview")
            poller.start()
            time.sleep(3)  # its first rounds (ZooKeeper snapshot, first scrapes) are not the cost
        cpu = sum(cpu_seconds(pid) for pid in brokers)  # type: ignore[arg-type]
        started = time.perf_counter()
        time.sleep(seconds)
        used = sum(cpu_seconds(pid) for pid in brokers) - cpu  # type: ignore[arg-type]
        result[mode] = round(used / (time.perf_counter() - started), 4)
        if poller is not None and console is not None:
            poller.stopped.set()
            poller.join(60)
            console.stop()
        print(json.dumps({"idle": mode, "brokers_cpu_s_per_s": result[mode]}), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--replication-factor", type=int, default=1)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--skip-idle", action="store_true", help="skip step 6")
    parser.add_argument("--cold-starts", type=int, default=3)
    args = parser.parse_args()
    summary: dict[str, object] = {"partitions": args.partitions}
    with tempfile.TemporaryDirectory(prefix="odradek-console-bench-") as directory:
        cluster = LocalCluster.up(Path(directory) / "cluster", 3, timeout=180)
        console: ConsoleProcess | None = None
        try:
            admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 0})
            started = time.perf_counter()
            topics = [
                NewTopic(BIG, args.partitions, args.replication_factor),
                NewTopic(LOAD, 6, 1),
            ]
            for future in admin.create_topics(topics, request_timeout=600).values():
                future.result(600)
            del admin
            console = ConsoleProcess.start(
                cluster.directory, Path(directory) / "console.log", timeout=60
            )
            base = console.url
            # Wait until the console sees every partition with a leader.
            deadline = time.monotonic() + 600
            while True:
                _, text = fetch(base)
                online = re.search(r'id="partitions-online">(\d+) / (\d+)<', text)
                if online and int(online.group(1)) >= args.partitions:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the console never saw {args.partitions} partitions online")
                time.sleep(1)
            summary["create_and_elect_s"] = round(time.perf_counter() - started, 1)
            print(json.dumps({"partitions_online": online.group(0)}), flush=True)
            summary["pages"] = time_pages(base, args.samples)
            first = cluster.brokers[0]
            assert first.metrics is not None and first.pid is not None
            summary["scrapes_of_broker_1"] = scrape_cost(first.metrics, first.pid, args.scrapes)
            console.stop()  # the idle phase starts its own
            console = None
            if args.cold_starts > 0:
                summary["cold_starts"] = cold_starts(cluster, Path(directory), args.cold_starts)
            if not args.skip_idle:
                summary["idle_brokers_cpu_s_per_s"] = idle_cost(
                    cluster, Path(directory), args.idle_seconds
                )
            if args.rounds <= 0:
                print(json.dumps(summary), flush=True)
                return

            brokers = [b.pid for b in cluster.brokers]
            assert all(pid is not None for pid in brokers)
            produce(cluster.bootstrap_servers, 20_000)  # warm-up
            modes = ("without", "overview", "overview_and_topic_page")
            results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
            console_cpu: list[float] = []
            requests = 0
            for round_ in range(args.rounds):
                for mode in modes:
                    poller = None
                    if mode != "without":
                        if console is None:
                            console = ConsoleProcess.start(
                                cluster.directory, Path(directory) / "console.log", timeout=60
                            )
                        poller = Poller(console.url, topic_page=mode != "overview")
                        poller.start()
                    elif console is not None:
                        console.stop()
                        console = None
                    cpu = sum(cpu_seconds(pid) for pid in brokers)  # type: ignore[arg-type]
                    console_cpu_before = cpu_seconds(console.process.pid) if console else 0.0
                    rate = produce(cluster.bootstrap_servers, args.records)
                    per_million = (
                        (
                            sum(cpu_seconds(pid) for pid in brokers) - cpu  # type: ignore[arg-type]
                        )
                        / args.records
                        * 1e6
                    )
                    if poller is not None and console is not None:
                        poller.stopped.set()
                        poller.join(60)
                        requests += poller.requests
                        console_cpu.append(cpu_seconds(console.process.pid) - console_cpu_before)
                    results[mode].append((rate, per_million))
                    print(
                        json.dumps(
                            {
                                "round": round_,
                                "console": mode,
                                "records_per_s": round(rate),
                                "brokers_cpu_s_per_million_records": round(per_million, 2),
                            }
                        ),
                        flush=True,
                    )
        finally:
            if console is not None:
                console.stop()
            cluster.down()
            cluster.kill_all()
    off_rate = statistics.median(r for r, _ in results["without"])
    off_cpu = statistics.median(c for _, c in results["without"])
    summary.update(
        {
            "summary": "console pages at this many partitions; produce throughput with the console"
            " polled as by an open tab (the overview, or the overview and the big topic's page)"
            f" vs no console process (medians of {args.rounds} alternating rounds)",
            "records": args.records,
            "records_per_s_without": round(off_rate),
            "console_requests": requests,
            "console_cpu_s_per_round": [round(c, 2) for c in console_cpu],
        }
    )
    for mode in modes[1:]:
        rate = statistics.median(r for r, _ in results[mode])
        cpu = statistics.median(c for _, c in results[mode])
        summary[f"records_per_s_with_{mode}"] = round(rate)
        summary[f"throughput_ratio_{mode}"] = round(rate / off_rate, 4)
        summary[f"brokers_cpu_ratio_{mode}"] = round(cpu / off_cpu, 4)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
