"""The controller's metrics (Kafka's ControllerStats and ControllerEventManager timers).

* `event_queue`: every event's wait in the queue (`kafka.controller:type=ControllerEventManager,
  name=EventQueueTimeMs`);
* `leader_election`: the processing time of every BrokerChange-state event -- a broker joined,
  left or changed, and the controller elected leaders for the partitions concerned. Kafka keeps a
  rate-and-time timer per ControllerState, and the one of `ControllerState.BrokerChange` is named
  `LeaderElectionRateAndTimeMs` (`kafka.controller:type=ControllerStats`): so its count is the
  number of such events (each may elect many leaders), its times their durations. Elections of
  other events (preferred-replica, reassignment, controlled shutdown) are not in it, as in Kafka;
* `unclean_leader_elections`: leaders chosen outside the ISR (`UncleanLeaderElectionsPerSec`).

One object per broker, kept across controller terms (the metrics are cumulative). Recorded by the
event manager's `on_processed` hook and the partition state machine, both on the controller's
task; read at scrape time on the same event loop. O(1) per event.
"""

from __future__ import annotations

from typing import Protocol

from odradek.histogram import LatencyHistogram

# Events whose Kafka ControllerState is BrokerChange (kafka.controller.ControllerState).
BROKER_CHANGE_EVENTS = frozenset({"BrokerChange", "BrokerModification"})


class _Processed(Protocol):
    name: str
    queue_ms: float
    process_ms: float


class ControllerStats:
    def __init__(self) -> None:
        self.event_queue = LatencyHistogram()
        self.leader_election = LatencyHistogram()
        self.unclean_leader_elections = 0

    def event_processed(self, event: _Processed) -> None:
        """The event manager's hook: one event finished (its `ProcessedEvent`)."""
        self.event_queue.record_ns(int(event.queue_ms * 1e6))
        if event.name in BROKER_CHANGE_EVENTS:
            self.leader_election.record_ns(int(event.process_ms * 1e6))
