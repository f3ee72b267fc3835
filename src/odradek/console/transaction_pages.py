"""The console's transactions pages and the abort action for a hanging transaction.

* `/transactions` (optionally `?state=Ongoing`): every transactional id of every coordinator
  (ListTransactions, filtered by state on the brokers) with its state, producer id and epoch,
  timeout, start time, how long it has run and its partitions (DescribeTransactions, one request
  per coordinator); a form to look at any partition's producers.
* `/transactions/<id>`: one transaction, and for each of its partitions the last stable offset,
  the high watermark and the active producers (DescribeProducers at the leader).
* `/producers?topic=T&partition=P`: one partition's producers, the way to find a hanging
  transaction, which no coordinator lists any more (`transaction_views` says which producers'
  open transactions are tracked and which hang).

The `abort-transaction` action is `odradek transactions abort --start-offset`: an ABORT marker
(WriteTxnMarkers) for the producer whose open transaction starts at that offset of the partition;
each open transaction in a producers table links to it pre-filled.

When `__transaction_state` does not exist (no producer has ever used a transactional id), or no
transactional id is listed, the pages say so rather than show an empty table.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from odradek.admin.transactions import TRANSACTION_STATES
from odradek.console import transaction_views
from odradek.console.actions import Action, Field, Plan, positive_int, topic_name
from odradek.console.admin_access import PartitionTransactions, TransactionRow, admin_access
from odradek.console.kafka_client import ConsoleError
from odradek.console.snapshot import ClusterSnapshot

TRANSACTION_TOPIC = "__transaction_state"


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _snapshot(state: Any) -> ClusterSnapshot:
    snapshot: ClusterSnapshot = await state.zk.current()
    if TRANSACTION_TOPIC not in snapshot.topics:
        snapshot = await state.zk.refresh()  # created a moment ago?
    return snapshot


async def transactions(request: Request) -> Response:
    state = request.app.state.console
    snapshot = await _snapshot(state)
    wanted = request.query_params.get("state", "")
    rows: list[TransactionRow] = []
    error = None
    exists = TRANSACTION_TOPIC in snapshot.topics
    if exists:
        try:
            rows = await admin_access(state).transactions(transaction_views.state_filter(wanted))
        except (ValueError, ConsoleError) as e:
            error = str(e)
    now = _now_ms()
    return state.render(
        request,
        "transactions.html",
        exists=exists,
        rows=[
            {
                "row": r,
                "running": transaction_views.duration_text(
                    transaction_views.running_ms(r.description, now) if r.description else None
                ),
            }
            for r in rows
        ],
        state=wanted,
        states=TRANSACTION_STATES,
        error=error,
    )


async def _partition_tables(
    state: Any, partitions: list[tuple[str, int]]
) -> tuple[list[dict[str, Any]], str | None]:
    """Each partition's offsets and producer rows, judged against every transaction the
    coordinators describe now."""
    access = admin_access(state)
    found: list[PartitionTransactions] = await access.partitions(partitions)
    error = None
    try:
        described = [r.description for r in await access.transactions() if r.description]
    except ConsoleError as e:
        described, error = [], f"Could not list the transactions to judge the producers: {e}"
    tables = []
    for p in found:
        rows = transaction_views.producer_rows(
            p.topic, p.partition, p.producers, described, p.last_stable_offset
        )
        tables.append({"partition": p, "rows": rows, "abort": _abort_links(p, rows)})
    return tables, error


def _abort_links(p: PartitionTransactions, rows: list[Any]) -> dict[int, str]:
    """producer id -> the abort action's form, pre-filled, for each open transaction."""
    return {
        r.producer.producer_id: "/actions/abort-transaction?"
        + urlencode(
            {
                "topic": p.topic,
                "partition": p.partition,
                "start_offset": r.producer.current_txn_start_offset,
                "producer_id": r.producer.producer_id,
            }
        )
        for r in rows
        if r.producer.current_txn_start_offset is not None
    }


