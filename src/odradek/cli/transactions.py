"""`odradek transactions`: list, describe and abort transactions, like Kafka's
`kafka-transactions.sh`.

  odradek transactions --bootstrap-server H:P [--command-config F] list
  odradek transactions --bootstrap-server H:P describe --transactional-id ID
  odradek transactions --bootstrap-server H:P describe-producers --topic T --partition P
  odradek transactions --bootstrap-server H:P abort --topic T --partition P --start-offset O
  odradek transactions --bootstrap-server H:P abort --topic T --partition P
                       --producer-id ID --producer-epoch E --coordinator-epoch C

`list` asks every broker (ListTransactions) and prints `TransactionalId Coordinator ProducerId
TransactionState`; `describe` asks the id's coordinator (FindCoordinator with key type 1, then
DescribeTransactions) and prints Kafka's columns (`CoordinatorId TransactionalId ProducerId
ProducerEpoch TransactionState TransactionTimeoutMs CurrentTransactionStartTimeMs
TransactionDurationMs TopicPartitions`); `describe-producers` asks the partition's leader
(DescribeProducers) for its active producers (`ProducerId ProducerEpoch LatestCoordinatorEpoch
LastSequence LastTimestamp CurrentTransactionStartOffset`).

`abort` ends a *hanging* transaction on one partition: one whose coordinator no longer knows it
(lost, or its producer id fenced without a marker), which holds the partition's last stable offset
back for ever. With `--start-offset` the producer is the one whose open transaction starts there
(found with DescribeProducers); the command then sends the partition's leader an ABORT marker
(WriteTxnMarkers, as Kafka's admin client does, which needs CLUSTER_ACTION) with that producer's
id, epoch and coordinator epoch. A transaction its coordinator still tracks is better left to the
coordinator (it aborts it on `transaction.timeout.ms`).

Exit status: 0 on success; 1 with one line `odradek: error: ...` for a mistake in the arguments
or an error a broker answered.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

from odradek.admin.groups import GroupAdminClient
from odradek.admin.transactions import TransactionsAdmin
from odradek.cli.client_config import add_command_config_argument, load_command_config
from odradek.cli.topics import KafkaResponseError, parse_bootstrap
from odradek.errors import OperatorError


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "\t".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]


async def _run(args: argparse.Namespace, out: list[str]) -> None:
    client = await GroupAdminClient.connect(
        parse_bootstrap(args.bootstrap_server),
        args.timeout,
        load_command_config(getattr(args, "command_config", None)),
    )
    admin = TransactionsAdmin(client)
    try:
        if args.action == "list":
            listed = [
                (t.transactional_id, t.coordinator, t.producer_id, t.state)
                for t in await admin.list_transactions()
            ]
            out.extend(
                _table(("TransactionalId", "Coordinator", "ProducerId", "TransactionState"), listed)
            )
        elif args.action == "describe":
            state = await admin.describe(args.transactional_id)
            start = state.start_time_ms
            now = int(time.time() * 1000)
            partitions = ",".join(f"{t}-{p}" for t, p in state.partitions)
            out.extend(
                _table(
                    (
                        "CoordinatorId",
                        "TransactionalId",
                        "ProducerId",
                        "ProducerEpoch",
                        "TransactionState",
                        "TransactionTimeoutMs",
                        "CurrentTransactionStartTimeMs",
                        "TransactionDurationMs",
                        "TopicPartitions",
                    ),
                    [
                        (
                            state.coordinator,
                            state.transactional_id,
                            state.producer_id,
                            state.producer_epoch,
                            state.state,
                            state.timeout_ms,
                            start if start is not None else "None",
                            now - start if start is not None else "None",
                            partitions,
                        )
                    ],
                )
            )
        elif args.action == "describe-producers":
            rows = [
                (
                    p.producer_id,
                    p.producer_epoch,
                    p.coordinator_epoch,
                    p.last_sequence,
                    p.last_timestamp_ms,
                    p.current_txn_start_offset
                    if p.current_txn_start_offset is not None
                    else "None",
                )
                for p in await admin.producers(args.topic, args.partition)
            ]
            out.extend(
                _table(
                    (
                        "ProducerId",
                        "ProducerEpoch",
                        "LatestCoordinatorEpoch",
                        "LastSequence",
                        "LastTimestamp",
                        "CurrentTransactionStartOffset",
                    ),
                    rows,
                )
            )
        else:
            await _abort(admin, args, out)
    finally:
        client.close()


async def _abort(admin: TransactionsAdmin, args: argparse.Namespace, out: list[str]) -> None:
    if args.start_offset is not None:
        if args.producer_id is not None:
            raise OperatorError("give either --start-offset or --producer-id, not both")
        producer_id, epoch, _ = await admin.abort_hanging(
            args.topic, args.partition, args.start_offset
        )
    else:
        if None in (args.producer_id, args.producer_epoch, args.coordinator_epoch):
            raise OperatorError(
                "--start-offset, or all of --producer-id, --producer-epoch and "
                "--coordinator-epoch, are needed"
            )
        producer_id, epoch = args.producer_id, args.producer_epoch
        await admin.abort(args.topic, args.partition, producer_id, epoch, args.coordinator_epoch)
    out.append(
        f"Aborted the transaction of producer {producer_id} (epoch {epoch}) on "
        f"{args.topic}-{args.partition}"
    )


def cmd_transactions(args: argparse.Namespace) -> int:
    out: list[str] = []
    try:
        asyncio.run(_run(args, out))
    except (OperatorError, KafkaResponseError) as e:
        print(f"odradek: error: {e}", file=sys.stderr)
        return 1
    if out:
        print("\n".join(out))
    return 0


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "transactions",
        help="list, describe and abort transactions",
        description="List, describe and abort transactions (like kafka-transactions.sh).",
    )
    parser.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,HOST:PORT]")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait (default 30)")
    add_command_config_argument(parser)
    actions = parser.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="every transactional id of every coordinator")
    describe = actions.add_parser("describe", help="one transactional id's state")
    describe.add_argument("--transactional-id", required=True)
    producers = actions.add_parser("describe-producers", help="a partition's active producers")
    producers.add_argument("--topic", required=True)
    producers.add_argument("--partition", type=int, required=True)
    abort = actions.add_parser("abort", help="abort a hanging transaction on one partition")
    abort.add_argument("--topic", required=True)
    abort.add_argument("--partition", type=int, required=True)
    abort.add_argument("--start-offset", type=int)
    abort.add_argument("--producer-id", type=int)
    abort.add_argument("--producer-epoch", type=int)
    abort.add_argument("--coordinator-epoch", type=int)
    parser.set_defaults(func=cmd_transactions)
