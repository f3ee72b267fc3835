"""`odradek verifiable-producer` and `odradek verifiable-consumer`: the clients of Kafka's system
tests (`VerifiableProducer`, `VerifiableConsumer`), printing one JSON event per line on standard
output so a test harness can check what was acknowledged and what was consumed.

  odradek verifiable-producer --bootstrap-server H:P --topic T [--max-messages N]
      [--throughput R] [--acks -1|0|1] [--value-prefix P] [--repeating-keys K]
      [--message-create-time MS] [--producer.config F]

Values are `0, 1, 2, ...` (`P.0, P.1, ...` with `--value-prefix P`); keys are null, or `0 .. K-1`
repeating with `--repeating-keys K`. As in Kafka's tool the producer does not retry (retries=0),
so a failed send is reported, never silently repeated. Events, each with `timestamp` (ms) and
`name` first:

* `startup_complete`
* `producer_send_success`: key, value, topic, partition, offset
* `producer_send_error`: key, value, topic, exception (Kafka's error name), message
* `shutdown_complete` once the producer is flushed and closed, then
* `tool_data`: sent, acked, target_throughput, avg_throughput (acked per second)

  odradek verifiable-consumer --bootstrap-server H:P --topic T --group-id G [--max-messages N]
      [--enable-autocommit] [--reset-policy earliest|latest|none] [--session-timeout MS]
      [--assignment-strategy range|roundrobin|cooperative-sticky] [--group-instance-id ID]
      [--verbose] [--consumer.config F]

Events: `startup_complete`; `partitions_assigned` / `partitions_revoked` (partitions: topic,
partition); `records_consumed` after each poll (count, partitions: topic, partition, count,
minOffset, maxOffset); `record_data` per record with `--verbose` (key, value, topic, partition,
offset); `offsets_committed` after each synchronous commit unless `--enable-autocommit` (offsets:
topic, partition, offset; success; error when it failed); `shutdown_complete`. Both stop at
`--max-messages`, at SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from odradek.cli.client_tools import (
    bootstrap_of,
    client_config,
    describe_kafka_error,
    run_tool,
)
from odradek.cli.perf_test import Throttler
from odradek.errors import OperatorError

# Kafka's assignor class names, and librdkafka's names for them.
_ASSIGNORS = {
    "org.apache.kafka.clients.consumer.RangeAssignor": "range",
    "org.apache.kafka.clients.consumer.RoundRobinAssignor": "roundrobin",
    "org.apache.kafka.clients.consumer.CooperativeStickyAssignor": "cooperative-sticky",
    "range": "range",
    "roundrobin": "roundrobin",
    "cooperative-sticky": "cooperative-sticky",
}


def event(name: str, **fields: Any) -> str:
    """One event line, Jackson's compact form with `timestamp` and `name` first."""
    return json.dumps(
        {"timestamp": int(time.time() * 1000), "name": name, **fields}, separators=(",", ":")
    )


def emit(name: str, **fields: Any) -> None:
    sys.stdout.write(event(name, **fields) + "\n")
    sys.stdout.flush()


# -- producer ---------------------------------------------------------------------------------