async def transaction(request: Request) -> Response:
    state = request.app.state.console
    transactional_id = request.path_params["transactional_id"]
    try:
        described = await admin_access(state).transaction(transactional_id)
    except ConsoleError as e:
        return state.render(request, "error.html", status_code=502, message=str(e))
    tables, error = await _partition_tables(state, list(described.partitions))
    running = transaction_views.running_ms(described, _now_ms())
    return state.render(
        request,
        "transaction.html",
        txn=described,
        running=transaction_views.duration_text(running),
        tables=tables,
        error=error,
    )


async def producers(request: Request) -> Response:
    state = request.app.state.console
    snapshot = await _snapshot(state)
    topic = request.query_params.get("topic", "").strip()
    text = request.query_params.get("partition", "0").strip() or "0"
    summary = snapshot.topics.get(topic)
    if summary is None:
        summary = (await state.zk.refresh()).topics.get(topic)  # created a moment ago?
    if summary is None:
        return state.render(
            request, "error.html", status_code=404, message=f"Topic {topic!r} does not exist."
        )
    try:
        partition = positive_int(text, "The partition", low=0)
        if partition >= summary.counts.partitions:
            raise ValueError(
                f"Partition {partition} does not exist ({topic} has {summary.counts.partitions})"
            )
    except ValueError as e:
        return state.render(request, "error.html", status_code=400, message=str(e))
    tables, error = await _partition_tables(state, [(topic, partition)])
    return state.render(
        request, "producers.html", topic=topic, partition=partition, tables=tables, error=error
    )


# -- the abort action -------------------------------------------------------------------------


def _plan_abort(form: Mapping[str, str], snapshot: Any) -> Plan:
    topic = topic_name(form.get("topic", ""))
    summary = snapshot.topics.get(topic)
    if summary is None:
        raise ValueError(f"Topic {topic} does not exist")
    partition = positive_int(form.get("partition", ""), "The partition", low=0)
    if partition >= summary.counts.partitions:
        raise ValueError(
            f"Partition {partition} does not exist ({topic} has {summary.counts.partitions})"
        )
    start = positive_int(form.get("start_offset", ""), "The start offset", low=0)
    text = form.get("producer_id", "").strip()
    producer_id = positive_int(text, "The producer id", low=0) if text else None
    whose = f" by producer {producer_id}" if producer_id is not None else ""
    return Plan(
        {"topic": topic, "partition": partition, "start": start, "producer_id": producer_id},
        [
            f"Abort the open transaction{whose} that starts at offset {start} of"
            f" {topic}-{partition}: write an ABORT marker (WriteTxnMarkers) to that partition for"
            " its producer, found with DescribeProducers when you confirm — the request"
            f" `odradek transactions abort --topic {topic} --partition {partition}"
            f" --start-offset {start}` sends.",
            "Its records on this partition are discarded for read_committed consumers, and the"
            " partition's last stable offset moves past it. Other partitions are not touched.",
            "Meant for a hanging transaction (one no coordinator tracks): a transaction its"
            " coordinator still tracks ends by itself, aborted after its transaction.timeout.ms.",
        ],
    )


async def _run_abort(state: Any, p: dict[str, Any]) -> tuple[str, str]:
    producer_id, epoch, coordinator_epoch = await admin_access(state).abort(
        p["topic"], p["partition"], p["start"], p["producer_id"]
    )
    return (
        f"Wrote an ABORT marker on {p['topic']}-{p['partition']} for producer {producer_id}"
        f" (epoch {epoch}, coordinator epoch {coordinator_epoch}).",
        "/producers?" + urlencode({"topic": p["topic"], "partition": p["partition"]}),
    )


ACTIONS = (
    Action(
        "abort-transaction",
        "Abort a hanging transaction",
        (
            Field("topic", "Topic"),
            Field("partition", "Partition", "number", default="0"),
            Field("start_offset", "Start offset of the open transaction", "number"),
            Field(
                "producer_id",
                "Producer id (optional: only this producer's)",
                "number",
                required=False,
            ),
        ),
        _plan_abort,
        _run_abort,
        danger=True,
    ),
)


def routes() -> list[Route]:
    return [
        Route("/transactions", transactions),
        Route("/transactions/{transactional_id:path}", transaction),
        Route("/producers", producers),
    ]
