"""The controller's two state machines as data: states, valid previous states, the state-change log.

The controller keeps one `ReplicaState` per (topic, partition, replica) and one `PartitionState` per
(topic, partition). A transition is valid only from one of the target state's valid previous states;
the controller splits each batch with `split_valid_transitions`, logs every refused item to the
state-change log and applies the rest. Nothing here does I/O except the log handler.

Replica state machine (seven states). Transitions and what the controller does for each:

* NonExistentReplica -> NewReplica: tell the new replica's broker the partition's current leader and
  ISR (LeaderAndIsr, "is new") and every live broker the partition's metadata (UpdateMetadata). A
  replica that the current leader state names as leader cannot become NewReplica: a new replica has no
  data and may only follow.
* NewReplica -> OnlineReplica: append the replica to the partition's assigned replicas in the
  controller's cache if it is not already there.
* OnlineReplica, OfflineReplica, ReplicaDeletionIneligible -> OnlineReplica: if the partition has ever
  had a leader, send the replica's broker LeaderAndIsr with the current leader and ISR and every live
  broker UpdateMetadata; otherwise only record the state (the partition was never online, so the broker
  has no log or high watermark for it yet).
* NewReplica, OnlineReplica, OfflineReplica, ReplicaDeletionIneligible -> OfflineReplica: send the
  replica's broker StopReplica without deleting its log; remove the replica from the ISR in ZooKeeper
  (if it led, the partition is left with no leader; the ISR never becomes empty); send the shrunk
  leader and ISR to the partition's other replicas (unless the topic is being deleted) and
  UpdateMetadata to every live broker.
* OfflineReplica -> ReplicaDeletionStarted: send StopReplica with deletion to the replica's broker.
* ReplicaDeletionStarted -> ReplicaDeletionSuccessful: the broker answered StopReplica without error;
  only the state is recorded.
* ReplicaDeletionStarted, OfflineReplica -> ReplicaDeletionIneligible: deletion failed, or the replica's
  broker is down so deletion cannot start; only the state is recorded. Topic deletion retries these
  replicas when their broker returns (they go back through OnlineReplica and OfflineReplica).
* ReplicaDeletionSuccessful -> NonExistentReplica: drop the replica from the cached assigned replicas
  and forget its state.

Partition state machine (four states):

* NonExistentPartition -> NewPartition: load the partition's assigned replicas from ZooKeeper into the
  controller's cache.
* NewPartition -> OnlinePartition: leader = the first live assigned replica, ISR = all live assigned
  replicas; create the partition state znode with them; send LeaderAndIsr to every live replica and
  UpdateMetadata to every live broker.
* OnlinePartition, OfflinePartition -> OnlinePartition: elect a leader and ISR with the algorithm the
  caller names (offline, reassignment, preferred replica, controlled shutdown; see `election_algorithms`); write
  them to the partition state znode, conditional on its version; send LeaderAndIsr to the replicas that
  must hear it and UpdateMetadata to every live broker.
* NewPartition, OnlinePartition, OfflinePartition -> OfflinePartition: only the state is recorded (the
  leader's broker is gone or the topic is being deleted).
* OfflinePartition -> NonExistentPartition: only the state is recorded (the topic has been deleted).

The valid previous states are exactly Kafka 2.8's (`ReplicaStateMachine.scala`,
`PartitionStateMachine.scala`), including the self-transitions OnlineReplica -> OnlineReplica,
OfflineReplica -> OfflineReplica, OnlinePartition -> OnlinePartition and OfflinePartition ->
OfflinePartition, which the controller uses to re-send state or re-elect without special cases.

State-change log: one line per applied transition and one per refused transition, written through the
Python logger named `state.change` (`StateChangeLogger`), which `attach_state_change_log_file` routes
to `<directory>/state-change.log` as Kafka's log4j configuration does.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

from odradek.controller.state_change_history import StateChangeHistory

STATE_CHANGE_LOGGER_NAME = "state.change"
STATE_CHANGE_LOG_FILE_NAME = "state-change.log"


class ReplicaState(enum.Enum):
    """The state of one replica of one partition, as the controller sees it.

    Values are Kafka's state bytes. Member names are Kafka's, so that log lines read as Kafka's do.
    """

    NewReplica = 1
    OnlineReplica = 2
    OfflineReplica = 3
    ReplicaDeletionStarted = 4
    ReplicaDeletionSuccessful = 5
    ReplicaDeletionIneligible = 6
    NonExistentReplica = 7

    @property
    def valid_previous_states(self) -> frozenset[ReplicaState]:
        """The states from which a replica may move to this one."""
        return _VALID_PREVIOUS_REPLICA_STATES[self]

    def __str__(self) -> str:
        return self._name_  # not `name`, a descriptor: the state-change log asks 100,000s of times


class PartitionState(enum.Enum):
    """The state of one partition, as the controller sees it. Values are Kafka's state bytes."""

    NewPartition = 0
    OnlinePartition = 1
    OfflinePartition = 2
    NonExistentPartition = 3

    @property
    def valid_previous_states(self) -> frozenset[PartitionState]:
        """The states from which a partition may move to this one."""
        return _VALID_PREVIOUS_PARTITION_STATES[self]

    def __str__(self) -> str:
        return self._name_  # not `name`, a descriptor: the state-change log asks 100,000s of times