def run_verifiable_producer(args: argparse.Namespace) -> int:
    from confluent_kafka import Producer

    acks = {"-1": "all", "all": "all", "0": "0", "1": "1"}.get(str(args.acks))
    if acks is None:
        raise OperatorError("--acks must be -1, 0 or 1")
    config = client_config(
        bootstrap_of(args),
        config_file=args.producer_config,
        config_flag="--producer.config",
        defaults={
            "acks": acks,
            "retries": "0",
            "client.id": "verifiable-producer",
            "message.timeout.ms": "120000",  # Kafka's delivery.timeout.ms
            "partitioner": "murmur2_random",
        },
    )
    producer = Producer(config)
    counts = {"sent": 0, "acked": 0}
    start = time.monotonic()
    throttler = Throttler(args.throughput, start)
    create_time = None if args.message_create_time < 0 else args.message_create_time
    start_ms = int(time.time() * 1000)
    key_counter = 0
    emit("startup_complete")

    def report(key: str | None, value: str) -> Any:
        def delivered(error: Any, message: Any) -> None:
            if error is None:
                counts["acked"] += 1
                emit(
                    "producer_send_success",
                    key=key,
                    value=value,
                    topic=message.topic(),
                    partition=message.partition(),
                    offset=message.offset(),
                )
            else:
                emit(
                    "producer_send_error",
                    key=key,
                    value=value,
                    topic=args.topic,
                    exception=error.name(),
                    message=error.str(),
                )

        return delivered

    i = 0
    try:
        while args.max_messages < 0 or i < args.max_messages:
            value = f"{args.value_prefix}.{i}" if args.value_prefix is not None else str(i)
            key = None
            if args.repeating_keys is not None:
                key = str(key_counter)
                key_counter = (key_counter + 1) % args.repeating_keys
            options: dict[str, Any] = {}
            if create_time is not None:
                options["timestamp"] = create_time + int(time.time() * 1000) - start_ms
            counts["sent"] += 1
            while True:
                try:
                    producer.produce(
                        args.topic,
                        value=value.encode(),
                        key=None if key is None else key.encode(),
                        on_delivery=report(key, value),
                        **options,
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
            i += 1
            throttler.throttle(i, time.monotonic())
    except KeyboardInterrupt:
        pass
    finally:
        producer.flush(60)
        emit("shutdown_complete")
        elapsed_ms = max((time.monotonic() - start) * 1000, 1.0)
        emit(
            "tool_data",
            sent=counts["sent"],
            acked=counts["acked"],
            target_throughput=int(args.throughput),
            avg_throughput=1000 * counts["acked"] / elapsed_ms,
        )
    return 0


# -- consumer ---------------------------------------------------------------------------------


def _partitions(partitions: Any) -> list[dict[str, Any]]:
    return [{"topic": tp.topic, "partition": tp.partition} for tp in partitions]


def run_verifiable_consumer(args: argparse.Namespace) -> int:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    assignor = _ASSIGNORS.get(args.assignment_strategy)
    if assignor is None:
        raise OperatorError(
            f"--assignment-strategy {args.assignment_strategy} is not supported "
            f"(supported: {', '.join(sorted(_ASSIGNORS))})"
        )
    if args.reset_policy not in ("earliest", "latest", "none"):
        raise OperatorError("--reset-policy must be earliest, latest or none")
    defaults = {
        "group.id": args.group_id,
        "enable.auto.commit": "true" if args.enable_autocommit else "false",
        "auto.offset.reset": "error" if args.reset_policy == "none" else args.reset_policy,
        "session.timeout.ms": str(args.session_timeout),
        "partition.assignment.strategy": assignor,
        "client.id": "verifiable-consumer",
    }
    if args.group_instance_id:
        defaults["group.instance.id"] = args.group_instance_id
    consumer = Consumer(
        client_config(
            bootstrap_of(args),
            config_file=args.consumer_config,
            config_flag="--consumer.config",
            defaults=defaults,
        )
    )
    consumed = 0
    limit = args.max_messages
    emit("startup_complete")
    try:
        consumer.subscribe(
            [args.topic],
            on_assign=lambda c, ps: emit("partitions_assigned", partitions=_partitions(ps)),
            on_revoke=lambda c, ps: emit("partitions_revoked", partitions=_partitions(ps)),
        )
        while limit < 0 or consumed < limit:
            messages = consumer.consume(500, 0.5)
            by_partition: dict[tuple[str, int], list[Any]] = {}
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.fatal():
                        raise OperatorError(describe_kafka_error(error))
                    continue
                where = (message.topic() or "", message.partition() or 0)
                by_partition.setdefault(where, []).append(message)
            if not by_partition:
                continue
            summaries = []
            offsets = []
            for (topic, partition), records in by_partition.items():
                if limit >= 0:
                    records = records[: limit - consumed]
                if not records:
                    continue
                if args.verbose:
                    for record in records:
                        key, value = record.key(), record.value()
                        emit(
                            "record_data",
                            key=None if key is None else key.decode(errors="replace"),
                            value=None if value is None else value.decode(errors="replace"),
                            topic=topic,
                            partition=partition,
                            offset=record.offset(),
                        )
                summaries.append(
                    {
                        "topic": topic,
                        "partition": partition,
                        "count": len(records),
                        "minOffset": records[0].offset(),
                        "maxOffset": records[-1].offset(),
                    }
                )
                offsets.append(TopicPartition(topic, partition, records[-1].offset() + 1))
                consumed += len(records)
            emit(
                "records_consumed",
                count=sum(len(r) for r in by_partition.values()),
                partitions=summaries,
            )
            if not args.enable_autocommit and offsets:
                committed = [
                    {"topic": tp.topic, "partition": tp.partition, "offset": tp.offset}
                    for tp in offsets
                ]
                try:
                    consumer.commit(offsets=offsets, asynchronous=False)
                    emit("offsets_committed", offsets=committed, success=True)
                except KafkaException as e:
                    emit(
                        "offsets_committed",
                        offsets=committed,
                        error=describe_kafka_error(e),
                        success=False,
                    )
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
        emit("shutdown_complete")
    return 0


# -- the commands -----------------------------------------------------------------------------


def cmd_verifiable_producer(args: argparse.Namespace) -> int:
    return run_tool(lambda: run_verifiable_producer(args))


def cmd_verifiable_consumer(args: argparse.Namespace) -> int:
    return run_tool(lambda: run_verifiable_consumer(args))


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-server", metavar="HOST:PORT", help="the brokers")
    parser.add_argument("--broker-list", help="deprecated: use --bootstrap-server")
    parser.add_argument("--topic", required=True)
    parser.add_argument(
        "--max-messages", type=int, default=-1, help="stop after this many (-1: never)"
    )


def add_parsers(subparsers: Any) -> None:
    producer = subparsers.add_parser(
        "verifiable-producer",
        help="produce 0, 1, 2, ... and print a JSON event per acknowledgement",
        description="Kafka's system-test producer: JSON events on standard output.",
    )
    _common(producer)
    producer.add_argument("--throughput", type=float, default=-1, help="records/s (-1: no limit)")
    producer.add_argument("--acks", default="-1", help="-1 (all, default), 0 or 1")
    producer.add_argument("--producer.config", dest="producer_config", metavar="FILE")
    producer.add_argument(
        "--message-create-time", type=int, default=-1, help="first record's CreateTime (ms)"
    )
    producer.add_argument("--value-prefix", type=int, help="values become PREFIX.N")
    producer.add_argument("--repeating-keys", type=int, help="keys 0 .. K-1, repeating")
    producer.set_defaults(func=cmd_verifiable_producer)

    consumer = subparsers.add_parser(
        "verifiable-consumer",
        help="consume in a group and print JSON events",
        description="Kafka's system-test consumer: JSON events on standard output.",
    )
    _common(consumer)
    consumer.add_argument("--group-id", required=True)
    consumer.add_argument("--group-instance-id", help="static membership")
    consumer.add_argument(
        "--group-protocol", default="classic", choices=["classic"], help="classic only"
    )
    consumer.add_argument("--session-timeout", type=int, default=30000, help="ms")
    consumer.add_argument("--verbose", action="store_true", help="a record_data event per record")
    consumer.add_argument(
        "--enable-autocommit", action="store_true", help="commit automatically, not after polls"
    )
    consumer.add_argument("--reset-policy", default="earliest", help="earliest, latest or none")
    consumer.add_argument(
        "--assignment-strategy",
        default="org.apache.kafka.clients.consumer.RangeAssignor",
        help="Kafka's assignor class (Range, RoundRobin, CooperativeSticky) or librdkafka's name",
    )
    consumer.add_argument("--consumer.config", dest="consumer_config", metavar="FILE")
    consumer.set_defaults(func=cmd_verifiable_consumer)
