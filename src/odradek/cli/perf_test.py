"""`odradek producer-perf-test` and `odradek consumer-perf-test`, like Kafka's
`kafka-producer-perf-test.sh` (ProducerPerformance) and `kafka-consumer-perf-test.sh`
(ConsumerPerformance): same flags, same output lines, through confluent-kafka (librdkafka).

  odradek producer-perf-test --topic T --num-records N (--record-size B | --payload-file F |
      --payload-monotonic) --throughput R (-1: unthrottled)
      (--producer-props bootstrap.servers=H:P acks=all ... | --producer.config F)
      [--transactional-id ID --transaction-duration-ms MS]

prints every 5 s `N records sent, R records/sec (M MB/sec), A ms avg latency, X ms max latency.`
and at the end `N records sent, R records/sec (M MB/sec), A ms avg latency, X ms max latency,
P50 ms 50th, P95 ms 95th, P99 ms 99th, P999 ms 99.9th.` A record's latency runs from its
`produce()` call to its delivery report (librdkafka reports deliveries when the tool polls, which
it does after every record). Payloads of `--record-size` are random uppercase letters, as in
Kafka's tool, drawn from a pool of 1,000 generated once (generating one per record in Python would
measure the generator).

  odradek consumer-perf-test --bootstrap-server H:P --topic T --messages N [--group G]
      [--from-latest] [--timeout MS] [--show-detailed-stats] [--reporting-interval MS]
      [--hide-header] [--date-format yyyy-MM-dd HH:mm:ss:SSS] [--consumer.config F]

prints Kafka's header `start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg,
nMsg.sec, rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec` and one line of totals
(with `--show-detailed-stats`, a line per reporting interval instead). Bytes counted are keys plus
values, as Kafka counts them. rebalance.time.ms is the time from subscribing to the first
assignment.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from array import array
from datetime import datetime
from typing import Any

from odradek.cli.client_tools import (
    QUIET,
    bootstrap_of,
    client_config,
    describe_kafka_error,
    java_to_librdkafka,
    parse_property_list,
    read_properties_file,
    run_tool,
)
from odradek.errors import OperatorError

_MB = 1024 * 1024
_PAYLOAD_POOL = 1000


# -- producer ---------------------------------------------------------------------------------


class Stats:
    """Kafka's ProducerPerformance.Stats: a window printed every `interval_s`, and totals."""

    def __init__(self, interval_s: float = 5.0) -> None:
        self.start = time.monotonic()
        self.interval_s = interval_s
        self.latencies: array[int] = array("i")
        self.count = 0
        self.bytes = 0
        self.max_latency = 0
        self.total_latency = 0
        self.window_start = self.start
        self.window_count = 0
        self.window_bytes = 0
        self.window_max = 0
        self.window_total = 0

    def record(self, latency_ms: int, size: int, now: float) -> None:
        self.count += 1
        self.bytes += size
        self.total_latency += latency_ms
        self.max_latency = max(self.max_latency, latency_ms)
        self.latencies.append(latency_ms)
        self.window_count += 1
        self.window_bytes += size
        self.window_total += latency_ms
        self.window_max = max(self.window_max, latency_ms)
        if now - self.window_start >= self.interval_s:
            self.print_window(now)
            self.window_start = now
            self.window_count = self.window_bytes = self.window_max = self.window_total = 0

    def print_window(self, now: float) -> None:
        elapsed = max(now - self.window_start, 1e-9)
        rate = self.window_count / elapsed
        mb = self.window_bytes / _MB / elapsed
        avg = self.window_total / max(self.window_count, 1)
        print(
            f"{self.window_count} records sent, {rate:.1f} records/sec ({mb:.2f} MB/sec), "
            f"{avg:.1f} ms avg latency, {float(self.window_max):.1f} ms max latency.",
            flush=True,
        )

    def percentiles(self, *fractions: float) -> list[int]:
        ordered = sorted(self.latencies)
        if not ordered:
            return [0 for _ in fractions]
        return [ordered[min(int(f * len(ordered)), len(ordered) - 1)] for f in fractions]

    def total_line(self, now: float) -> str:
        elapsed = max(now - self.start, 1e-9)
        rate = self.count / elapsed
        mb = self.bytes / _MB / elapsed
        avg = self.total_latency / max(self.count, 1)
        p50, p95, p99, p999 = self.percentiles(0.5, 0.95, 0.99, 0.999)
        return (
            f"{self.count} records sent, {rate:f} records/sec ({mb:.2f} MB/sec), "
            f"{avg:.2f} ms avg latency, {float(self.max_latency):.2f} ms max latency, "
            f"{p50} ms 50th, {p95} ms 95th, {p99} ms 99th, {p999} ms 99.9th."
        )


