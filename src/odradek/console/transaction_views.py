"""The pure logic of the console's transactions pages: the state filter, durations, and what each
active producer of a partition means for an operator looking for a hanging transaction.

A partition's *last stable offset* (LSO) is the first offset of a transaction not yet decided.
A transaction is *hanging* when it is open on a partition (DescribeProducers reports a current
transaction start offset) while no coordinator tracks it as in progress there: its producer id is
in no Ongoing or Prepare* transaction that includes the partition. Nothing will ever write its
marker, so the LSO stays at its start for ever and read_committed consumers stop there; only an
operator's abort (WriteTxnMarkers) ends it. An open transaction its coordinator tracks ends by
itself (committed, aborted, or aborted by the coordinator after `transaction.timeout.ms`).

No I/O here (tests/unit/test_console_transactions.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from odradek.admin.transactions import TRANSACTION_STATES, ActiveProducer, TransactionDescription

# States in which a coordinator still owes the partitions a marker.
IN_PROGRESS = frozenset({"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"})


def state_filter(text: str) -> tuple[str, ...]:
    """The ListTransactions state filter from the page's `state` parameter: () for any, else the
    one state named (Kafka's spelling, any case); ValueError naming the states otherwise."""
    wanted = text.strip().lower()
    if not wanted:
        return ()
    for state in TRANSACTION_STATES:
        if state.lower() == wanted:
            return (state,)
    raise ValueError(
        f"Unknown transaction state {text.strip()!r}: one of {', '.join(TRANSACTION_STATES)}"
    )


def duration_text(ms: int | None) -> str:
    """`450 ms`, `12.3 s`, `4 min 05 s`, `2 h 03 min`; `-` for unknown."""
    if ms is None or ms < 0:
        return "-"
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, second = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {second:02d} s"
    hours, minute = divmod(minutes, 60)
    return f"{hours} h {minute:02d} min"


def running_ms(description: TransactionDescription, now_ms: int) -> int | None:
    """How long the transaction in progress has run (None when none is)."""
    if description.start_time_ms is None or description.state not in IN_PROGRESS:
        return None
    return max(0, now_ms - description.start_time_ms)


@dataclass(frozen=True, slots=True)
class ProducerRow:
    producer: ActiveProducer
    transactional_id: str | None  # the coordinator's transaction with this producer id here
    state: str | None  # that transaction's state
    verdict: str  # "none" (no open transaction) | "tracked" | "hanging"
    holds_lso: bool  # its open transaction is where the partition's LSO stands

    @property
    def hanging(self) -> bool:
        return self.verdict == "hanging"


def producer_rows(
    topic: str,
    partition: int,
    producers: Iterable[ActiveProducer],
    transactions: Iterable[TransactionDescription],
    last_stable_offset: int | None,
) -> list[ProducerRow]:
    """Each active producer of a partition with what it means: no open transaction; an open one
    its coordinator tracks in progress on this partition (`tracked`); or an open one nobody
    tracks (`hanging`). `transactions`: every transaction the coordinators described. Sorted
    with the open transactions first, oldest start offset first."""
    here = (topic, partition)
    by_producer: dict[int, TransactionDescription] = {}
    for described in transactions:
        # A producer id belongs to one transactional id; prefer the description listing here.
        known = by_producer.get(described.producer_id)
        if known is None or here in described.partitions:
            by_producer[described.producer_id] = described
    rows = []
    for producer in producers:
        described = by_producer.get(producer.producer_id)
        start = producer.current_txn_start_offset
        if start is None:
            verdict = "none"
        elif (
            described is not None
            and described.state in IN_PROGRESS
            and here in described.partitions
        ):
            verdict = "tracked"
        else:
            verdict = "hanging"
        rows.append(
            ProducerRow(
                producer,
                described.transactional_id if described else None,
                described.state if described else None,
                verdict,
                start is not None and start == last_stable_offset,
            )
        )
    rows.sort(
        key=lambda r: (
            r.producer.current_txn_start_offset is None,
            r.producer.current_txn_start_offset or 0,
            r.producer.producer_id,
        )
    )
    return rows
