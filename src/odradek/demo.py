"""The README's demo: a data pipeline on Spark reading from and writing to a 3-broker Odradek cluster,
surviving a broker killed in the middle of the run.

    ./dev demo            (or: .venv/bin/python -m odradek.demo [--events N] [--rate R] [--keep])

Steps, printed as they happen:
  1. start ZooKeeper and three brokers (the local cluster launcher);
  2. create the input topic `pageviews` (3 partitions, replication factor 3, min.insync.replicas=2);
  3. start the PySpark Structured Streaming job of `pipelines/pageviews` (local SparkSession): it
     reads the topic through the `odradek` data source, computes views and dwell time per page per
     10-second event-time window with a watermark, and writes the windows to Parquet and to the
     topic `pageviews-per-page` through the `odradek` sink;
  4. run the generator (`pipelines/pageviews/generate.py`): page-view events with event-time
     timestamps, some out of order and some late, produced with acks=all;
  5. halfway through, SIGKILL the broker leading partition 0 of the input; restart it later;
  6. once the job has read everything and closed every window, stop it and check that the Parquet
     output equals a batch recomputation over the whole input topic (nothing lost, nothing
     doubled); print the verdict; shut everything down.
Progress (records produced, micro-batches completed, current leaders) is printed every few seconds.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PIPELINE = Path(__file__).resolve().parents[2] / "pipelines" / "pageviews"
INPUT_TOPIC = "pageviews"
OUTPUT_TOPIC = "pageviews-per-page"
PARTITIONS = 3


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Progress:
    """What the demo reports while the pipeline runs."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Consumer
        from confluent_kafka.admin import AdminClient

        quiet = {"log_level": 2}  # the kill is on purpose: no librdkafka connection warnings
        self.admin = AdminClient({"bootstrap.servers": bootstrap, **quiet})
        self.consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "demo-progress", **quiet}
        )

    def produced(self) -> int:
        from confluent_kafka import TopicPartition

        total = 0
        for partition in range(PARTITIONS):
            try:
                _low, high = self.consumer.get_watermark_offsets(
                    TopicPartition(INPUT_TOPIC, partition), timeout=5
                )
            except Exception:
                return -1
            total += high
        return total

    def leaders(self) -> dict[int, int]:
        try:
            topic = self.admin.list_topics(INPUT_TOPIC, timeout=5).topics[INPUT_TOPIC]
        except Exception:
            return {}
        return {p.id: p.leader for p in topic.partitions.values()}

    def close(self) -> None:
        self.consumer.close()


