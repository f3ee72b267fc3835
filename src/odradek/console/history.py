"""A partition's history page (`/topics/<name>/partitions/<p>`): the controller's state-change
log entries about it, merged from every broker, beside the leader and ISR changes the console saw
in ZooKeeper.

Where it comes from: each broker keeps its controller's recent state-change entries in memory, per
partition (`odradek.controller.state_change_history`), and serves them as JSON on its metrics
listener (`/state-changes?topic=T&partition=P`). Only the controller of the moment writes entries,
so after a failover the old controller holds the entries before it and the new one those after:
the console asks every broker and merges. (The `state-change.log` files hold the same lines, but
only on the brokers' own machines; the endpoint works for a remote cluster too.) Entries are gone
when the broker that holds them restarts, and a broker keeps at most 64 per partition.

Order: by controller epoch, then the logging broker's clock, then the order the broker kept them
in. The controller epoch is ZooKeeper's and increases at each failover, so two controllers'
entries are ordered correctly even when their machines' clocks disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from odradek.console import broker_json, views
from odradek.console.broker_json import BrokerAnswer
from odradek.console.snapshot import ClusterSnapshot

STATE_CHANGES_PATH = "/state-changes"


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """One state-change entry as the page shows it; `note` says what it changed (the leader or
    the ISR, compared with the partition's previous entry that named them)."""

    time_ms: int
    broker_id: int
    controller_epoch: int
    replica: int | None
    from_state: str
    to_state: str
    leader: int | None
    leader_epoch: int | None
    isr: tuple[int, ...] | None
    note: str = ""

    @property
    def subject(self) -> str:
        return "partition" if self.replica is None else f"replica {self.replica}"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _row(broker_id: int, entry: Any) -> HistoryRow | None:
    """An entry of a broker's answer, or None when it is not one (a broker of another version)."""
    if not isinstance(entry, dict):
        return None
    time_ms, epoch = _int(entry.get("time_ms")), _int(entry.get("controller_epoch"))
    from_state, to_state = entry.get("from_state"), entry.get("to_state")
    if time_ms is None or epoch is None:
        return None
    if not isinstance(from_state, str) or not isinstance(to_state, str):
        return None
    isr = entry.get("isr")
    if isr is not None and not (isinstance(isr, list) and all(_int(i) is not None for i in isr)):
        return None
    logged_by = _int(entry.get("controller_id"))
    return HistoryRow(
        time_ms,
        broker_id if logged_by is None else logged_by,
        epoch,
        _int(entry.get("replica")),
        from_state,
        to_state,
        _int(entry.get("leader")),
        _int(entry.get("leader_epoch")),
        tuple(isr) if isr is not None else None,
    )


def _annotate(rows: Iterable[HistoryRow]) -> list[HistoryRow]:
    """`rows` (oldest first) with each leader-naming partition entry's note: what changed."""
    annotated = []
    leader: int | None = None
    isr: tuple[int, ...] | None = None
    seen = False
    for row in rows:
        note = ""
        if row.replica is None and row.leader is not None:
            parts = []
            if not seen:
                parts.append(f"leader {row.leader}, ISR {list(row.isr or ())}")
            else:
                if row.leader != leader:
                    parts.append(f"leader {leader} -> {row.leader}")
                if row.isr != isr:
                    parts.append(f"ISR {list(isr or ())} -> {list(row.isr or ())}")
            note = "; ".join(parts)
            seen, leader, isr = True, row.leader, row.isr
        elif row.replica is None and row.to_state == "OfflinePartition":
            note = "no leader"
        annotated.append(
            HistoryRow(
                row.time_ms,
                row.broker_id,
                row.controller_epoch,
                row.replica,
                row.from_state,
                row.to_state,
                row.leader,
                row.leader_epoch,
                row.isr,
                note,
            )
        )
    return annotated


def merge_history(answers: Mapping[int, BrokerAnswer]) -> tuple[list[HistoryRow], list[str]]:
    """Every broker's entries as one timeline, newest first, and what went wrong asking (a broker
    unreachable, or answering entries this console cannot read)."""
    keyed: list[tuple[int, int, int, int, HistoryRow]] = []
    errors: list[str] = []
    for broker_id, answer in sorted(answers.items()):
        if answer.error is not None:
            errors.append(f"broker {broker_id}: {answer.error}")
            continue
        entries = answer.value.get("entries") if isinstance(answer.value, dict) else None
        if not isinstance(entries, list):
            errors.append(f"broker {broker_id}: an answer without entries")
            continue
        unreadable = 0
        for index, entry in enumerate(entries):
            row = _row(broker_id, entry)
            if row is None:
                unreadable += 1
                continue
            keyed.append((row.controller_epoch, row.time_ms, broker_id, index, row))
        if unreadable:
            errors.append(f"broker {broker_id}: {unreadable} unreadable entries skipped")
    keyed.sort(key=lambda k: k[:4])
    return list(reversed(_annotate(k[4] for k in keyed))), errors


def _state(request: Request) -> Any:
    return request.app.state.console


async def partition_history(request: Request) -> Response:
    state = _state(request)
    snapshot: ClusterSnapshot = await state.zk.current()
    name = request.path_params["name"]
    number = request.path_params["partition"]
    summary = snapshot.topics.get(name)
    if summary is None or number >= len(summary.partitions):
        snapshot = await state.zk.refresh()  # created a moment ago?
        summary = snapshot.topics.get(name)
    row = next((p for p in summary.partitions if p.partition == number), None) if summary else None
    if summary is None or row is None:
        message = f"Partition {number} of topic {name} does not exist."
        return state.render(request, "error.html", status_code=404, message=message)
    answers = await broker_json.ask(
        state.metrics.endpoints, STATE_CHANGES_PATH, {"topic": name, "partition": number}
    )
    history, errors = merge_history(answers)
    changes = [c for c in state.zk.recent_changes(name, limit=200) if c.partition == number][:30]
    fragment = views.is_fragment(request.headers, "partition-history")
    return state.render(
        request,
        "_partition_history.html" if fragment else "partition.html",
        snapshot=snapshot,
        topic=summary,
        p=row,
        history=history,
        history_errors=errors,
        metrics_enabled=state.metrics.enabled,
        changes=changes,
    )
