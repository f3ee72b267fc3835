"""The README's demo: a data pipeline on Spark reading from and writing to a 3-broker Odradek cluster,
surviving a broker killed in the middle of the run.

    ./dev demo            (or: .venv/bin/python -m odradek.demo [--dir DIR] [--events N] [--rate R] [--keep])
    ./dev demo --spark standalone     (the job on a Spark standalone master and two workers)

Steps, printed as they happen:
  1. start ZooKeeper and three brokers (the local cluster launcher), and the web console beside
     them (`odradek console`; its URL is printed: the topic's page shows the leader move and the
     ISR shrink and grow as it happens; `--no-console` leaves it out);
  2. create the input topic `pageviews` (3 partitions, replication factor 3, min.insync.replicas=2);
  3. start the PySpark Structured Streaming job of `pipelines/pageviews` (a local SparkSession; with
     `--spark standalone` its driver on a standalone master and two workers started beside the
     brokers, `odradek.testing.spark_standalone`; `--spark-master URL` for a running cluster): it
     reads the topic through the `odradek` data source, computes views and dwell time per page per
     10-second event-time window with a watermark (its allowed lateness covers a partition left
     without a leader for up to a minute, see FAILOVER_ALLOWANCE_S), and writes the windows to
     Parquet and to the topic `pageviews-per-page` through the `odradek` sink;
  4. run the generator (`pipelines/pageviews/generate.py`): page-view events with event-time
     timestamps, some out of order and some late, produced with acks=all, and last an
     end-of-stream marker that moves the watermark past every window;
  5. halfway through, SIGKILL the broker leading partition 0 of the input; restart it later;
  6. wait until the pipeline has drained (below), stop the job and check that the Parquet output
     equals a batch recomputation over the whole input topic (nothing lost, nothing doubled);
     print the verdict; shut everything down.

When is the pipeline done? Not when Spark goes quiet: Spark runs a micro-batch only when there is
new data or when the watermark requires one, so "no more batches" is not an event anyone can wait
for. The job's own guarantees give a condition instead. Once the generator has exited, its records
(the marker included) are all acknowledged; a query is done when (a) the source offsets of its
last completed micro-batch have reached the topic's end offsets, and (b) a completed micro-batch
ran with a watermark at or past the end of the last window: in append mode that batch emitted
every window and its sink committed them (Spark reports a batch's progress only after the commit).
The demo also waits for the restarted broker to be back in every ISR. A pipeline stuck on any of
these fails after a deadline with a message that says which query, offsets or window it lacked.

Progress (records produced, read by Spark, micro-batches, leaders and ISRs) is printed every few
seconds; Spark's and the clients' own log lines go to `<dir>/demo.log`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from odradek.demo_progress import INPUT_TOPIC, PARTITIONS, Query, TopicWatch, clock

log = logging.getLogger("odradek.demo")

PIPELINE = Path(__file__).resolve().parents[2] / "pipelines" / "pageviews"
OUTPUT_TOPIC = "pageviews-per-page"
REPORT_INTERVAL_S = 3.0
POLL_INTERVAL_S = 0.5
RESTART_AFTER_S = 15.0
DRAIN_TIMEOUT_S = 240.0
EVENT_RATE = 50.0  # page views per second of event time (the generator's clock)
# How long, in wall-clock seconds, one partition may fall behind the others without its records
# counting as late. Spark's watermark is the largest event time read from any partition minus
# the allowed lateness; while the killed broker's partition has no leader (a ZooKeeper session
# timeout, 6 s, then the election) its records wait in the producer while the other partitions
# move the watermark on. The generator's event clock runs `rate / EVENT_RATE` times faster than
# the wall clock (6x at the defaults), so a 30-second allowance in event time -- the job's
# default -- covers only 5 s of outage: too little, and whether any record was dropped as late
# then depended on when Spark happened to run a batch. The allowance below covers a failover
# on a loaded machine with room to spare.
FAILOVER_ALLOWANCE_S = 60.0


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    """An argparse type: a number above zero (argparse prints the one-line error)."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value

    return parse