_R = ReplicaState
_VALID_PREVIOUS_REPLICA_STATES: dict[ReplicaState, frozenset[ReplicaState]] = {
    _R.NewReplica: frozenset({_R.NonExistentReplica}),
    _R.OnlineReplica: frozenset(
        {_R.NewReplica, _R.OnlineReplica, _R.OfflineReplica, _R.ReplicaDeletionIneligible}
    ),
    _R.OfflineReplica: frozenset(
        {_R.NewReplica, _R.OnlineReplica, _R.OfflineReplica, _R.ReplicaDeletionIneligible}
    ),
    _R.ReplicaDeletionStarted: frozenset({_R.OfflineReplica}),
    _R.ReplicaDeletionSuccessful: frozenset({_R.ReplicaDeletionStarted}),
    _R.ReplicaDeletionIneligible: frozenset({_R.OfflineReplica, _R.ReplicaDeletionStarted}),
    _R.NonExistentReplica: frozenset({_R.ReplicaDeletionSuccessful}),
}

_P = PartitionState
_VALID_PREVIOUS_PARTITION_STATES: dict[PartitionState, frozenset[PartitionState]] = {
    _P.NewPartition: frozenset({_P.NonExistentPartition}),
    _P.OnlinePartition: frozenset({_P.NewPartition, _P.OnlinePartition, _P.OfflinePartition}),
    _P.OfflinePartition: frozenset({_P.NewPartition, _P.OnlinePartition, _P.OfflinePartition}),
    _P.NonExistentPartition: frozenset({_P.OfflinePartition}),
}

State = TypeVar("State", ReplicaState, PartitionState)
K = TypeVar("K")


def is_valid_transition(current: State, target: State) -> bool:
    """Whether the table allows moving from `current` to `target`."""
    return current in target.valid_previous_states


def split_valid_transitions(
    items: Iterable[K], current_state: Callable[[K], State], target: State
) -> tuple[list[K], list[K]]:
    """Split `items` into (valid, invalid) for a move to `target`, each in input order.

    `current_state` looks an item's state up in the controller's cache; items the cache has never seen
    should be reported there as NonExistentReplica / NonExistentPartition, as Kafka does.
    """
    valid: list[K] = []
    invalid: list[K] = []
    allowed = target.valid_previous_states
    for item in items:
        (valid if current_state(item) in allowed else invalid).append(item)
    return valid, invalid


# --- the state-change log -------------------------------------------------------------------------


def format_partition(topic: str, partition: int) -> str:
    """A partition as Kafka's logs write it: `topic-partition`."""
    return f"{topic}-{partition}"


def format_replica(topic: str, partition: int, replica: int) -> str:
    """A replica as Kafka's logs write it: `[Topic=t,Partition=p,Replica=r]`."""
    return f"[Topic={topic},Partition={partition},Replica={replica}]"


