"""The controller page (`/controller`): the active controller's event queue, live.

Where it comes from: the active controller's broker serves its event manager's state as JSON on
its metrics listener (`/controller-events`: queue size, the event in progress and since when, its
last 50 events with how long each waited in the queue and how long it took; see
`odradek.server.metrics.json_endpoints`). The console asks the broker ZooKeeper names as
controller; if that one answers that it is not (the controller just moved), it asks every broker
and shows the one that is. The page's live region is polled like the overview's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from odradek.console import broker_json, views
from odradek.console.broker_json import BrokerAnswer
from odradek.console.snapshot import ClusterSnapshot

CONTROLLER_EVENTS_PATH = "/controller-events"


@dataclass(frozen=True, slots=True)
class EventRow:
    name: str
    queued_at_ms: int
    queue_ms: float
    process_ms: float
    failed: bool


@dataclass(frozen=True, slots=True)
class ControllerEvents:
    """The active controller's event queue as the page shows it."""

    broker_id: int
    controller_epoch: int | None
    queue_size: int
    events_processed: int
    in_progress: str | None
    in_progress_ms: float | None  # how long it has been running
    recent: tuple[EventRow, ...]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def read_controller_events(value: Any, now_ms: float) -> ControllerEvents | None:
    """A broker's `/controller-events` answer, or None unless it is the active controller's
    (unreadable entries of `recent` are left out)."""
    if not isinstance(value, dict) or value.get("active") is not True:
        return None
    broker_id = _number(value.get("broker_id"))
    if broker_id is None:
        return None
    epoch = _number(value.get("controller_epoch"))
    current = value.get("in_progress")
    name = running = None
    if isinstance(current, dict) and isinstance(current.get("name"), str):
        name, running = current["name"], _number(current.get("running_ms"))
        started = _number(current.get("started_ms"))
        if running is None and started is not None:  # a broker that does not say: our clock
            running = max(0.0, now_ms - started)
    recent = []
    for event in value.get("recent") or []:
        if not isinstance(event, dict) or not isinstance(event.get("name"), str):
            continue
        queued_at, queue_ms, process_ms = (
            _number(event.get(k)) for k in ("queued_at_ms", "queue_ms", "process_ms")
        )
        if queued_at is None or queue_ms is None or process_ms is None:
            continue
        recent.append(
            EventRow(
                event["name"], int(queued_at), queue_ms, process_ms, event.get("failed") is True
            )
        )
    return ControllerEvents(
        int(broker_id),
        int(epoch) if epoch is not None else None,
        int(_number(value.get("queue_size")) or 0),
        int(_number(value.get("events_processed")) or 0),
        name,
        running,
        tuple(recent),
    )


def pick_active(
    answers: Mapping[int, BrokerAnswer], now_ms: float
) -> tuple[ControllerEvents | None, list[str]]:
    """The active controller's events among `answers`, and what the others said."""
    notes = []
    for broker_id, answer in sorted(answers.items()):
        if answer.error is not None:
            notes.append(f"broker {broker_id}: {answer.error}")
            continue
        events = read_controller_events(answer.value, now_ms)
        if events is not None:
            return events, notes
        message = answer.value.get("message") if isinstance(answer.value, dict) else None
        notes.append(f"broker {broker_id}: {message or 'not the active controller'}")
    return None, notes


async def _ask(state: Any, snapshot: ClusterSnapshot) -> tuple[ControllerEvents | None, list[str]]:
    endpoints: dict[int, str] = state.metrics.endpoints
    if not endpoints:
        return None, ["The console was given no metrics listeners (--metrics or --cluster-dir)."]
    controller = snapshot.controller_id
    if controller is not None and controller in endpoints:
        answers = await broker_json.ask({controller: endpoints[controller]}, CONTROLLER_EVENTS_PATH)
        events, notes = pick_active(answers, time.time() * 1000)
        if events is not None:
            return events, notes
    # No controller in ZooKeeper, no address for it, or it moved since: ask them all.
    answers = await broker_json.ask(endpoints, CONTROLLER_EVENTS_PATH)
    return pick_active(answers, time.time() * 1000)


async def controller_page(request: Request) -> Response:
    state = request.app.state.console
    snapshot: ClusterSnapshot = await state.zk.current()
    events, notes = await _ask(state, snapshot)
    fragment = views.is_fragment(request.headers, "controller-events")
    return state.render(
        request,
        "_controller.html" if fragment else "controller.html",
        snapshot=snapshot,
        events=events,
        notes=notes,
    )