def allowed_lateness(rate: float, event_rate: float = EVENT_RATE) -> str:
    """The job's watermark delay (a Spark interval) covering FAILOVER_ALLOWANCE_S of outage."""
    return f"{math.ceil(FAILOVER_ALLOWANCE_S * rate / event_rate)} seconds"


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Run:
    """The demo's state while the pipeline runs: the kill, the restart, and the progress lines."""

    def __init__(self, cluster: Any, topic: TopicWatch, queries: list[Query], events: int) -> None:
        self.cluster = cluster
        self.topic = topic
        self.queries = queries
        self.events = events
        self.victim: int | None = None
        self.killed_at = 0.0
        self.restarted = False
        self.produced = 0
        self.next_report = 0.0

    def step(self) -> None:
        """One polling round: report if due, kill and restart on schedule."""
        for query in self.queries:
            query.raise_if_failed()
        now = time.monotonic()
        if now < self.next_report:
            return
        self.next_report = now + REPORT_INTERVAL_S
        produced, missing = self.topic.end_offsets()
        self.produced = produced
        layout = self.topic.layout()
        say("   " + self.describe(produced, missing, layout))
        if self.victim is None and produced >= self.events // 2:
            leader = layout.get(0, (-1, []))[0]
            if leader >= 0:
                self.victim = leader
                say(f"5. SIGKILL broker {leader}, the leader of {INPUT_TOPIC}-0")
                self.cluster.kill(leader)
                self.killed_at = time.monotonic()
        elif (
            self.victim is not None
            and not self.restarted
            and time.monotonic() - self.killed_at >= RESTART_AFTER_S
        ):
            say(f"   restarting broker {self.victim}")
            self.cluster.start_broker(self.victim)
            self.restarted = True
            say(f"   broker {self.victim} is back; it catches up and rejoins the ISRs")

    def describe(self, produced: int, missing: list[int], layout: dict[int, Any]) -> str:
        count = f"produced {produced}"
        if missing:
            unanswered = ", ".join(f"{INPUT_TOPIC}-{p}" for p in missing)
            count = f"produced {produced} so far (last known count for {unanswered})"
        read = min(sum(q.read_offsets().values()) for q in self.queries)
        batches = min(q.batches() for q in self.queries)
        spark = f"read by Spark {read}, micro-batches {batches}"
        return f"{count}; {spark}; {self.describe_layout(layout)}"

    def describe_layout(self, layout: dict[int, tuple[int, list[int]]]) -> str:
        if not layout:
            return "leaders unknown (metadata request failed)"
        parts = []
        for partition, (leader, isr) in sorted(layout.items()):
            if leader < 0 or (leader == self.victim and not self.restarted):
                parts.append(f"p{partition} leader moving from broker {self.victim}")
            elif len(isr) < 3:
                parts.append(f"p{partition} leader {leader} ISR {isr}")
            else:
                parts.append(f"p{partition} leader {leader}")
        return ", ".join(parts)

    def healed(self) -> bool:
        """The restarted broker is back in every ISR of the input topic."""
        layout = self.topic.layout()
        return bool(layout) and all(len(isr) == 3 for _leader, isr in layout.values())


