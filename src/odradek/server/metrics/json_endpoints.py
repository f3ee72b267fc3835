"""The broker's JSON endpoints beside `/metrics`, for consoles: what its controller has done.

* `/state-changes?topic=T&partition=P`: the recent state-change log entries this broker's
  controller wrote about partition P of T (its partition and replica transitions, with leader,
  leader epoch and ISR where the entry has them), oldest first, from the in-memory ring
  `controller.state_change_history` (empty on a broker that has not been controller since it
  started, or whose ring has evicted the partition). A console asks every broker and merges.
  `{"broker_id": 1, "topic": "t", "partition": 0, "entries": [{"time_ms": ..., "controller_id": 1,
  "controller_epoch": 3, "topic": "t", "partition": 0, "replica": null, "from_state":
  "OnlinePartition", "to_state": "OnlinePartition", "leader": 2, "leader_epoch": 5, "isr": [2, 3]},
  ...]}`.
* `/controller-events`: on the active controller, its event queue: `{"broker_id": 1, "active":
  true, "controller_epoch": 3, "queue_size": 0, "events_processed": 42, "in_progress": null or
  {"name", "started_ms", "running_ms", "queue_ms"}, "recent": [{"name", "queued_at_ms", "queue_ms",
  "process_ms", "failed"}, ...newest first]}`; on any other broker `{"broker_id": 2, "active":
  false, "active_controller_id": 1, "message": "broker 2 is not the active controller"}`.

Parameters are checked on the HTTP thread (`filters`); the function returned runs on the event loop
and copies a few bounded collections (tens of entries), so it costs the loop microseconds.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from odradek.server.metrics.exporter import JsonEndpoint
from odradek.server.metrics.filters import parse_topic_partition


def state_changes(broker: Any, params: Mapping[str, Sequence[str]]) -> Callable[[], Any]:
    topic, partition = parse_topic_partition(params)

    def on_loop() -> dict[str, Any]:
        controller = broker.controller
        entries = (
            controller.state_change_logger.history.entries(topic, partition)
            if controller is not None
            else []
        )
        return {
            "broker_id": broker.broker_id,
            "topic": topic,
            "partition": partition,
            "entries": [entry.to_json() for entry in entries],
        }

    return on_loop


def controller_events(broker: Any, params: Mapping[str, Sequence[str]]) -> Callable[[], Any]:
    def on_loop() -> dict[str, Any]:
        controller = broker.controller
        manager = controller.event_manager if controller is not None else None
        if controller is None or manager is None or not controller.is_active:
            return {
                "broker_id": broker.broker_id,
                "active": False,
                "active_controller_id": (
                    controller.active_controller_id if controller is not None else -1
                ),
                "message": f"broker {broker.broker_id} is not the active controller",
            }
        current = manager.current_event
        in_progress = None
        if current is not None:
            in_progress = {
                "name": getattr(current, "name", type(current).__name__),
                "started_ms": manager.current_started_ms,
                # Measured here, so that a console's clock does not matter.
                "running_ms": round(time.time() * 1000 - manager.current_started_ms, 1),
                "queue_ms": round(manager.current_queue_ms, 3),
            }
        return {
            "broker_id": broker.broker_id,
            "active": True,
            "controller_epoch": controller.context.epoch,
            "queue_size": manager.queue_size,
            "events_processed": manager.events_processed,
            "in_progress": in_progress,
            "recent": [
                {
                    "name": e.name,
                    "queued_at_ms": e.queued_at_ms,
                    "queue_ms": round(e.queue_ms, 3),
                    "process_ms": round(e.process_ms, 3),
                    "failed": e.failed,
                }
                for e in reversed(manager.recent)
            ],
        }

    return on_loop


def broker_json_endpoints(broker: Any) -> dict[str, JsonEndpoint]:
    """The JSON endpoints of `broker`, by path, for `MetricsExporter`."""
    return {
        "/state-changes": functools.partial(state_changes, broker),
        "/controller-events": functools.partial(controller_events, broker),
    }
