"""The console's read-only pages: overview, topics, a topic, the record browser, consumer groups,
reassignments. Each handler reads one `ClusterSnapshot` (plus the protocol and metrics where the
page needs them) and renders a template; a request sent by htmx (`HX-Request`) for a live region
gets only that region's fragment.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from odradek.console import views
from odradek.console.broker_metrics import CONTROLLER_STATES, BrokerScrape, ReplicaLog
from odradek.console.kafka_client import ConsoleError
from odradek.console.snapshot import ClusterSnapshot, PartitionRow, TopicSummary

PARTITIONS_PAGE_SIZE = 100
# How long a topic page waits for the brokers' per-replica metrics before rendering without the
# newest ones (they arrive for the page's next live refresh).
REPLICA_LOGS_WAIT_S = 0.3
DEFAULT_RECORDS = 20


def _state(request: Request) -> Any:
    return request.app.state.console


async def _scrapes(request: Request) -> tuple[dict[int, BrokerScrape], str | None]:
    state = _state(request)
    if not state.metrics.enabled:
        return {}, None
    scrapes = await state.metrics.sample()
    errors = [s.error for s in scrapes.values() if s.error]
    return scrapes, ("; ".join(errors) if errors else None)


async def _moving_logs(
    request: Request, partitions: Iterable[PartitionRow]
) -> tuple[dict[int, Any], str | None]:
    """The replica logs of the partitions being moved, and only those (one topic-filtered
    scrape per topic: the brokers build no other replica's gauges)."""
    state = _state(request)
    if not state.metrics.enabled:
        return {}, None
    logs, errors = await state.metrics.moving_logs(
        ((p.topic, p.partition) for p in partitions), wait_s=REPLICA_LOGS_WAIT_S
    )
    return logs, ("; ".join(errors) if errors else None)


def _not_found(request: Request, what: str) -> Response:
    return _state(request).render(request, "error.html", status_code=404, message=f"{what}")


# -- overview ---------------------------------------------------------------------------------


async def _overview_context(request: Request) -> dict[str, Any]:
    state = _state(request)
    snapshot: ClusterSnapshot = await state.zk.current()
    scrapes, metrics_error = await _scrapes(request)
    history = list(state.metrics.history)
    return {
        "snapshot": snapshot,
        "metrics_enabled": state.metrics.enabled,
        "metrics_error": metrics_error,
        "scrapes": scrapes,
        "rates": history[-1] if history else None,
        "history": history,
        "unhealthy_topics": [t for t in snapshot.topics.values() if t.status != "healthy"][:20],
        "changes": state.zk.recent_changes(limit=15),
        "controller_states": CONTROLLER_STATES,
    }


async def overview(request: Request) -> Response:
    context = await _overview_context(request)
    return _state(request).render(request, "overview.html", **context)


async def overview_fragment(request: Request) -> Response:
    context = await _overview_context(request)
    return _state(request).render(request, "_overview.html", **context)


async def health(request: Request) -> Response:
    snapshot = await _state(request).zk.current()
    return PlainTextResponse(f"ok {snapshot.alive_brokers} brokers\n")


# -- topics -----------------------------------------------------------------------------------


async def topics(request: Request) -> Response:
    state = _state(request)
    snapshot: ClusterSnapshot = await state.zk.current()
    query = request.query_params.get("q", "")
    status = request.query_params.get("status", "")
    internal = request.query_params.get("internal", "1") != "0"
    number = views.parse_int(request.query_params.get("page"), 1, 1, 1_000_000)
    size = views.parse_int(
        request.query_params.get("size"), views.DEFAULT_PAGE_SIZE, 1, views.MAX_PAGE_SIZE
    )
    matching = views.filter_topics(snapshot.topics.values(), query, status, internal)
    page = views.paginate(matching, number, size)
    context = {
        "snapshot": snapshot,
        "page": page,
        "q": query,
        "status": status,
        "internal": internal,
        "statuses": views.TOPIC_STATUSES,
    }
    template = (
        "_topics_table.html"
        if views.is_fragment(request.headers, "topics-table")
        else "topics.html"
    )
    return state.render(request, template, **context)


async def _high_watermarks(
    request: Request, partitions: Sequence[PartitionRow]
) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], str], str | None]:
    """The page's high watermarks, asked of the leaders the snapshot names (`leader_offsets`:
    never a Metadata of the whole topic); each partition without one, with why; and one line
    about those for the top of the table."""
    state = _state(request)
    results = await state.leader_offsets.high_watermarks(
        {(p.topic, p.partition): (p.leader if p.online else -1) for p in partitions}
    )
    offsets = {key: value for key, value in results.items() if isinstance(value, int)}
    errors = {key: str(value) for key, value in results.items() if not isinstance(value, int)}
    summary = None
    if errors:
        distinct = sorted(set(errors.values()))
        summary = f"{len(errors)} of {len(results)} partition(s) without a high watermark" + (
            f": {distinct[0]}" if len(distinct) == 1 else ""
        )
    return offsets, errors, summary