@contextlib.contextmanager
def output_to(log_file: Path) -> Iterator[None]:
    """Send this process's stdout and stderr file descriptors to `log_file` for the duration:
    processes started meanwhile (Spark's JVM, and through it the Python workers) inherit it and
    write their log lines there for their whole life, not on the demo's terminal."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_file, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def start_console(directory: Path, port: int | None) -> Any:
    """The web console beside the cluster (its output in console.log), or None if it did not
    start within its deadline: the demo goes on without it."""
    from odradek.errors import OperatorError
    from odradek.testing.console_process import ConsoleProcess

    try:
        console = ConsoleProcess.start(
            directory / "cluster", directory / "console.log", port=port, timeout=20.0
        )
    except OperatorError as e:
        log.warning("the console did not start: %s", e)
        say("   the web console did not start (see console.log); going on without it")
        return None
    say(f"   web console: {console.url} -- open it to watch the leaders move and the ISRs")
    say(f"   shrink and grow: {console.url}topics/{INPUT_TOPIC}")
    return console


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="odradek.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, help="working directory (default: a temporary one)")
    parser.add_argument(
        "--events", type=_positive(int), default=6000, help="page views to generate"
    )
    parser.add_argument(
        "--rate", type=_positive(float), default=300, help="records produced per second"
    )
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    parser.add_argument(
        "--console-port", type=int, help="the web console's port (default: a free one)"
    )
    parser.add_argument("--no-console", action="store_true", help="do not start the web console")
    parser.add_argument(
        "--spark",
        choices=["local", "standalone"],
        default="local",
        help="run the job in a local SparkSession (default) or on a Spark standalone cluster"
        " (a master and two workers started beside the brokers)",
    )
    parser.add_argument("--spark-master", help="run the job on this running Spark master instead")
    args = parser.parse_args(argv)

    from confluent_kafka.admin import AdminClient, NewTopic

    from odradek.errors import OperatorError
    from odradek.testing import LocalCluster
    from odradek.testing.spark_standalone import SparkStandalone

    sys.path.insert(0, str(PIPELINE))
    import job  # the pipeline's streaming job (pipelines/pageviews/job.py)
    import verify  # and its batch check
    from pageviews import DEFAULT_WINDOW, window_end

    directory = args.dir or Path(tempfile.mkdtemp(prefix="odradek-demo-"))
    directory.mkdir(parents=True, exist_ok=True)
    log_file = directory / "demo.log"
    log_handler = logging.FileHandler(log_file)
    log_handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    logging.getLogger().addHandler(log_handler)
    logging.getLogger().setLevel(logging.INFO)
    # SIGTERM (a terminal closed, `kill`) unwinds like Ctrl-C, so the cluster is brought down.
    signal.signal(signal.SIGTERM, _interrupt)
    started = time.monotonic()
    say(f"1. starting ZooKeeper and 3 brokers in {directory}")
    cluster = LocalCluster.up(directory / "cluster", brokers=3)
    spark = None
    standalone = None
    master = args.spark_master or "local[2]"
    queries: list[Query] = []
    generator: subprocess.Popen[str] | None = None
    console = None
    ok = False
    try:
        bootstrap = cluster.bootstrap_servers
        say(f"   cluster up: bootstrap {bootstrap}, controller is broker {cluster.controller_id()}")
        if not args.no_console:
            console = start_console(directory, args.console_port)
        if args.spark == "standalone" and not args.spark_master:
            standalone = SparkStandalone.start(directory / "cluster", workers=2)
            master = standalone.master_url
            say(
                f"   Spark standalone: master {master}, 2 workers (web UI {standalone.master.web_ui})"
            )

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
        topic = TopicWatch(bootstrap)
        leaders = {p: leader for p, (leader, _isr) in sorted(topic.layout().items())}
        say(f"   leaders of {INPUT_TOPIC} (partition: broker): {leaders}")

        say(f"3. starting the Spark Structured Streaming job ({master}); Spark's log: demo.log")
        with output_to(log_file):
            from odradek.spark.session import local_session

            spark = local_session("odradek-demo", master=master)
        spark.sparkContext.setLogLevel("ERROR")
        watermark = allowed_lateness(args.rate)
        job_args = job.parse_args(
            [
                f"--bootstrap={bootstrap}",
                f"--topics={INPUT_TOPIC}",
                f"--output-topic={OUTPUT_TOPIC}",
                f"--output-dir={directory / 'output' / 'pageviews'}",
                f"--checkpoint-dir={directory / 'checkpoints'}",
                "--trigger=2 seconds",
                f"--watermark={watermark}",
            ]
        )
        queries = [Query(q) for q in job.start(spark, job_args)]
        say("   queries running: " + ", ".join(q.name for q in queries))
        # The first micro-batch starts Spark's Python workers and compiles the plan: it takes
        # seconds on this kind of machine, so the demo lets it finish before producing anything.
        warm_up_deadline = time.monotonic() + DRAIN_TIMEOUT_S
        restarts = 0
        while not all(q.batches() > 0 for q in queries):
            if time.monotonic() > warm_up_deadline:
                raise RuntimeError(
                    "Spark's first micro-batch did not complete within "
                    f"{DRAIN_TIMEOUT_S:.0f} s (see {log_file})"
                )
            if any(q.worker_start_timed_out() for q in queries):
                # Spark gives a new Python worker a fixed 10 s to connect back (not a setting);
                # on a machine this busy it can take longer. Nothing has run yet (the topic is
                # empty): start the queries again from their checkpoints, as one restarts any
                # failed query, until the warm-up deadline.
                restarts += 1
                say(
                    "   Spark's Python worker did not connect back within Spark's fixed 10 s "
                    f"(busy machine): restarting the queries from their checkpoints ({restarts})"
                )
                for query in queries:
                    query.query.stop()
                queries = [Query(q) for q in job.start(spark, job_args)]
                continue
            for query in queries:
                query.raise_if_failed()
            time.sleep(POLL_INTERVAL_S)  # the polling interval of a condition with a deadline
        say("   Spark ran its first micro-batch (the topic is still empty)")

        say(f"4. generating {args.events} page views at {args.rate:g} records/s (acks=all)")
        generator = subprocess.Popen(
            [
                sys.executable,
                str(PIPELINE / "generate.py"),
                f"--bootstrap={bootstrap}",
                f"--topic={INPUT_TOPIC}",
                f"--count={args.events}",
                f"--rate={args.rate}",
                f"--event-rate={EVENT_RATE}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        run = Run(cluster, topic, queries, args.events)
        deadline = time.monotonic() + args.events / args.rate + DRAIN_TIMEOUT_S
        while generator.poll() is None:
            if time.monotonic() > deadline:
                raise RuntimeError("the generator did not finish in time")
            run.step()
            time.sleep(POLL_INTERVAL_S)  # the polling interval: each round checks its conditions
        output = generator.stdout.read() if generator.stdout else ""
        summaries = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
        if generator.returncode != 0 or not summaries:
            raise RuntimeError(f"the generator failed: {output[-500:]}")
        summary = summaries[-1]
        say(
            f"   generator done: {summary['produced']} records ({summary['views']} views and "
            f"the end-of-stream marker) in {summary['seconds']} s, all acknowledged"
        )

        target = topic.exact_end_offsets()
        last_window_end = window_end(summary["last_view_time"], DEFAULT_WINDOW)
        say(
            f"   waiting for each query to read offsets {target} and for its watermark to pass "
            f"{clock(last_window_end)}, the end of the last window"
        )
        drain_deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while True:
            run.step()
            waiting = [w for q in queries if (w := q.drained(target, last_window_end))]
            if not run.restarted:
                waiting.append(f"broker {run.victim} to be restarted")
            elif not run.healed():
                waiting.append(f"broker {run.victim} to rejoin every ISR of {INPUT_TOPIC}")
            if not waiting:
                break
            if time.monotonic() > drain_deadline:
                raise RuntimeError(
                    f"the pipeline did not drain within {DRAIN_TIMEOUT_S:.0f} s; waiting for: "
                    + "; ".join(waiting)
                )
            time.sleep(POLL_INTERVAL_S)
        produced, _ = topic.end_offsets()
        say("   " + run.describe(produced, [], topic.layout()))
        say("   drained: every record read and every window written; stopping the job")
        dropped: dict[str, int] = {}
        for query in queries:
            query.query.stop()
            for progress in query.query.recentProgress:
                log.info("%s progress: %s", query.name, json.dumps(progress, default=str))
            dropped[query.name] = query.dropped_as_late()

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
                    f"--watermark={watermark}",
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
            out = report["topic"]
            say(
                f"   output topic (at-least-once): {out['missing_count']} missing, "
                f"{out['duplicated_count']} repeated, {out['wrong_count']} wrong"
            )
        ok = bool(report["ok"])
        if any(dropped.values()):
            say(
                "   Spark dropped records as later than the watermark allows ("
                + ", ".join(f"{name}: {n}" for name, n in dropped.items() if n)
                + "): a partition fell further behind the others than the allowed lateness"
                f" ({watermark} of event time) covers"
            )
        elapsed = time.monotonic() - started
        say(
            f"PASS: nothing lost, nothing doubled ({elapsed:.0f} s)"
            if ok
            else "FAIL: the output does not match the input"
        )
    except (RuntimeError, OperatorError) as e:  # the demo's verdicts: a deadline, a failed query
        say(f"FAIL: {e}")
    finally:
        if console is not None:
            console.stop()
        for query in queries:
            with contextlib.suppress(Exception):
                query.query.stop()
        if generator is not None and generator.poll() is None:
            generator.kill()
            generator.wait()
        if spark is not None:
            spark.stop()
        if standalone is not None and not args.keep:
            standalone.stop()
        if args.keep:
            say(f"leaving the cluster running (odradek cluster down --dir {directory / 'cluster'})")
        else:
            say("shutting down")
            cluster.down()
            # py4j still logs as the interpreter exits: not into a file about to be deleted.
            logging.getLogger().removeHandler(log_handler)
            log_handler.close()
            if args.dir is None and ok:
                shutil.rmtree(directory, ignore_errors=True)
            elif not ok:
                say(f"logs kept in {directory} (demo.log, cluster/broker-*/broker.log)")
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        say("interrupted")
        sys.exit(130)
