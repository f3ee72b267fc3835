"""`odradek transactions`: list, describe and abort transactions, like Kafka's
`kafka-transactions.sh`.

  odradek transactions --bootstrap-server H:P list
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

from kio.schema.errors import ErrorCode

from odradek.cli.group_admin import GroupAdminClient
from odradek.cli.topics import KafkaResponseError, parse_bootstrap
from odradek.errors import OperatorError
from odradek.protocol.codec import ApiKey

LIST_TRANSACTIONS_VERSION = 1
DESCRIBE_TRANSACTIONS_VERSION = 0
DESCRIBE_PRODUCERS_VERSION = 0
WRITE_TXN_MARKERS_VERSION = 1
FIND_COORDINATOR_VERSION = 3
TRANSACTION_KEY_TYPE = 1


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "\t".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]


class TransactionsAdmin:
    def __init__(self, client: GroupAdminClient) -> None:
        self.client = client

    async def coordinator(self, transactional_id: str) -> int:
        client = self.client
        deadline = time.monotonic() + client.timeout
        while True:
            answer = await client._send(
                client.bootstrap,
                ApiKey.FIND_COORDINATOR,
                FIND_COORDINATOR_VERSION,
                {"key": transactional_id, "key_type": TRANSACTION_KEY_TYPE},
            )
            code = ErrorCode(answer.error_code)
            if code is ErrorCode.none:
                return int(answer.node_id)
            if time.monotonic() >= deadline or code not in (
                ErrorCode.coordinator_not_available,
                ErrorCode.coordinator_load_in_progress,
            ):
                raise KafkaResponseError(code, answer.error_message)
            await asyncio.sleep(0.2)

    async def list_transactions(self) -> list[tuple[str, int, int, str]]:
        found = []
        for broker_id in sorted(await self.client.brokers()):
            answer = await self.client.to_broker(
                broker_id,
                ApiKey.LIST_TRANSACTIONS,
                LIST_TRANSACTIONS_VERSION,
                {"state_filters": [], "producer_id_filters": [], "duration_filter": -1},
            )
            code = ErrorCode(answer.error_code)
            if code is not ErrorCode.none:
                raise KafkaResponseError(code, f"ListTransactions on broker {broker_id}")
            for state in answer.transaction_states:
                found.append(
                    (
                        state.transactional_id,
                        broker_id,
                        int(state.producer_id),
                        state.transaction_state,
                    )
                )
        return sorted(found)

    async def describe(self, transactional_id: str) -> tuple[int, Any]:
        coordinator = await self.coordinator(transactional_id)
        answer = await self.client.to_broker(
            coordinator,
            ApiKey.DESCRIBE_TRANSACTIONS,
            DESCRIBE_TRANSACTIONS_VERSION,
            {"transactional_ids": [transactional_id]},
        )
        (state,) = answer.transaction_states
        code = ErrorCode(state.error_code)
        if code is not ErrorCode.none:
            raise KafkaResponseError(code, f"describing {transactional_id}")
        return coordinator, state

    async def leader(self, topic: str, partition: int) -> int:
        metadata = await self.client.metadata([topic])
        for entry in metadata.topics:
            if ErrorCode(entry.error_code) is not ErrorCode.none:
                raise KafkaResponseError(ErrorCode(entry.error_code), f"topic {topic}")
            for p in entry.partitions:
                if int(p.partition_index) == partition:
                    return int(p.leader_id)
        raise OperatorError(f"{topic}-{partition} does not exist")

    async def producers(self, topic: str, partition: int) -> Sequence[Any]:
        leader = await self.leader(topic, partition)
        answer = await self.client.to_broker(
            leader,
            ApiKey.DESCRIBE_PRODUCERS,
            DESCRIBE_PRODUCERS_VERSION,
            {"topics": [{"name": topic, "partition_indexes": [partition]}]},
        )
        (result,) = answer.topics[0].partitions
        code = ErrorCode(result.error_code)
        if code is not ErrorCode.none:
            raise KafkaResponseError(code, result.error_message)
        return list(result.active_producers)

    async def abort(
        self, topic: str, partition: int, producer_id: int, epoch: int, coordinator_epoch: int
    ) -> None:
        leader = await self.leader(topic, partition)
        answer = await self.client.to_broker(
            leader,
            ApiKey.WRITE_TXN_MARKERS,
            WRITE_TXN_MARKERS_VERSION,
            {
                "markers": [
                    {
                        "producer_id": producer_id,
                        "producer_epoch": epoch,
                        "transaction_result": False,
                        "topics": [{"name": topic, "partition_indexes": [partition]}],
                        "coordinator_epoch": coordinator_epoch,
                    }
                ]
            },
        )
        code = ErrorCode(answer.markers[0].topics[0].partitions[0].error_code)
        if code is not ErrorCode.none:
            raise KafkaResponseError(code, f"aborting on {topic}-{partition}")


async def _run(args: argparse.Namespace, out: list[str]) -> None:
    client = await GroupAdminClient.connect(parse_bootstrap(args.bootstrap_server), args.timeout)
    admin = TransactionsAdmin(client)
    try:
        if args.action == "list":
            listed = await admin.list_transactions()
            out.extend(
                _table(("TransactionalId", "Coordinator", "ProducerId", "TransactionState"), listed)
            )
        elif args.action == "describe":
            coordinator, state = await admin.describe(args.transactional_id)
            start = _ms(state.transaction_start_time)
            now = int(time.time() * 1000)
            partitions = ",".join(f"{t.topic}-{p}" for t in state.topics for p in t.partitions)
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
                            coordinator,
                            state.transactional_id,
                            state.producer_id,
                            state.producer_epoch,
                            state.transaction_state,
                            _ms(state.transaction_timeout),
                            start if start >= 0 else "None",
                            now - start if start >= 0 else "None",
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
                    p.last_timestamp,
                    p.current_txn_start_offset if p.current_txn_start_offset >= 0 else "None",
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


def _ms(value: Any) -> int:
    import datetime

    if isinstance(value, datetime.timedelta):
        return value // datetime.timedelta(milliseconds=1)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    return int(value) if value is not None else -1


async def _abort(admin: TransactionsAdmin, args: argparse.Namespace, out: list[str]) -> None:
    if args.start_offset is not None:
        if args.producer_id is not None:
            raise OperatorError("give either --start-offset or --producer-id, not both")
        matching = [
            p
            for p in await admin.producers(args.topic, args.partition)
            if p.current_txn_start_offset == args.start_offset
        ]
        if not matching:
            raise OperatorError(
                f"no open transaction starts at offset {args.start_offset} of "
                f"{args.topic}-{args.partition}"
            )
        producer = matching[0]
        producer_id, epoch = int(producer.producer_id), int(producer.producer_epoch)
        coordinator_epoch = max(0, int(producer.coordinator_epoch))
    else:
        if None in (args.producer_id, args.producer_epoch, args.coordinator_epoch):
            raise OperatorError(
                "--start-offset, or all of --producer-id, --producer-epoch and "
                "--coordinator-epoch, are needed"
            )
        producer_id, epoch = args.producer_id, args.producer_epoch
        coordinator_epoch = args.coordinator_epoch
    await admin.abort(args.topic, args.partition, producer_id, epoch, coordinator_epoch)
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
