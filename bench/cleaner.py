"""The log cleaner's throughput, and what cleaning costs producers on the same broker. Prints one
JSON object per measurement:

    ./dev bench cleaner                                   # both parts
    ./dev bench cleaner --only throughput --records 2000000
    ./dev bench cleaner --only latency --records 3000000 --rate 2000

* `throughput`: a compacted log of `--records` records of 100 bytes (a 16-byte key and an
  84-byte value; batches of 1,000 records, uncompressed, as a producer writes them) in 64 MB
  segments, with 10% and then 90% of the records repeating an earlier key, is cleaned once by
  the broker's `Cleaner` (Kafka's default 128 MB offset map, 512 KB of I/O buffers), in this
  process, on a file system the log was just written to (the page cache holds it, as it holds
  a broker's recent segments). Reports MB/s (bytes of the log read per second of the whole
  cleaning: map pass, filter pass, writes, fsyncs and swaps) and records/s, by the wall clock
  and per second of CPU time of the cleaning thread (the two differ when other processes share
  the cores).
* `latency`: one broker; a compacted topic is filled with `--records` such records (90%
  duplicates) while its min.cleanable.dirty.ratio is 1 (never due). A producer then writes
  100-byte records to another topic at `--rate` records/s (acks=1, linger 0), and the time from
  `produce()` to its delivery report is measured, first for `--seconds` with the cleaner idle,
  then from the moment the compacted topic's ratio is lowered (IncrementalAlterConfigs) until the
  broker logs that its cleaning is done, then `--seconds` more with the cleaner idle again.
  Reports p50/p99/max of the three windows and the ratio of the p99 while cleaning to the p99
  before, in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from odradek.log.cleaner import Cleaner, Throttler
from odradek.log.cleaner_manager import LogCleanerManager
from odradek.log.config import LogConfig
from odradek.log.log import Log
from odradek.protocol.compaction import OffsetMap
from odradek.protocol.record_batch import build_batch
from odradek.testing import LocalCluster, tail

KEY_BYTES = 16
VALUE_BYTES = 84
BATCH_RECORDS = 1000
SEGMENT_BYTES = 64 * 1024 * 1024


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def key_sequence(records: int, duplicates: float, seed: int = 7) -> list[int]:
    """Key numbers of `records` records of which a `duplicates` share repeats an earlier key:
    every key of range(unique) once, the rest drawn from it, shuffled."""
    unique = max(1, round(records * (1 - duplicates)))
    rng = random.Random(seed)
    keys = list(range(unique)) + [rng.randrange(unique) for _ in range(records - unique)]
    rng.shuffle(keys)
    return keys


def key_bytes(number: int) -> bytes:
    return b"key-%012d" % number


def value_bytes(number: int) -> bytes:
    return (b"value-%012d-" % number).ljust(VALUE_BYTES, b"v")


# -- throughput ---------------------------------------------------------------------------------


def clean_once(directory: Path, records: int, duplicates: float) -> dict[str, Any]:
    config = LogConfig(
        segment_bytes=SEGMENT_BYTES, cleanup_policy=("compact",), min_cleanable_dirty_ratio=0.0
    )
    now = int(time.time() * 1000)
    log = Log.open(
        directory / "bench-0",
        config,
        recovery_point=0,
        log_start_offset=0,
        clean_shutdown=True,
        now_ms=now,
    )
    keys = key_sequence(records, duplicates)
    for start in range(0, records, BATCH_RECORDS):
        batch = build_batch(
            [
                (key_bytes(k), value_bytes(start + i), [], now)
                for i, k in enumerate(keys[start : start + BATCH_RECORDS])
            ]
        )
        log.append_as_leader(batch, 0, now)
    log.roll(now)
    log.flush()
    size = log.size_in_bytes
    manager = LogCleanerManager(
        lambda: {("bench", 0): log}, lambda tp: directory, lambda t, p: log.log_end_offset
    )
    manager.load_checkpoints([directory])
    cleaner = Cleaner(OffsetMap(128 * 1024 * 1024, 0.9), 512 * 1024 // 2, Throttler(float("inf")))

    def swap(job: Any, group: Any, cleaned_size: int) -> bool:
        old = [s.segment for s in group]
        done = log.replace_segments(old, [s.size for s in group], cleaned_size, now)
        if done:
            for segment in old:
                segment.delete()
        return done

    job = manager.grab_filthiest_log(now)
    if job is None:
        raise RuntimeError("the log is not due for cleaning")
    started, cpu_started = time.perf_counter(), time.process_time()
    stats = cleaner.clean(job, now, swap, lambda: None)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    log.close()
    return {
        "bench": "cleaner_throughput",
        "records": records,
        "duplicate_keys": duplicates,
        "log_mb": round(size / 1e6, 1),
        "seconds": round(elapsed, 3),
        "mb_per_s": round(size / 1e6 / elapsed, 1),
        "records_per_s": round(records / elapsed),
        "cpu_seconds": round(cpu, 3),
        "mb_per_cpu_s": round(size / 1e6 / cpu, 1),
        "records_kept": stats.records_kept,
        "written_mb": round(stats.bytes_written / 1e6, 1),
        "map_seconds": round(stats.map_done - stats.started, 3),
    }


def throughput(args: argparse.Namespace) -> None:
    for duplicates in (0.1, 0.9):
        with tempfile.TemporaryDirectory(prefix="odradek-bench-cleaner-") as directory:
            emit(clean_once(Path(directory), args.records, duplicates))


# -- latency ------------------------------------------------------------------------------------


class Probe:
    """Produces to `topic` at `rate` records/s on its own thread; records each delivery's
    latency with the time it was sent."""

    def __init__(self, bootstrap: str, topic: str, rate: float) -> None:
        from confluent_kafka import Producer

        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "1",
                "linger.ms": 0,
                "enable.idempotence": False,
            }
        )
        self.topic = topic
        self.rate = rate
        self.samples: list[tuple[float, float]] = []  # (sent at, latency s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        # Delivery reports are served by a thread of their own that waits in poll(): serving
        # them between two sends would round every latency up to the sending interval.
        self._poller = threading.Thread(target=self._poll, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._poller.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(0.05)

    def _run(self) -> None:
        value = b"p" * 100
        started = time.monotonic()
        i = 0
        while not self._stop.is_set():
            target = started + i / self.rate
            delay = target - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            sent = time.monotonic()

            def report(error: Any, _message: Any, sent: float = sent) -> None:
                if error is None:
                    self.samples.append((sent, time.monotonic() - sent))

            self.producer.produce(self.topic, value=value, on_delivery=report)
            i += 1
        self._poller.join(5)
        self.producer.flush(30)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self._poller.join(5)

    def window(self, start: float, end: float) -> list[float]:
        return [latency * 1000 for sent, latency in list(self.samples) if start <= sent < end]


def summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"records": 0}
    return {
        "records": len(values),
        "p50_ms": round(percentile(values, 0.5), 2),
        "p99_ms": round(percentile(values, 0.99), 2),
        "max_ms": round(max(values), 2),
    }


def fill(bootstrap: str, topic: str, records: int) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "1",
            "linger.ms": 20,
            "batch.num.messages": 10000,
            "enable.idempotence": False,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    keys = key_sequence(records, 0.9)
    for i, k in enumerate(keys):
        while True:
            try:
                producer.produce(topic, key=key_bytes(k), value=value_bytes(i))
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("the compacted topic was not filled")


def latency(args: argparse.Namespace) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
    )

    with tempfile.TemporaryDirectory(prefix="odradek-bench-cleaner-") as directory:
        cluster = LocalCluster.up(
            Path(directory),
            1,
            overrides={
                "log.cleaner.backoff.ms": "200",
                "num.partitions": "1",
                **dict(item.split("=", 1) for item in args.set),
            },
        )
        try:
            bootstrap = cluster.bootstrap_servers
            admin = AdminClient({"bootstrap.servers": bootstrap})
            suffix = uuid.uuid4().hex[:6]
            compacted, probe_topic = f"compacted-{suffix}", f"probe-{suffix}"
            configs = {
                "cleanup.policy": "compact",
                "segment.bytes": str(SEGMENT_BYTES),
                "min.cleanable.dirty.ratio": "1",
            }
            futures = admin.create_topics(
                [NewTopic(compacted, 1, 1, config=configs), NewTopic(probe_topic, 1, 1)]
            )
            for future in futures.values():
                future.result(60)
            fill(bootstrap, compacted, args.records)
            probe = Probe(bootstrap, probe_topic, args.rate)
            probe.start()
            time.sleep(5.0)  # warm-up, not measured
            quiet_start = time.monotonic()
            time.sleep(args.seconds)
            quiet_end = time.monotonic()
            log_path = Path(cluster.broker(1).log)
            offset = log_path.stat().st_size
            resource = ConfigResource(
                ConfigResource.Type.TOPIC,
                compacted,
                incremental_configs=[
                    ConfigEntry(
                        "min.cleanable.dirty.ratio",
                        "0.01",
                        incremental_operation=AlterConfigOpType.SET,
                    )
                ],
            )
            admin = AdminClient({"bootstrap.servers": bootstrap})
            admin.incremental_alter_configs([resource], request_timeout=120)[resource].result(180)
            busy_start = time.monotonic()
            pattern = re.compile(rf"cleaned {re.escape(compacted)}-0: (.*)")
            found = None
            deadline = busy_start + 600
            while found is None and time.monotonic() < deadline:
                time.sleep(0.05)
                with open(log_path, "rb") as f:
                    f.seek(offset)
                    found = pattern.search(f.read().decode(errors="replace"))
            busy_end = time.monotonic()
            time.sleep(args.seconds)
            after_end = time.monotonic()
            probe.stop()
            quiet = summary(probe.window(quiet_start, quiet_end))
            busy = summary(probe.window(busy_start, busy_end))
            after = summary(probe.window(busy_end, after_end))
            emit(
                {
                    "bench": "cleaner_produce_latency",
                    "rate": args.rate,
                    "compacted_records": args.records,
                    "cleaning_seconds": round(busy_end - busy_start, 2),
                    "cleaner": found.group(1) if found else "did not finish",
                    "without_cleaner": quiet,
                    "while_cleaning": busy,
                    "after_cleaning": after,
                    "p99_ratio": round(busy["p99_ms"] / quiet["p99_ms"], 2)
                    if busy.get("records") and quiet.get("records")
                    else None,
                }
            )
        except BaseException:
            sys.stderr.write(tail(cluster.broker(1).log, 30) + "\n")
            raise
        finally:
            cluster.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=("throughput", "latency"))
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--rate", type=float, default=2000)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a broker property for the latency part (repeatable), e.g. log.cleaner.nice=19",
    )
    args = parser.parse_args()
    if args.only in (None, "latency") and args.records * (KEY_BYTES + VALUE_BYTES) <= SEGMENT_BYTES:
        # Only sealed segments are cleaned: the log must outgrow its first 64 MB segment.
        parser.error(f"--records must be over {SEGMENT_BYTES // (KEY_BYTES + VALUE_BYTES)}")
    if args.only in (None, "throughput"):
        throughput(args)
    if args.only in (None, "latency"):
        latency(args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