async def _partition_rows(
    request: Request, summary: TopicSummary, which: str, number: int
) -> dict[str, Any]:
    """The partitions table of a topic page: one page of partitions with each one's high
    watermark (ListOffsets at its leader) and each replica's log end offset and size (the
    brokers' metrics, scraped for this page's partitions only), both asked at once."""
    state = _state(request)
    page = views.paginate(
        views.filter_partitions(summary.partitions, which), number, PARTITIONS_PAGE_SIZE
    )
    # Only this page's replicas: the brokers build their gauges for those alone.
    (high_watermarks, offset_errors, error), (logs, errors) = await asyncio.gather(
        _high_watermarks(request, page.items),
        state.metrics.topic_logs(
            summary.name, [p.partition for p in page.items], wait_s=REPLICA_LOGS_WAIT_S
        ),
    )
    metrics_error = "; ".join(errors) if errors else None
    replicas: dict[tuple[int, int], Any] = {}
    for p in page.items:
        for broker_id in p.replicas:
            hosted = logs.get(broker_id)
            if hosted is not None:
                replicas[(p.partition, broker_id)] = hosted.get((p.topic, p.partition))
    return {
        "partitions": page,
        "which": which,
        "filters": views.PARTITION_FILTERS,
        "high_watermarks": high_watermarks,
        "offset_errors": offset_errors,
        "replica_logs": replicas,
        "metrics_enabled": state.metrics.enabled,
        "changes": state.zk.recent_changes(summary.name, limit=30),
        "offsets_error": error,
        "metrics_error": metrics_error,
    }


async def _topic_configs(request: Request, name: str) -> tuple[list[Any], str | None]:
    state = _state(request)
    try:
        return await state.kafka_call(state.kafka.topic_configs, name), None
    except ConsoleError as e:
        return [], str(e)


async def topic(request: Request) -> Response:
    state = _state(request)
    snapshot: ClusterSnapshot = await state.zk.current()
    name = request.path_params["name"]
    summary = snapshot.topics.get(name)
    if summary is None:
        snapshot = await state.zk.refresh()  # created a moment ago?
        summary = snapshot.topics.get(name)
    if summary is None:
        return _not_found(request, f"Topic {name} does not exist.")
    which = request.query_params.get("which", "all")
    number = views.parse_int(request.query_params.get("page"), 1, 1, 1_000_000)
    (configs, configs_error), table = await asyncio.gather(
        _topic_configs(request, name), _partition_rows(request, summary, which, number)
    )
    return state.render(
        request,
        "topic.html",
        snapshot=snapshot,
        topic=summary,
        configs=configs,
        configs_error=configs_error,
        **table,
    )


async def topic_partitions(request: Request) -> Response:
    state = _state(request)
    snapshot: ClusterSnapshot = await state.zk.current()
    summary = snapshot.topics.get(request.path_params["name"])
    if summary is None:
        return _not_found(request, f"Topic {request.path_params['name']} does not exist.")
    which = request.query_params.get("which", "all")
    number = views.parse_int(request.query_params.get("page"), 1, 1, 1_000_000)
    table = await _partition_rows(request, summary, which, number)
    return state.render(request, "_partitions.html", topic=summary, **table)


