"""Log directory events (KIP-112): `/log_dir_event_notification/log_dir_event_<seq>`.

A broker whose log directory failed leaves a notification for the controller, which then asks the
broker (LeaderAndIsr) which of its replicas are still online and marks the others offline. See the
package docstring for the conventions every class here follows.
"""

from __future__ import annotations

from dataclasses import dataclass

from odradek.zk.znodes._common import _dumps, _int, _loads, _sequence_number

LOG_DIR_FAILURE_EVENT = 1
"""The only event Kafka defines (LogDirEventNotificationHandler.LogDirFailureEvent)."""


@dataclass(frozen=True, slots=True)
class LogDirEventNotification:
    broker_id: int
    event: int
    zk_version: int


class LogDirEventNotificationZNode:
    """`/log_dir_event_notification`: parent of the brokers' log directory events."""

    @staticmethod
    def path() -> str:
        return "/log_dir_event_notification"


class LogDirEventNotificationSequenceZNode:
    """`/log_dir_event_notification/log_dir_event_<seq>`: a broker had a log directory fail.

    Created persistent-sequential; JSON `{"version":1,"broker":<id>,"event":1}` (Kafka's).
    """

    PREFIX = "log_dir_event_"

    @staticmethod
    def path(sequence_number: str = "") -> str:
        """The child's path; with no sequence number, the prefix to create a sequential node."""
        return (
            f"{LogDirEventNotificationZNode.path()}/"
            f"{LogDirEventNotificationSequenceZNode.PREFIX}{sequence_number}"
        )

    @staticmethod
    def sequence_number(child: str) -> str:
        return _sequence_number(child, LogDirEventNotificationSequenceZNode.PREFIX)

    @staticmethod
    def encode(broker_id: int, event: int = LOG_DIR_FAILURE_EVENT) -> bytes:
        return _dumps({"version": 1, "broker": broker_id, "event": event})

    @staticmethod
    def decode(data: bytes, stat_version: int) -> LogDirEventNotification:
        where = LogDirEventNotificationZNode.path()
        obj = _loads(data, where)
        return LogDirEventNotification(
            _int(obj, "broker", where), _int(obj, "event", where), stat_version
        )