class Throttler:
    """Kafka's ThroughputThrottler: keep `sent / elapsed` at or under `per_second` (< 0: off)."""

    def __init__(self, per_second: float, start: float) -> None:
        self.per_second = per_second
        self.start = start

    def throttle(self, sent: int, now: float) -> None:
        if self.per_second < 0:
            return
        if self.per_second == 0:
            raise OperatorError("--throughput 0 would never send a record")
        due = self.start + sent / self.per_second
        if due > now:
            time.sleep(due - now)


def _payloads(args: argparse.Namespace) -> list[bytes] | None:
    if args.payload_file:
        try:
            text = open(args.payload_file, encoding="utf-8").read()  # noqa: SIM115
        except OSError as e:
            raise OperatorError(f"cannot read --payload-file: {e.strerror}") from None
        delimiter = "\n" if args.payload_delimiter == "\\n" else args.payload_delimiter
        payloads = [p.encode() for p in text.split(delimiter) if p]
        if not payloads:
            raise OperatorError(f"--payload-file {args.payload_file} has no payloads")
        print(f"Reading payloads from: {args.payload_file}")
        print(f"Number of messages read: {len(payloads)}")
        return payloads
    if args.record_size is not None:
        if args.record_size <= 0:
            raise OperatorError("--record-size must be positive")
        rng = random.Random(0)
        return [
            bytes(rng.randrange(26) + 65 for _ in range(args.record_size))
            for _ in range(_PAYLOAD_POOL)
        ]
    if args.payload_monotonic:
        return None
    raise OperatorError("one of --record-size, --payload-file or --payload-monotonic is required")


def _producer_config(args: argparse.Namespace) -> dict[str, str]:
    if not args.producer_props and not args.producer_config:
        raise OperatorError("Either --producer-props or --producer.config must be specified.")
    merged = {**QUIET, **read_properties_file(args.producer_config, "--producer.config")}
    merged.update(parse_property_list(args.producer_props, "--producer-props"))
    if args.bootstrap_server:
        merged["bootstrap.servers"] = args.bootstrap_server
    if not merged.get("bootstrap.servers"):
        raise OperatorError("bootstrap.servers is required (in --producer-props)")
    if args.transactional_id:
        merged["transactional.id"] = args.transactional_id
    elif args.transaction_duration_ms and "transactional.id" not in merged:
        merged["transactional.id"] = "performance-producer-default-transactional-id"
    return java_to_librdkafka(merged)