def _timestamp_ms(text: str) -> int:
    """Milliseconds since the epoch, or a local date-time (`2026-01-31T12:00[:00]`)."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    moment = dt.datetime.fromisoformat(text)
    return int(moment.timestamp() * 1000)


async def records(request: Request) -> Response:
    state = _state(request)
    snapshot: ClusterSnapshot = await state.zk.current()
    name = request.path_params["name"]
    summary = snapshot.topics.get(name)
    if summary is None:
        return _not_found(request, f"Topic {name} does not exist.")
    params = request.query_params
    partition = views.parse_int(params.get("partition"), 0, 0, max(0, len(summary.partitions) - 1))
    count = views.parse_int(params.get("count"), DEFAULT_RECORDS, 1, 500)
    mode = params.get("mode", "latest")
    fmt = params.get("format", "text")
    fmt = fmt if fmt in views.RECORD_FORMATS else "text"
    error = None
    found: list[Any] = []
    low = high = None
    try:
        kwargs: dict[str, Any] = {}
        if mode == "offset":
            kwargs["from_offset"] = int(params.get("offset", "0"))
        elif mode == "timestamp":
            kwargs["from_timestamp_ms"] = _timestamp_ms(params.get("timestamp", ""))
        key = (name, partition)
        leader = snapshot_leaders(snapshot, [key])[key]
        found, low, high = await state.records.browse(key, leader, count, **kwargs)
    except ValueError as e:
        error = f"Bad offset or timestamp: {e}"
    except ConsoleError as e:
        error = str(e)
    rendered = [
        {
            "record": r,
            "key": views.render_bytes(r.key, fmt),
            "value": views.render_bytes(r.value, fmt),
            "headers": [(k, views.render_bytes(v, fmt)) for k, v in r.headers],
        }
        for r in found
    ]
    return state.render(
        request,
        "records.html",
        topic=summary,
        partition=partition,
        count=count,
        mode=mode,
        fmt=fmt,
        formats=views.RECORD_FORMATS,
        offset=params.get("offset", ""),
        timestamp=params.get("timestamp", ""),
        records=rendered,
        low=low,
        high=high,
        error=error,
    )


# -- consumer groups --------------------------------------------------------------------------


async def groups(request: Request) -> Response:
    state = _state(request)
    error = None
    try:
        listing = await state.kafka_call(state.kafka.groups)
    except ConsoleError as e:
        listing, error = [], str(e)
    return state.render(request, "groups.html", groups=listing, error=error)


def snapshot_leaders(
    snapshot: ClusterSnapshot, keys: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    """Each partition's leader as `snapshot` names it; -1 when it has none online or the
    snapshot does not know the partition (`LeaderOffsets` then reads ZooKeeper again)."""
    rows: dict[str, dict[int, PartitionRow]] = {}
    leaders = {}
    for topic, partition in keys:
        if topic not in rows:
            summary = snapshot.topics.get(topic)
            rows[topic] = {p.partition: p for p in summary.partitions} if summary else {}
        row = rows[topic].get(partition)
        leaders[(topic, partition)] = row.leader if row is not None and row.online else -1
    return leaders


async def group(request: Request) -> Response:
    state = _state(request)
    group_id = request.path_params["group_id"]
    try:
        described = await state.kafka_call(state.kafka.describe_group, group_id)
    except ConsoleError as e:
        return state.render(request, "error.html", status_code=502, message=str(e))
    owners = {
        tp: (m.member_id, m.client_id, m.host) for m in described.members for tp in m.assignment
    }
    keys = sorted(set(described.committed) | set(owners))
    snapshot: ClusterSnapshot = await state.zk.current()
    # The ends: high watermarks at the leaders the snapshot names (`leader_offsets`), as for
    # the topic page; a partition without one shows no lag.
    results = await state.leader_offsets.high_watermarks(snapshot_leaders(snapshot, keys))
    ends = {key: value for key, value in results.items() if isinstance(value, int)}
    failed = sorted({str(value) for value in results.values() if not isinstance(value, int)})
    error = (
        f"{len(results) - len(ends)} partition(s) without a high watermark: {failed[0]}"
        if failed
        else None
    )
    rows = views.group_lag(described.committed, ends, owners)
    return state.render(
        request,
        "group.html",
        group=described,
        rows=rows,
        total_lag=views.total_lag(rows),
        topics=sorted({r.topic for r in rows}),
        error=error,
    )


# -- reassignments ----------------------------------------------------------------------------


def reassignment_progress(
    p: PartitionRow, logs: dict[int, dict[tuple[str, int], ReplicaLog]]
) -> list[dict[str, Any]]:
    """For each replica being added: its log end offset and the leader's, and the share caught
    up (bytes too when the metrics give sizes)."""
    leader_log = logs.get(p.leader, {}).get((p.topic, p.partition))
    rows = []
    for broker_id in p.adding_replicas:
        replica_log = logs.get(broker_id, {}).get((p.topic, p.partition))
        percent = None
        if leader_log and replica_log and leader_log.size:
            percent = min(100.0, 100.0 * (replica_log.size or 0) / leader_log.size)
        elif leader_log and replica_log and leader_log.log_end_offset is not None:
            percent = (
                100.0
                if not leader_log.log_end_offset
                else min(
                    100.0, 100.0 * (replica_log.log_end_offset or 0) / leader_log.log_end_offset
                )
            )
        rows.append(
            {"broker": broker_id, "log": replica_log, "leader_log": leader_log, "percent": percent}
        )
    return rows


async def reassignments(request: Request) -> Response:
    state = _state(request)
    snapshot: ClusterSnapshot = await state.zk.current()
    logs, metrics_error = (
        await _moving_logs(request, snapshot.reassignments)
        if snapshot.reassignments
        else ({}, None)
    )
    moving = [
        {"partition": p, "progress": reassignment_progress(p, logs)} for p in snapshot.reassignments
    ]
    return state.render(
        request,
        "reassignments.html",
        snapshot=snapshot,
        moving=moving,
        metrics_enabled=state.metrics.enabled,
        metrics_error=metrics_error,
    )
