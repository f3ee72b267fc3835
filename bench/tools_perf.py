"""`odradek producer-perf-test` / `consumer-perf-test` next to Kafka 3.9.1's own
ProducerPerformance / ConsumerPerformance, against the same broker in one run. Prints one JSON
object per tool and round:

    ./dev bench tools_perf                                  # a fresh 1-broker cluster
    ./dev bench tools_perf --records 300000 --rounds 2 --acks all
    ./dev bench tools_perf --bootstrap-server H:P            # an existing cluster

Each round produces `--records` records of `--record-size` bytes (linger 5 ms, `--acks`) with
both perf tools, alternating which goes first, then consumes them back with both consumer perf
tools (a fresh group each, from the earliest offset). It measures the tools — the Python tools
run confluent-kafka (librdkafka), Kafka's the Java client in a fresh JVM — not only the broker:
use it to see what the tools themselves can drive. Kafka's tools come from `./dev kafka`'s cache;
without them only odradek's rows are printed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.integration._clients import create_topic
from tests.integration._kafka import kafka_libs

from odradek.testing import LocalCluster

PRODUCER_TOTAL = re.compile(
    r"^(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
    r"([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99\.9th\.$"
)
TIMEOUT_S = 600


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def _command(system: str, tool: str) -> list[str] | None:
    if system == "odradek":
        return [sys.executable, "-m", "odradek.cli.main", tool]
    tools = kafka_libs().parent / "tools"
    if not any(tools.glob("kafka-tools-*.jar")):
        return None
    main = {
        "producer-perf-test": "org.apache.kafka.tools.ProducerPerformance",
        "consumer-perf-test": "org.apache.kafka.tools.ConsumerPerformance",
    }[tool]
    return ["java", "-cp", f"{kafka_libs()}/*:{tools}/*", main]


def produce(system: str, bootstrap: str, topic: str, args: argparse.Namespace) -> dict[str, Any]:
    command = _command(system, "producer-perf-test")
    if command is None:
        return {"skipped": "Kafka's tools are not cached: run ./dev kafka"}
    argv = [
        *command, "--topic", topic, "--num-records", str(args.records),
        "--record-size", str(args.record_size), "--throughput", "-1",
        "--producer-props", f"bootstrap.servers={bootstrap}", f"acks={args.acks}", "linger.ms=5",
    ]  # fmt: skip
    result = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    last = (result.stdout.strip().splitlines() or [""])[-1]
    match = PRODUCER_TOTAL.match(last)
    if result.returncode != 0 or match is None:
        return {"error": (result.stderr or last).strip()[-300:]}
    records, rate, mb, avg, peak, p50, p95, p99, p999 = match.groups()
    return {
        "records": int(records),
        "records_per_s": round(float(rate)),
        "mb_per_s": float(mb),
        "latency_ms": {
            "avg": float(avg),
            "p50": int(p50),
            "p95": int(p95),
            "p99": int(p99),
            "p99.9": int(p999),
            "max": float(peak),
        },
    }


def consume(system: str, bootstrap: str, topic: str, records: int) -> dict[str, Any]:
    command = _command(system, "consumer-perf-test")
    if command is None:
        return {"skipped": "Kafka's tools are not cached: run ./dev kafka"}
    argv = [
        *command, "--bootstrap-server", bootstrap, "--topic", topic,
        "--messages", str(records), "--group", f"bench-{uuid.uuid4().hex[:8]}", "--hide-header",
    ]  # fmt: skip
    result = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    fields = (result.stdout.strip().splitlines() or [""])[-1].split(", ")
    if result.returncode != 0 or len(fields) != 10:
        return {"error": (result.stderr or result.stdout).strip()[-300:]}
    return {
        "records": int(fields[4]),
        "records_per_s": round(float(fields[5])),
        "mb_per_s": float(fields[3]),
        "rebalance_ms": int(fields[6]),
    }


def run(bootstrap: str, args: argparse.Namespace) -> None:
    for round_number in range(args.rounds):
        systems = ["odradek", "kafka"] if round_number % 2 == 0 else ["kafka", "odradek"]
        topics = {}
        for system in systems:
            topic = f"tools-perf-{system}-{uuid.uuid4().hex[:8]}"
            create_topic(bootstrap, topic, partitions=args.partitions, replication_factor=-1)
            topics[system] = topic
            emit(
                {
                    "round": round_number,
                    "tool": "producer-perf-test",
                    "system": system,
                    **produce(system, bootstrap, topic, args),
                }
            )
        for system in systems:
            # Each consumer reads the topic its own system's producer wrote (the same shape).
            emit(
                {
                    "round": round_number,
                    "tool": "consumer-perf-test",
                    "system": system,
                    **consume(system, bootstrap, topics[system], args.records),
                }
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap-server", help="an existing cluster (default: start one)")
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--acks", default="1")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    if args.bootstrap_server:
        run(args.bootstrap_server, args)
        return
    with tempfile.TemporaryDirectory(prefix="odradek-tools-perf-") as directory:
        cluster = LocalCluster.up(Path(directory), brokers=1)
        try:
            run(cluster.bootstrap_servers, args)
        finally:
            cluster.down()


if __name__ == "__main__":
    main()