def read_offsets(query: Any) -> int:
    """Input records the query has processed (the sum of its source end offsets)."""
    import json

    progress = query.lastProgress
    if not progress:
        return 0
    end = progress["sources"][0].get("endOffset")
    if isinstance(end, str):
        end = json.loads(end)
    return sum(
        int(o) for partitions in (end or {}).values() for o in partitions.values() if int(o) >= 0
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="odradek.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, help="working directory (default: a temporary one)")
    parser.add_argument("--events", type=int, default=6000, help="page views to generate")
    parser.add_argument("--rate", type=float, default=300, help="records produced per second")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args(argv)

    from confluent_kafka.admin import AdminClient, NewTopic

    from odradek.spark.session import local_session
    from odradek.testing import LocalCluster

    sys.path.insert(0, str(PIPELINE))
    import job  # the pipeline's streaming job (pipelines/pageviews/job.py)
    import verify  # and its batch check

    directory = args.dir or Path(tempfile.mkdtemp(prefix="odradek-demo-"))
    say(f"1. starting ZooKeeper and 3 brokers in {directory}")
    cluster = LocalCluster.up(directory / "cluster", brokers=3)
    spark = None
    queries: list[Any] = []
    generator: subprocess.Popen[str] | None = None
    ok = False
    try:
        bootstrap = cluster.bootstrap_servers
        say(f"   cluster up: bootstrap {bootstrap}, controller is broker {cluster.controller_id()}")

        say(
            f"2. creating topic {INPUT_TOPIC}: {PARTITIONS} partitions, RF=3, min.insync.replicas=2"
        )
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
        config = {"min.insync.replicas": "2"}
        futures = admin.create_topics(
            [
                NewTopic(INPUT_TOPIC, PARTITIONS, 3, config=config),
                NewTopic(OUTPUT_TOPIC, PARTITIONS, 3, config=config),
            ]
        )
        for future in futures.values():
            future.result(60)
        progress = Progress(bootstrap)
        say(f"   leaders of {INPUT_TOPIC}: {progress.leaders()}")

        say("3. starting the Spark Structured Streaming job (local[2]); Spark takes a few seconds")
        spark = local_session("odradek-demo", master="local[2]")
        spark.sparkContext.setLogLevel("ERROR")
        job_args = job.parse_args(
            [
                f"--bootstrap={bootstrap}",
                f"--topics={INPUT_TOPIC}",
                f"--output-topic={OUTPUT_TOPIC}",
                f"--output-dir={directory / 'output' / 'pageviews'}",
                f"--checkpoint-dir={directory / 'checkpoints'}",
                "--trigger=2 seconds",
            ]
        )
        queries = job.start(spark, job_args)
        say("   queries running: " + ", ".join(q.name for q in queries))

        say(f"4. generating {args.events} page views at {args.rate:g} records/s (acks=all)")
        generator = subprocess.Popen(
            [
                sys.executable,
                str(PIPELINE / "generate.py"),
                f"--bootstrap={bootstrap}",
                f"--topic={INPUT_TOPIC}",
                f"--count={args.events}",
                f"--rate={args.rate}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        victim: int | None = None
        restarted = False
        killed_at = 0.0
        deadline = time.monotonic() + args.events / args.rate + 600
        quiet_batches = 0
        last_batch = -1
        while time.monotonic() < deadline:
            time.sleep(3)  # the reporting interval (the demo only observes; nothing waits on it)
            produced = progress.produced()
            batches = max((q.lastProgress or {}).get("batchId", -1) for q in queries) + 1
            read = read_offsets(queries[0])
            leaders = progress.leaders()
            shown = produced if produced >= 0 else "? (leader moving)"
            say(
                f"   produced {shown}, read by Spark {read}, micro-batches {batches}, leaders {leaders}"
            )
            for query in queries:
                if query.exception() is not None:
                    raise RuntimeError(f"query {query.name} failed: {query.exception()}")
            if victim is None and produced >= args.events // 2:
                victim = leaders.get(0)
                if victim is not None and victim >= 0:
                    say(f"5. SIGKILL broker {victim}, the leader of {INPUT_TOPIC}-0")
                    cluster.kill(victim)
                    killed_at = time.monotonic()
            if victim is not None and not restarted and time.monotonic() - killed_at > 15:
                say(f"   restarting broker {victim}")
                cluster.restart(victim)
                restarted = True
            generator_done = generator.poll() is not None
            if generator_done and restarted and produced > 0 and read >= produced:
                progress_now = queries[0].lastProgress or {}
                if progress_now.get("batchId", -1) != last_batch:
                    last_batch = progress_now.get("batchId", -1)
                    quiet_batches += 1 if progress_now.get("numInputRows", 1) == 0 else 0
                if (
                    quiet_batches >= 2
                ):  # the end-of-stream marker's watermark has closed every window
                    break
        else:
            raise RuntimeError("the pipeline did not finish in time")
        output = generator.stdout.read() if generator.stdout else ""
        summary = [line for line in output.splitlines() if line.startswith("{")]
        say(f"   generator: {summary[-1] if summary else output.strip()[-300:]}")
        if generator.returncode != 0:
            raise RuntimeError(f"the generator failed: {output[-500:]}")
        for query in queries:
            query.stop()
        say(f"   job stopped after {batches} micro-batches")

        say(
            "6. checking the Parquet output against a batch recomputation over the whole input topic"
        )
        report = verify.check(
            spark,
            verify.parse_args(
                [
                    f"--bootstrap={bootstrap}",
                    f"--topics={INPUT_TOPIC}",
                    f"--output-dir={directory / 'output' / 'pageviews'}",
                    f"--output-topic={OUTPUT_TOPIC}",
                ]
            ),
        )
        parquet = report["parquet"]
        say(
            f"   {report['expected_windows']} windows expected; Parquet: "
            f"{parquet['missing_count']} missing, {parquet['duplicated_count']} doubled, "
            f"{parquet['wrong_count']} wrong, {parquet['unexpected_count']} unexpected"
        )
        if "topic" in report:
            topic = report["topic"]
            say(
                f"   output topic (at-least-once): {topic['missing_count']} missing, "
                f"{topic['duplicated_count']} repeated, {topic['wrong_count']} wrong"
            )
        ok = bool(report["ok"])
        say(
            "PASS: nothing lost, nothing doubled"
            if ok
            else "FAIL: the output does not match the input"
        )
        progress.close()
    finally:
        for query in queries:
            try:
                query.stop()
            except Exception:
                pass
        if generator is not None and generator.poll() is None:
            generator.kill()
            generator.wait()
        if spark is not None:
            spark.stop()
        if args.keep:
            say(f"leaving the cluster running (odradek cluster down --dir {directory / 'cluster'})")
        else:
            say("shutting down")
            cluster.down()
            if args.dir is None:
                shutil.rmtree(directory, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