def format_transition(
    controller_id: int,
    controller_epoch: int,
    subject: str,
    from_state: ReplicaState | PartitionState,
    to_state: ReplicaState | PartitionState,
    *,
    leader: int | None = None,
    isr: Sequence[int] | None = None,
    leader_epoch: int | None = None,
) -> str:
    """One state-change log line for an applied transition.

    `[Controller id=1 epoch=7] Changed state of t-0 from NewPartition to OnlinePartition with leader=1,
    leader_epoch=0, isr=[1, 2]`. The leader/ISR part appears only when given (partition transitions
    that elected or re-sent a leader).
    """
    line = (
        f"[Controller id={controller_id} epoch={controller_epoch}] "
        f"Changed state of {subject} from {from_state!s} to {to_state!s}"
    )
    details: list[str] = []
    if leader is not None:
        details.append(f"leader={leader}")
    if leader_epoch is not None:
        details.append(f"leader_epoch={leader_epoch}")
    if isr is not None:
        details.append(f"isr={list(isr)}")
    if details:
        line += " with " + ", ".join(details)
    return line


def format_invalid_transition(
    controller_id: int,
    controller_epoch: int,
    subject: str,
    from_state: ReplicaState | PartitionState,
    to_state: ReplicaState | PartitionState,
) -> str:
    """One state-change log line for a refused transition, naming the states that would be allowed."""
    allowed = ",".join(sorted(str(state) for state in to_state.valid_previous_states))
    return (
        f"[Controller id={controller_id} epoch={controller_epoch}] "
        f"Refused state change of {subject} from {from_state} to {to_state}: "
        f"valid previous states of {to_state} are {allowed}"
    )


