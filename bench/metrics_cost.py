"""What a Prometheus scraper costs the produce path: throughput with and without it, one run.

One broker (a local cluster, so `metrics.listener` is on, as `odradek cluster up` sets it), a topic
of `--partitions` partitions. confluent-kafka writes `--records` 100-byte records (acks=1, linger
5 ms) per round; rounds alternate between no scraper and a scraper thread fetching /metrics every
`--interval` seconds (as Prometheus would), A, B, A, B, ... so both see the same machine load. The
ratio of the medians is the cost, in producer throughput and in the broker's CPU seconds per
record. Also reports the scrape's size and median time. The counters on the request path are
always on; what this measures is the scrape itself (the snapshot on the event loop and the HTTP
thread formatting it).

    .venv/bin/python bench/metrics_cost.py --records 300000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
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

VALUE = b"v" * 100


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def produce(bootstrap: str, topic: str, records: int) -> float:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "1",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_000_000,
        }
    )
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=VALUE)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10000 == 0:
            producer.poll(0)
    if producer.flush(300):
        raise RuntimeError("records not acknowledged")
    return records / (time.perf_counter() - started)


class Scraper(threading.Thread):
    """Fetches `url` every `interval` seconds until stopped; records each scrape's time and size."""

    def __init__(self, url: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.interval = interval
        self.stopped = threading.Event()
        self.times: list[float] = []
        self.size = 0

    def run(self) -> None:
        while not self.stopped.is_set():
            started = time.perf_counter()
            with urllib.request.urlopen(self.url, timeout=10) as response:
                self.size = len(response.read())
            self.times.append(time.perf_counter() - started)
            self.stopped.wait(self.interval)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=50)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="odradek-metrics-cost-") as directory:
        cluster = LocalCluster.up(Path(directory), 1)
        try:
            broker = cluster.brokers[0]
            assert broker.pid is not None and broker.metrics is not None
            topic = "metrics-cost"
            admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
            for future in admin.create_topics([NewTopic(topic, args.partitions, 1)]).values():
                future.result(60)
            produce(cluster.bootstrap_servers, topic, 20_000)  # warm-up
            del admin  # its threads would retry the cluster after it is down
            results: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
            scrapes: list[float] = []
            size = 0
            for round_ in range(args.rounds):
                for mode in ("off", "on"):
                    scraper = Scraper(broker.metrics, args.interval) if mode == "on" else None
                    if scraper is not None:
                        scraper.start()
                    cpu = cpu_seconds(broker.pid)
                    rate = produce(cluster.bootstrap_servers, topic, args.records)
                    cpu_per_million = (cpu_seconds(broker.pid) - cpu) / args.records * 1e6
                    if scraper is not None:
                        scraper.stopped.set()
                        scraper.join(30)
                        scrapes.extend(scraper.times)
                        size = scraper.size
                    results[mode].append((rate, cpu_per_million))
                    print(
                        json.dumps(
                            {
                                "round": round_,
                                "scraper": mode,
                                "records_per_s": round(rate),
                                "broker_cpu_s_per_million_records": round(cpu_per_million, 2),
                                "scrapes": len(scraper.times) if scraper else 0,
                            }
                        ),
                        flush=True,
                    )
        finally:
            cluster.down()
            cluster.kill_all()
    off_rate = statistics.median(r for r, _ in results["off"])
    on_rate = statistics.median(r for r, _ in results["on"])
    off_cpu = statistics.median(c for _, c in results["off"])
    on_cpu = statistics.median(c for _, c in results["on"])
    print(
        json.dumps(
            {
                "summary": "produce throughput with a scraper every "
                f"{args.interval}s vs none (medians of {args.rounds} alternating rounds)",
                "records": args.records,
                "partitions": args.partitions,
                "records_per_s_without": round(off_rate),
                "records_per_s_with": round(on_rate),
                "throughput_ratio_with_over_without": round(on_rate / off_rate, 4),
                "broker_cpu_ratio_with_over_without": round(on_cpu / off_cpu, 4),
                "scrape_bytes": size,
                "scrape_median_ms": round(statistics.median(scrapes) * 1000, 2)
                if scrapes
                else None,
                "scrapes": len(scrapes),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