def run_producer_perf(args: argparse.Namespace) -> int:
    from confluent_kafka import Producer

    if args.num_records <= 0:
        raise OperatorError("--num-records must be positive")
    payloads = _payloads(args)
    config = _producer_config(args)
    transactional = bool(args.transaction_duration_ms and args.transaction_duration_ms > 0)
    producer = Producer(config)
    if transactional:
        producer.init_transactions(30)
    stats = Stats()
    errors: list[str] = []
    throttler = Throttler(args.throughput, stats.start)
    in_transaction = 0
    transaction_start = 0.0
    pool = len(payloads) if payloads else 0
    monotonic = time.monotonic
    for i in range(args.num_records):
        payload = payloads[i % pool] if payloads else str(i).encode()
        if transactional and in_transaction == 0:
            producer.begin_transaction()
            transaction_start = monotonic()
        sent_at = monotonic()

        def delivered(error: Any, message: Any, sent_at: float = sent_at) -> None:
            now = monotonic()
            if error is not None:
                errors.append(describe_kafka_error(error))
                return
            stats.record(int((now - sent_at) * 1000), len(message.value() or b""), now)

        while True:
            try:
                producer.produce(args.topic, payload, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        in_transaction += 1
        if transactional and (sent_at - transaction_start) * 1000 >= args.transaction_duration_ms:
            producer.commit_transaction(60)
            in_transaction = 0
        throttler.throttle(i + 1, monotonic())
    if transactional and in_transaction:
        producer.commit_transaction(60)
    remaining = producer.flush(120)
    print(stats.total_line(monotonic()), flush=True)
    if errors:
        print(f"odradek: error: {len(errors)} records failed: {errors[0]}", file=sys.stderr)
        return 1
    if remaining:
        print(f"odradek: error: {remaining} records were never acknowledged", file=sys.stderr)
        return 1
    return 0


# -- consumer ---------------------------------------------------------------------------------

_JAVA_DATE_TOKENS = (
    ("yyyy", "%Y"),
    ("MM", "%m"),
    ("dd", "%d"),
    ("HH", "%H"),
    ("mm", "%M"),
    ("ss", "%S"),
)


def java_date_format(pattern: str, epoch_ms: int) -> str:
    """The common subset of java.text.SimpleDateFormat: yyyy MM dd HH mm ss SSS."""
    moment = datetime.fromtimestamp(epoch_ms / 1000)
    parts = []
    for part in pattern.split("SSS"):
        for token, directive in _JAVA_DATE_TOKENS:
            part = part.replace(token, directive)
        parts.append(moment.strftime(part))
    return f"{epoch_ms % 1000:03d}".join(parts)


HEADER_FIELDS = ", rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec"


def run_consumer_perf(args: argparse.Namespace) -> int:
    from confluent_kafka import Consumer

    if args.messages <= 0:
        raise OperatorError("--messages must be positive")
    config = client_config(
        bootstrap_of(args),
        config_file=args.consumer_config,
        config_flag="--consumer.config",
        defaults={
            "group.id": args.group or f"perf-consumer-{random.randrange(100000)}",
            "auto.offset.reset": "latest" if args.from_latest else "earliest",
            "enable.auto.commit": "true",
            "client.id": "perf-consumer-client",
        },
    )
    if args.fetch_size is not None:
        config["fetch.max.bytes"] = str(args.fetch_size)
    if not args.hide_header:
        if args.show_detailed_stats:
            print(
                f"time, threadId, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec"
                f"{HEADER_FIELDS}"
            )
        else:
            print(
                f"start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, "
                f"nMsg.sec{HEADER_FIELDS}"
            )
    consumer = Consumer(config)
    start_ms = int(time.time() * 1000)
    join: dict[str, float] = {"ms": 0, "round_ms": 0, "started": time.monotonic()}

    def on_assign(consumer: Any, partitions: Any) -> None:
        elapsed = (time.monotonic() - join["started"]) * 1000
        join["ms"] += elapsed
        join["round_ms"] += elapsed

    def on_revoke(consumer: Any, partitions: Any) -> None:
        join["started"] = time.monotonic()

    consumer.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke)
    messages = bytes_read = 0
    last_messages = last_bytes = 0
    now = time.monotonic()
    last_report = last_consumed = now
    last_report_ms = int(time.time() * 1000)
    try:
        while messages < args.messages and (now - last_consumed) * 1000 <= args.timeout:
            batch = consumer.consume(min(1000, args.messages - messages), 0.1)
            now = time.monotonic()
            for message in batch:
                error = message.error()
                if error is not None:
                    if error.fatal():
                        raise OperatorError(describe_kafka_error(error))
                    continue
                messages += 1
                bytes_read += len(message.key() or b"") + len(message.value() or b"")
            if batch:
                last_consumed = now
            if args.show_detailed_stats and (now - last_report) * 1000 >= args.reporting_interval:
                now_ms = int(time.time() * 1000)
                print(
                    _detailed_line(
                        args.date_format,
                        now_ms,
                        now_ms - last_report_ms,
                        bytes_read,
                        bytes_read - last_bytes,
                        messages,
                        messages - last_messages,
                        int(join["round_ms"]),
                    ),
                    flush=True,
                )
                join["round_ms"] = 0
                last_report, last_report_ms = now, now_ms
                last_messages, last_bytes = messages, bytes_read
    finally:
        consumer.close()
    end_ms = int(time.time() * 1000)
    if messages < args.messages:
        print(
            f"WARNING: Exiting before consuming the expected number of messages: timeout "
            f"({args.timeout} ms) exceeded. You can use the --timeout option to increase the "
            "timeout."
        )
    if not args.show_detailed_stats:
        elapsed_s = max((end_ms - start_ms) / 1000, 1e-9)
        fetch_ms = end_ms - start_ms - int(join["ms"])
        mb = bytes_read / _MB
        fetch_s = fetch_ms / 1000 if fetch_ms > 0 else float("nan")
        print(
            f"{java_date_format(args.date_format, start_ms)}, "
            f"{java_date_format(args.date_format, end_ms)}, {mb:.4f}, {mb / elapsed_s:.4f}, "
            f"{messages}, {messages / elapsed_s:.4f}, {int(join['ms'])}, {fetch_ms}, "
            f"{mb / fetch_s:.4f}, {messages / fetch_s:.4f}"
        )
    return 0