class StateChangeLogger:
    """Writes the controller's state-change log through the `state.change` Python logger.

    Applied partition transitions are logged at INFO, replica transitions at DEBUG, refused ones at
    ERROR, as Kafka logs them (INFO, TRACE, ERROR: a refusal means the controller's cache and its
    callbacks disagree). Like Kafka's `state.change.logger`, the broker's state-change log is at
    INFO, so replica transitions are not written unless the logger is set to DEBUG: a failover
    moves every replica of every partition (300,000 lines for 100,000 partitions of RF 3). Applied
    transitions are also kept, whatever the log level, in `history` (recent entries per partition,
    in memory, which the broker serves to consoles as `/state-changes`). Lines are written a batch
    at a time (`flush`). Called only from the controller's event task (the history is loop-thread
    only)."""

    def __init__(
        self,
        controller_id: int,
        logger: logging.Logger | None = None,
        history: StateChangeHistory | None = None,
    ) -> None:
        self.controller_id = controller_id
        self.logger = logger if logger is not None else logging.getLogger(STATE_CHANGE_LOGGER_NAME)
        self.history = history if history is not None else StateChangeHistory()
        # Applied transitions not written yet: (time, level, line). The state machines flush at
        # the end of every batch of transitions (`flush`), so a batch's lines go out together.
        self._pending: list[tuple[float, int, str]] = []

    def partition_transition(
        self,
        controller_epoch: int,
        topic: str,
        partition: int,
        from_state: PartitionState,
        to_state: PartitionState,
        *,
        leader: int | None = None,
        isr: Sequence[int] | None = None,
        leader_epoch: int | None = None,
    ) -> None:
        """Log an applied partition transition, with the leader and ISR it produced if any."""
        self.history.record(
            self.controller_id,
            controller_epoch,
            topic,
            partition,
            None,
            from_state,
            to_state,
            leader=leader,
            leader_epoch=leader_epoch,
            isr=isr,
        )
        if self.logger.isEnabledFor(logging.INFO):
            self._defer(
                logging.INFO,
                format_transition(
                    self.controller_id,
                    controller_epoch,
                    format_partition(topic, partition),
                    from_state,
                    to_state,
                    leader=leader,
                    isr=isr,
                    leader_epoch=leader_epoch,
                ),
            )

    def replica_transition(
        self,
        controller_epoch: int,
        topic: str,
        partition: int,
        replica: int,
        from_state: ReplicaState,
        to_state: ReplicaState,
    ) -> None:
        """Log an applied replica transition (DEBUG)."""
        self.history.record(
            self.controller_id, controller_epoch, topic, partition, replica, from_state, to_state
        )
        if self.logger.isEnabledFor(logging.DEBUG):
            self._defer(
                logging.DEBUG,
                format_transition(
                    self.controller_id,
                    controller_epoch,
                    format_replica(topic, partition, replica),
                    from_state,
                    to_state,
                ),
            )

    def _defer(self, level: int, message: str) -> None:
        """`logger.log(level, message)`, deferred to the next `flush`: a failover writes a line
        per partition, and one logging record per line cost ~11 µs (the record, its formatting
        with a timestamp, a write and a flush each). Each line keeps the time it was logged at."""
        self._pending.append((time.time(), level, message))
        if len(self._pending) >= _FLUSH_LINES:
            self.flush()

    def flush(self) -> None:
        """Write the pending lines: in one write to each handler when the logger writes only to
        state-change log files (`StateChangeLogHandler`, as the broker sets it up), else as one
        record each (named after this module) through the logger's handlers as usual."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        logger = self.logger
        handlers = logger.handlers
        if (
            not logger.propagate
            and handlers
            and not logger.filters
            and all(type(h) is StateChangeLogHandler and h.level <= logging.DEBUG for h in handlers)
        ):
            for handler in handlers:
                handler.write_lines(pending)  # type: ignore[attr-defined]
            return
        for created, level, message in pending:
            record = logger.makeRecord(logger.name, level, __file__, 0, message, (), None)
            record.created = created
            record.msecs = int((created - int(created)) * 1000) + 0.0
            logger.handle(record)

    def invalid_transition(
        self,
        controller_epoch: int,
        subject: str,
        from_state: ReplicaState | PartitionState,
        to_state: ReplicaState | PartitionState,
    ) -> None:
        """Log a refused transition; `subject` is `format_partition(...)` or `format_replica(...)`."""
        self.flush()  # after the applied transitions logged before it
        self.logger.error(
            format_invalid_transition(
                self.controller_id, controller_epoch, subject, from_state, to_state
            )
        )


_FLUSH_LINES = 2000
_FORMAT = "[%(asctime)s] %(levelname)s %(message)s"


class StateChangeLogHandler(logging.FileHandler):
    """The state-change log file. Besides records, it takes a batch of lines at once
    (`write_lines`), written as its formatter would write each as a record, in one write."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, encoding="utf-8")
        self.setFormatter(logging.Formatter(_FORMAT))

    def write_lines(self, lines: Sequence[tuple[float, int, str]]) -> None:
        """Write `(time, level, message)` lines as records logged at those times."""
        formatter = self.formatter or logging.Formatter(_FORMAT)
        converter = formatter.converter
        second: int | None = None
        stamp = ""
        out = []
        for created, level, message in lines:
            whole = int(created)
            if whole != second:
                second = whole
                stamp = time.strftime(formatter.default_time_format, converter(created))
            msecs = int((created - whole) * 1000)
            out.append(f"[{stamp},{msecs:03d}] {logging.getLevelName(level)} {message}\n")
        text = "".join(out)
        with self.lock:  # type: ignore[union-attr]
            if self.stream is None:
                self.stream = self._open()
            try:
                self.stream.write(text)
                self.stream.flush()
            except Exception:  # as a record's emit does: report, never raise into the controller
                self.handleError(logging.makeLogRecord({"msg": text[:200]}))


def attach_state_change_log_file(
    directory: Path | str, *, propagate: bool = False
) -> logging.Handler:
    """Send the `state.change` logger's records to `<directory>/state-change.log`; return the handler.

    With `propagate=False` (the default, as Kafka's log4j configuration sets additivity off) state
    changes stay out of the broker's main log: a failover of thousands of partitions would drown it.
    The caller removes the handler (and closes it) on shutdown.
    """
    path = Path(directory) / STATE_CHANGE_LOG_FILE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = StateChangeLogHandler(path)
    logger = logging.getLogger(STATE_CHANGE_LOGGER_NAME)
    logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    logger.propagate = propagate
    return handler
