"""The broker's CPU per Prometheus scrape of `/metrics`: full, and filtered by `name[]`.

One broker (a local cluster, `metrics.listener` on, as `odradek cluster up` sets it), a topic of
`--partitions` partitions, `--records` records produced first (so the request histograms of
Produce, Fetch, Metadata, ... are populated) and a consumer group's offsets committed. Then
rounds of: an idle window, `--scrapes` back-to-back full scrapes, `--scrapes` filtered ones (the
console overview's few `name[]`s). A window's cost is the broker's CPU over it (/proc/<pid>/stat)
minus its idle CPU rate times the window's length; printed per scrape, in milliseconds, one JSON
line per round and a summary with the median and range. Each round's first full scrape is also
timed alone. `--prometheus-headers` scrapes as a Prometheus server does (it asks for
OpenMetrics, gzipped); without, as curl does (the 0.0.4 text). `--save` writes the last full
scrape's text to a file (to compare two builds' output: names, labels and order are the same;
values differ with the run).

`--in-process` measures instead, without a cluster or HTTP, the CPU of a full scrape's snapshot
and text on a fake broker shaped like that one (15 APIs' request histograms, 62 hosted replicas,
a group's 12 offsets), a few requests recorded between scrapes (Produce's and Fetch's histograms
change, the others do not): with the exporter's `TextFormat` and with prometheus_client's
`generate_latest` (what the exporter used before), checking the two texts are the same.

    .venv/bin/python bench/scrape_cpu.py --rounds 5 --scrapes 200
    .venv/bin/python bench/scrape_cpu.py --in-process
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from odradek.testing import LocalCluster

# What the console's overview asks for (a few totals), as a filtered scrape.
FILTERED = (
    "kafka_server_brokertopicmetrics_messagesinpersec_count",
    "kafka_server_brokertopicmetrics_bytesinpersec_count",
    "kafka_server_replicamanager_partitioncount_value",
    "kafka_server_replicamanager_leadercount_value",
    "kafka_server_replicamanager_underreplicatedpartitions_value",
    "kafka_controller_kafkacontroller_activecontrollercount_value",
)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# What a Prometheus server sends (OpenMetrics first), with `--prometheus-headers`.
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}
HEADERS: dict[str, str] = {}


def fetch(url: str) -> bytes:
    request = urllib.request.Request(url, headers=HEADERS)
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read()


def populate(bootstrap: str, topic: str, partitions: int, records: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2})
    for i in range(records):
        producer.produce(topic, value=b"v" * 100, key=str(i).encode())
        if i % 1000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("records not acknowledged")
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "scrape-cpu",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + 60
    seen = 0
    while seen < records and time.monotonic() < deadline:
        seen += len(consumer.consume(1000, 1.0))
    consumer.commit(asynchronous=False)
    consumer.close()


def window(pid: int, action: object, count: int) -> tuple[float, float]:
    """(broker CPU seconds, wall seconds) of `count` calls of `action`."""
    cpu, wall = cpu_seconds(pid), time.perf_counter()
    for _ in range(count):
        action()  # type: ignore[operator]
    return cpu_seconds(pid) - cpu, time.perf_counter() - wall


def fake_broker(rng: random.Random) -> tuple[Any, Any]:
    """A broker and its RequestMetrics, shaped like the cluster's above (for `--in-process`)."""
    from kio.schema.errors import ErrorCode

    from odradek.cluster.broker_topic_stats import BrokerTopicStats
    from odradek.controller.stats import ControllerStats
    from odradek.server.metrics.request_metrics import RequestMetrics

    def replica(topic: str, index: int) -> SimpleNamespace:
        return SimpleNamespace(
            topic=topic,
            partition=index,
            is_leader=True,
            is_under_replicated=False,
            is_under_min_isr=False,
            is_at_min_isr=False,
            leader_high_watermark=-1,
            log_end_offset=1000 + index,
            log_start_offset=0,
            high_watermark=1000 + index,
            log=SimpleNamespace(size_in_bytes=123456 + index),
        )

    topics = {"scrape-cpu": 12, "__consumer_offsets": 50}
    stats = BrokerTopicStats()
    for topic in topics:
        stats.record_append(topic, 20000, 2288816)
    committed = SimpleNamespace(value=SimpleNamespace(offset=1666))
    group = SimpleNamespace(
        group_id="scrape-cpu",
        state=SimpleNamespace(value="Empty"),
        offsets=SimpleNamespace(committed={("scrape-cpu", i): committed for i in range(12)}),
    )
    controller_stats = ControllerStats()
    controller_stats.event_queue.record_ns(50_000)
    broker = SimpleNamespace(
        replica_manager=SimpleNamespace(
            broker_topic_stats=stats,
            partitions={(t, i): replica(t, i) for t, n in topics.items() for i in range(n)},
            offline_partitions=set(),
        ),
        log_manager=SimpleNamespace(failure_channel=SimpleNamespace(offline_log_dirs=set())),
        controller=SimpleNamespace(
            stats=controller_stats,
            is_active=True,
            context=SimpleNamespace(
                offline_partition_count=lambda: 0,
                assignments={t: list(range(n)) for t, n in topics.items()},
            ),
            event_manager=SimpleNamespace(current_event=None, queue_size=0),
        ),
        group_coordinator=SimpleNamespace(
            manager=SimpleNamespace(groups={"scrape-cpu": group}), offset_commits=12
        ),
        socket_servers=[
            SimpleNamespace(
                listener="PLAINTEXT",
                connections={1, 2},
                incoming_bytes=100,
                outgoing_bytes=200,
                connections_created=5,
                connections_closed=3,
                authentications_succeeded=5,
                authentications_failed=0,
                handshakes_failed=0,
            )
        ],
        zk=SimpleNamespace(
            request_count=40,
            request_latency_ms_total=12.5,
            request_latency_ms_max=3.1,
            connected=True,
            session_state="CONNECTED",
        ),
    )
    metrics = RequestMetrics()
    for api_key in (0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 18, 19, 22, 32):
        api = metrics.stats(api_key)
        api.requests = rng.randint(1, 400)
        api.errors[ErrorCode.none] = api.requests
        for histogram in (api.queue, api.local, api.remote, api.total, api.response_send):
            for _ in range(api.requests):
                histogram.record_ns(int(rng.lognormvariate(11, 1.5)))
    return broker, metrics


