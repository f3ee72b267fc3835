"""`odradek delete-records` and `odradek log-dirs`, like Kafka's `kafka-delete-records.sh` and
`kafka-log-dirs.sh`.

  odradek delete-records --bootstrap-server H:P --offset-json-file F
  odradek log-dirs --bootstrap-server H:P --describe [--topic-list T1,T2] [--broker-list 1,2]

The offset file is Kafka's: `{"version": 1, "partitions": [{"topic": "t", "partition": 0,
"offset": 3}, ...]}` (offset -1: the high watermark; a partition listed twice is a mistake).
DeleteRecords goes to each partition's leader, which answers once its in-sync followers have moved
their log start offset too; the output is Kafka's:

  Executing records delete operation
  Records delete operation completed:
  partition: t-0	low_watermark: 3
  partition: t-1	error: OFFSET_OUT_OF_RANGE

and the command exits 1 if any partition failed. `log-dirs --describe` prints Kafka's two lines
and its JSON (`{"version":1,"brokers":[{"broker":1,"logDirs":[{"logDir":..,"error":null,
"partitions":[{"partition":"t-0","size":..,"offsetLag":0,"isFuture":false}]}]}]}`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from odradek.admin.groups import GroupAdminClient
from odradek.cli.topics import KafkaResponseError, parse_bootstrap
from odradek.errors import OperatorError

TopicPartition = tuple[str, int]


def parse_offset_json(text: str, source: str) -> dict[TopicPartition, int]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise OperatorError(f"{source} is not JSON: {e}") from None
    entries = document.get("partitions") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise OperatorError(
            f'{source}: expected {{"partitions": [{{"topic", "partition", "offset"}}]}}'
        )
    offsets: dict[TopicPartition, int] = {}
    for entry in entries:
        try:
            topic, partition, offset = entry["topic"], entry["partition"], entry["offset"]
        except (KeyError, TypeError):
            raise OperatorError(
                f"{source}: every partition needs topic, partition and offset"
            ) from None
        if (
            not isinstance(topic, str)
            or not isinstance(partition, int)
            or not isinstance(offset, int)
        ):
            raise OperatorError(f"{source}: {entry} has a wrongly typed field")
        if (topic, partition) in offsets:
            raise OperatorError(f"{source}: partition {topic}-{partition} is listed twice")
        offsets[(topic, partition)] = offset
    return offsets


async def _delete_records(args: argparse.Namespace, out: list[str]) -> bool:
    try:
        text = Path(args.offset_json_file).read_text()
    except OSError as e:
        raise OperatorError(f"cannot read {args.offset_json_file}: {e.strerror}") from None
    offsets = parse_offset_json(text, args.offset_json_file)
    client = await GroupAdminClient.connect(parse_bootstrap(args.bootstrap_server), args.timeout)
    try:
        out.append("Executing records delete operation")
        results = await client.delete_records(offsets)
    finally:
        client.close()
    out.append("Records delete operation completed:")
    ok = True
    for (topic, partition), (low_watermark, code) in sorted(results.items()):
        if code is ErrorCode.none:
            out.append(f"partition: {topic}-{partition}\tlow_watermark: {low_watermark}")
        else:
            ok = False
            out.append(f"partition: {topic}-{partition}\terror: {code.name.upper()}")
    return ok


async def _describe_log_dirs(args: argparse.Namespace, out: list[str]) -> None:
    topics = [t for t in (args.topic_list or "").split(",") if t] or None
    client = await GroupAdminClient.connect(parse_bootstrap(args.bootstrap_server), args.timeout)
    try:
        known = await client.brokers()
        if args.broker_list:
            try:
                wanted = [int(b) for b in args.broker_list.split(",") if b]
            except ValueError:
                raise OperatorError(
                    "--broker-list must be broker ids separated by commas"
                ) from None
            unknown = sorted(set(wanted) - set(known))
            if unknown:
                raise OperatorError(f"brokers {unknown} are not in the cluster")
        else:
            wanted = sorted(known)
        out.append("Querying brokers for log directories information")
        brokers: list[dict[str, Any]] = []
        for broker_id in wanted:
            answer = await client.describe_log_dirs(broker_id, topics)
            if answer.error_code != ErrorCode.none:
                raise KafkaResponseError(ErrorCode(answer.error_code), f"broker {broker_id}")
            brokers.append(
                {
                    "broker": broker_id,
                    "logDirs": [
                        {
                            "logDir": result.log_dir,
                            "error": None
                            if result.error_code == ErrorCode.none
                            else ErrorCode(result.error_code).name.upper(),
                            "partitions": [
                                {
                                    "partition": f"{topic.name}-{p.partition_index}",
                                    "size": p.partition_size,
                                    "offsetLag": p.offset_lag,
                                    "isFuture": p.is_future_key,
                                }
                                for topic in result.topics
                                for p in topic.partitions
                            ],
                        }
                        for result in answer.results
                    ],
                }
            )
        out.append(f"Received log directory information from brokers {','.join(map(str, wanted))}")
        out.append(json.dumps({"version": 1, "brokers": brokers}, separators=(",", ":")))
    finally:
        client.close()


def cmd_delete_records(args: argparse.Namespace) -> int:
    out: list[str] = []
    try:
        ok = asyncio.run(_delete_records(args, out))
    except OperatorError as e:
        if out:
            print("\n".join(out))
        print(f"odradek: error: {e}", file=sys.stderr)
        return 1
    print("\n".join(out))
    if not ok:
        print("odradek: error: records of some partitions could not be deleted", file=sys.stderr)
        return 1
    return 0


def cmd_log_dirs(args: argparse.Namespace) -> int:
    if not args.describe:
        print("odradek: error: --describe is needed", file=sys.stderr)
        return 1
    out: list[str] = []
    try:
        asyncio.run(_describe_log_dirs(args, out))
    except OperatorError as e:
        print(f"odradek: error: {e}", file=sys.stderr)
        return 1
    print("\n".join(out))
    return 0


def add_parsers(subparsers: Any) -> None:
    delete = subparsers.add_parser(
        "delete-records",
        help="delete records up to an offset",
        description="Move partitions' log start offsets (like kafka-delete-records.sh).",
    )
    delete.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,HOST:PORT]")
    delete.add_argument(
        "--offset-json-file",
        required=True,
        metavar="FILE",
        help='{"version": 1, "partitions": [{"topic": "t", "partition": 0, "offset": 3}]}',
    )
    delete.add_argument("--timeout", type=float, default=30.0, help="seconds to wait (default 30)")
    delete.set_defaults(func=cmd_delete_records)

    dirs = subparsers.add_parser(
        "log-dirs",
        help="describe the brokers' log directories",
        description="Describe log directories: partition sizes and lags (like kafka-log-dirs.sh).",
    )
    dirs.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,HOST:PORT]")
    dirs.add_argument("--describe", action="store_true", help="describe the log directories")
    dirs.add_argument("--topic-list", metavar="T1,T2", help="only these topics")
    dirs.add_argument("--broker-list", metavar="1,2", help="only these brokers")
    dirs.add_argument("--timeout", type=float, default=30.0, help="seconds to wait (default 30)")
    dirs.set_defaults(func=cmd_log_dirs)