def _detailed_line(
    date_format: str,
    now_ms: int,
    interval_ms: int,
    bytes_read: int,
    interval_bytes: int,
    messages: int,
    interval_messages: int,
    join_ms: int,
) -> str:
    interval_ms = max(interval_ms, 1)
    fetch_ms = interval_ms - join_ms
    interval_mb = interval_bytes / _MB
    fetch_mb_s = 0.0 if fetch_ms <= 0 else 1000 * interval_mb / fetch_ms
    fetch_msg_s = 0.0 if fetch_ms <= 0 else 1000 * interval_messages / fetch_ms
    return (
        f"{java_date_format(date_format, now_ms)}, 0, {bytes_read / _MB:.4f}, "
        f"{1000 * interval_mb / interval_ms:.4f}, {messages}, "
        f"{1000 * interval_messages / interval_ms:.4f}, {join_ms}, {fetch_ms}, "
        f"{fetch_mb_s:.4f}, {fetch_msg_s:.4f}"
    )


# -- the commands -----------------------------------------------------------------------------


def cmd_producer_perf(args: argparse.Namespace) -> int:
    return run_tool(lambda: run_producer_perf(args))


def cmd_consumer_perf(args: argparse.Namespace) -> int:
    return run_tool(lambda: run_consumer_perf(args))


def add_parsers(subparsers: Any) -> None:
    producer = subparsers.add_parser(
        "producer-perf-test",
        help="measure producer throughput and latency",
        description="Produce records as fast as allowed and report throughput and latency "
        "(like kafka-producer-perf-test.sh).",
    )
    producer.add_argument("--topic", required=True, help="produce to this topic")
    producer.add_argument("--num-records", type=int, required=True, help="records to produce")
    payload = producer.add_mutually_exclusive_group()
    payload.add_argument("--record-size", type=int, help="bytes per record")
    payload.add_argument("--payload-file", help="payloads to pick from, one per delimiter")
    payload.add_argument(
        "--payload-monotonic", action="store_true", help="payloads 0, 1, 2, ... as text"
    )
    producer.add_argument(
        "--payload-delimiter", default="\\n", help="delimiter of --payload-file (default \\n)"
    )
    producer.add_argument(
        "--throughput",
        type=float,
        required=True,
        help="records/s at most (-1: no limit)",
    )
    producer.add_argument(
        "--producer-props", nargs="+", metavar="K=V", help="producer properties, e.g. acks=all"
    )
    producer.add_argument(
        "--producer.config", dest="producer_config", metavar="FILE", help="producer properties"
    )
    producer.add_argument(
        "--bootstrap-server", help="the brokers (instead of bootstrap.servers in the props)"
    )
    producer.add_argument("--print-metrics", action="store_true", help=argparse.SUPPRESS)
    producer.add_argument("--transactional-id", help="produce in transactions with this id")
    producer.add_argument(
        "--transaction-duration-ms",
        type=int,
        default=0,
        help="commit a transaction every this many ms (> 0 turns transactions on)",
    )
    producer.set_defaults(func=cmd_producer_perf)

    consumer = subparsers.add_parser(
        "consumer-perf-test",
        help="measure consumer throughput",
        description="Consume records and report throughput (like kafka-consumer-perf-test.sh).",
    )
    consumer.add_argument("--bootstrap-server", metavar="HOST:PORT", help="the brokers")
    consumer.add_argument("--broker-list", help=argparse.SUPPRESS)
    consumer.add_argument("--topic", required=True, help="the topic to consume")
    consumer.add_argument("--messages", type=int, required=True, help="records to consume")
    consumer.add_argument("--group", help="the consumer group (default perf-consumer-NNNNN)")
    consumer.add_argument("--fetch-size", type=int, help="bytes per fetch (fetch.max.bytes)")
    consumer.add_argument(
        "--from-latest",
        action="store_true",
        help="start at the latest offset when the group has no committed offset",
    )
    consumer.add_argument(
        "--timeout", type=int, default=10000, help="ms without records before giving up"
    )
    consumer.add_argument(
        "--consumer.config", dest="consumer_config", metavar="FILE", help="consumer properties"
    )
    consumer.add_argument("--show-detailed-stats", action="store_true", help="a line per interval")
    consumer.add_argument("--reporting-interval", type=int, default=5000, help="ms (default 5000)")
    consumer.add_argument("--date-format", default="yyyy-MM-dd HH:mm:ss:SSS")
    consumer.add_argument("--hide-header", action="store_true", help="no header line")
    consumer.add_argument("--print-metrics", action="store_true", help=argparse.SUPPRESS)
    for ignored in ("--threads", "--num-fetch-threads", "--socket-buffer-size"):
        consumer.add_argument(ignored, help=argparse.SUPPRESS)
    consumer.set_defaults(func=cmd_consumer_perf)