def in_process(scrapes: int, rounds: int) -> None:
    from prometheus_client.exposition import generate_latest

    from odradek.server.metrics.snapshot import collect
    from odradek.server.metrics.text import TextFormat
    from odradek.server.metrics.timers import expand

    rng = random.Random(1)
    broker, metrics = fake_broker(rng)
    text_format = TextFormat()

    class Snapshot:
        def collect(self) -> list[Any]:
            for api_key in (0, 1):  # Produce and Fetch: a request each since the last scrape
                api = metrics.stats(api_key)
                api.requests += 1
                for histogram in (api.queue, api.local, api.remote, api.total, api.response_send):
                    histogram.record_ns(int(rng.lognormvariate(11, 1.5)))
            return expand(collect(broker, metrics, None, None, defer=True))

    formats = {
        "text_format": lambda: text_format.render(Snapshot().collect()),
        "generate_latest": lambda: generate_latest(Snapshot()),
    }
    families = Snapshot().collect()
    same = text_format.render(families) == generate_latest(_Fixed(families))
    results: dict[str, list[float]] = {name: [] for name in formats}
    for _ in range(rounds):
        for name, scrape in formats.items():
            started = time.process_time()
            for _ in range(scrapes):
                scrape()
            results[name].append((time.process_time() - started) / scrapes * 1000)
    print(
        json.dumps(
            {
                "summary": f"in-process CPU per full scrape, {scrapes} scrapes x {rounds} rounds",
                "same_text": same,
                **{
                    f"{name}_ms_median": round(statistics.median(values), 3)
                    for name, values in results.items()
                },
                **{
                    f"{name}_ms_range": [round(min(values), 3), round(max(values), 3)]
                    for name, values in results.items()
                },
            }
        ),
        flush=True,
    )


class _Fixed:
    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> list[Any]:
        return self.families


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--idle", type=float, default=2.0, help="idle window, seconds")
    parser.add_argument("--save", type=Path, default=None)
    parser.add_argument("--in-process", action="store_true")
    parser.add_argument(
        "--prometheus-headers",
        action="store_true",
        help="scrape as a Prometheus server does: OpenMetrics, gzip",
    )
    args = parser.parse_args()
    if args.prometheus_headers:
        HEADERS.update(PROMETHEUS_HEADERS)
    if args.in_process:
        in_process(args.scrapes, args.rounds)
        return
    full: list[float] = []
    filtered: list[float] = []
    with tempfile.TemporaryDirectory(prefix="odradek-scrape-cpu-") as directory:
        cluster = LocalCluster.up(Path(directory), 1)
        try:
            broker = cluster.brokers[0]
            assert broker.pid is not None and broker.metrics is not None
            pid, url = broker.pid, broker.metrics
            populate(cluster.bootstrap_servers, "scrape-cpu", args.partitions, args.records)
            query = url + "?" + "&".join(f"name[]={n}" for n in FILTERED)
            text = fetch(url)
            for round_ in range(args.rounds):
                time.sleep(0.5)
                cpu, _ = window(pid, lambda: time.sleep(args.idle), 1)
                idle_rate = cpu / args.idle
                first = time.perf_counter()
                text = fetch(url)
                first_ms = (time.perf_counter() - first) * 1000
                cpu, wall = window(pid, lambda: fetch(url), args.scrapes)
                full_ms = max(0.0, cpu - idle_rate * wall) / args.scrapes * 1000
                cpu, wall = window(pid, lambda: fetch(query), args.scrapes)
                filtered_ms = max(0.0, cpu - idle_rate * wall) / args.scrapes * 1000
                full.append(full_ms)
                filtered.append(filtered_ms)
                print(
                    json.dumps(
                        {
                            "round": round_,
                            "idle_cpu_ms_per_s": round(idle_rate * 1000, 2),
                            "full_scrape_cpu_ms": round(full_ms, 3),
                            "filtered_scrape_cpu_ms": round(filtered_ms, 3),
                            "one_full_scrape_wall_ms": round(first_ms, 2),
                        }
                    ),
                    flush=True,
                )
            if args.save is not None:
                args.save.write_bytes(text)
        finally:
            cluster.down()
            cluster.kill_all()
    print(
        json.dumps(
            {
                "summary": f"broker CPU per scrape, {args.scrapes} scrapes x {args.rounds} rounds",
                "partitions": args.partitions,
                "scrape_bytes": len(text),
                "full_ms_median": round(statistics.median(full), 3),
                "full_ms_range": [round(min(full), 3), round(max(full), 3)],
                "filtered_ms_median": round(statistics.median(filtered), 3),
                "filtered_ms_range": [round(min(filtered), 3), round(max(filtered), 3)],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
