"""Refusing forged controller requests (issue 14, item 5): the checks a broker makes, independently
of authentication, before LeaderAndIsr, StopReplica, UpdateMetadata, ControlledShutdown or a
follower Fetch changes anything.

The threat: any process that reaches a broker's port can send these requests. Kafka accepts a
controller epoch larger than any it has seen, so one hand-made StopReplica with epoch 10**9 makes a
broker delete partitions and then refuse the real controller (whose epoch is now "stale") forever.
Odradek instead believes ZooKeeper, which only the controller election writes:

Controller requests (LeaderAndIsr, StopReplica, UpdateMetadata), `ControllerEpochValidator`:

1. Controller epoch and id. The validator remembers the last (controller id, epoch) it verified.
   * epoch below it → STALE_CONTROLLER_EPOCH (a deposed controller still sending);
   * epoch equal to it → accepted only if the controller id is the verified one
     (STALE_CONTROLLER_EPOCH otherwise: Kafka does not check the id, we do);
   * epoch above it (or nothing verified yet) → read `/controller_epoch` and `/controller` from
     ZooKeeper (the injected reader must `sync` first, so a lagging ZooKeeper server cannot make a
     legitimate new controller look forged). Accepted if ZooKeeper says exactly this epoch and this
     controller id; then it becomes the verified pair. If ZooKeeper's epoch is lower the request
     comes from the future: forged, STALE_CONTROLLER_EPOCH, and the verified pair is unchanged. If
     ZooKeeper's epoch is higher, or `/controller` is absent or names another broker,
     STALE_CONTROLLER_EPOCH (the view is remembered when it is newer). Concurrent reads are
     coalesced into one.
2. Broker epoch (KIP-380): the request names the incarnation of this broker it is meant for (the
   czxid of its `/brokers/ids/<id>`).
   * equal to this broker's epoch → accepted;
   * -1 (a pre-KIP-380 controller; Kafka accepts it) or lower → STALE_BROKER_EPOCH;
   * higher → this broker may have re-registered after a session expiry before it learned its new
     epoch (Kafka accepts any higher epoch for that reason); we re-read our registration's czxid
     from ZooKeeper and accept only if it is exactly the request's.
   The controller check comes first, so a forged request costs at most the ZooKeeper reads.

ControlledShutdown, on the controller (`validate_controlled_shutdown`): the broker id must be live
and the broker epoch must equal its registration's czxid exactly (the current code accepts -1 and
any epoch not below it). Only that incarnation of the broker knows it.

Follower fetches (`validate_follower_fetch`, KIP-903 as far as ZooKeeper mode allows): a Fetch
with `replica_id >= 0` is served to a replica in the partition's assignment; its fetch updates
follower state (LEO, ISR expansion, HW) only if the replica's broker epoch (Fetch v15+ `ReplicaState`)
equals that broker's live registration, and (`may_update_follower_state`) only after the read at
its fetch offset succeeded: the offset lies in [log start offset, leader LEO] and the leader found no
diverging epoch. Today any client can keep a dead follower in the ISR by fetching in its name, so
acks=all records would be acknowledged with one real copy.

What this does not do: without authentication, a client that learns the current epochs (they are
ZooKeeper zxids and counters, not secrets) can still pass these checks. Real protection is the
ClusterAction check on an authenticated inter-broker listener (`odradek.security.api_acls`); these
checks make that defence in depth and make stale or invented epochs harmless everywhere.

How the handlers will call it (the wiring phase; nothing in `server/` calls this yet):

* `handlers_interbroker`: after `_after_registration` and the ClusterAction authorization,
  `verdict = validator.check_cached(request.controller_id, request.controller_epoch,
  request.broker_epoch)`; if it is None (a ZooKeeper read is needed), return a coroutine that does
  `verdict = await validator.validate(...)`. If `verdict.error` is set, answer the whole request
  with that code (every partition error too for LeaderAndIsr) and change nothing; otherwise proceed
  and set `broker.latest_controller_epoch` to the request's epoch. `_controller_epoch_stale` and
  `_broker_epoch_stale` go away.
* The broker feeds `validator.observe(ControllerView(...))` from its existing `/controller` watch
  and from its own election (the controller broker knows its id and epoch), so most requests take
  the cached path.
* `handle_controlled_shutdown`: the controller calls `validate_controlled_shutdown` with its
  context's live brokers and epochs, in `_process_controlled_shutdown`, replacing its `<` check.
* `handle_fetch` / `ReplicaManager._read_all`: for `replica_id >= 0`, call
  `validate_follower_fetch` per partition (assignment from the partition, epochs from a small
  `/brokers/ids` watcher on every broker); refuse with its error or serve without updating state;
  move `partition.update_follower_fetch_state` after `read_records` and guard it with
  `may_update_follower_state`. The replica fetcher must send Fetch v15+ with `ReplicaState`
  (replica id and its own broker epoch) and the broker must advertise Fetch 15.

Concurrency: one asyncio event loop; `validate` may await a ZooKeeper read, the rest is pure.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

log = logging.getLogger(__name__)

NO_CONTROLLER = -1
UNKNOWN_BROKER_EPOCH = -1


@dataclass(frozen=True, slots=True)
class ControllerView:
    """What ZooKeeper says: `/controller`'s broker id (-1 when absent) and `/controller_epoch`."""

    controller_id: int
    controller_epoch: int


@dataclass(frozen=True, slots=True)
class Verdict:
    """None error: accepted. Otherwise the code to answer with, and why (for the log)."""

    error: ErrorCode | None
    reason: str = ""

    @property
    def accepted(self) -> bool:
        return self.error is None


ACCEPTED = Verdict(None)


class Check(enum.Enum):
    ACCEPT = "accept"
    REFUSE = "refuse"
    READ_ZOOKEEPER = "read zookeeper"


# -- pure decisions --------------------------------------------------------------------------


def check_controller(
    controller_id: int, controller_epoch: int, verified: ControllerView | None
) -> tuple[Check, str]:
    """Rule 1 against the verified pair, without ZooKeeper."""
    if verified is None or controller_epoch > verified.controller_epoch:
        return Check.READ_ZOOKEEPER, "newer controller epoch"
    if controller_epoch < verified.controller_epoch:
        return Check.REFUSE, (
            f"controller epoch {controller_epoch} is older than {verified.controller_epoch}"
        )
    if controller_id != verified.controller_id:
        return Check.REFUSE, (
            f"controller {controller_id} is not the controller of epoch {controller_epoch} "
            f"({verified.controller_id})"
        )
    return Check.ACCEPT, ""


def check_controller_against_zookeeper(
    controller_id: int, controller_epoch: int, zookeeper: ControllerView
) -> tuple[bool, str]:
    """Rule 1 once ZooKeeper has been read: accepted only if it says exactly this pair."""
    if zookeeper.controller_epoch < controller_epoch:
        return False, (
            f"controller epoch {controller_epoch} is ahead of ZooKeeper's "
            f"{zookeeper.controller_epoch}: forged"
        )
    if zookeeper.controller_epoch > controller_epoch:
        return False, (
            f"controller epoch {controller_epoch} is older than ZooKeeper's "
            f"{zookeeper.controller_epoch}"
        )
    if zookeeper.controller_id != controller_id:
        return False, (
            f"ZooKeeper names controller {zookeeper.controller_id} for epoch "
            f"{controller_epoch}, not {controller_id}"
        )
    return True, ""


def check_broker_epoch(request_epoch: int, own_epoch: int) -> tuple[Check, str]:
    """Rule 2 without ZooKeeper."""
    if own_epoch >= 0 and request_epoch == own_epoch:
        return Check.ACCEPT, ""
    if request_epoch == UNKNOWN_BROKER_EPOCH or request_epoch < own_epoch:
        return Check.REFUSE, f"broker epoch {request_epoch} is not this broker's {own_epoch}"
    return Check.READ_ZOOKEEPER, "newer broker epoch"


def validate_controlled_shutdown(
    broker_id: int, broker_epoch: int, live_broker_epochs: Mapping[int, int]
) -> Verdict:
    """ControlledShutdown on the controller: the broker must be live and name its current epoch."""
    current = live_broker_epochs.get(broker_id)
    if current is None:
        return Verdict(ErrorCode.broker_not_available, f"broker {broker_id} is not live")
    if broker_epoch != current:
        return Verdict(
            ErrorCode.stale_broker_epoch,
            f"broker epoch {broker_epoch} of broker {broker_id} is not its current {current}",
        )
    return ACCEPTED


@dataclass(frozen=True, slots=True)
class FollowerFetchVerdict:
    """`error` set: answer the partition with it and read nothing. Otherwise serve the read, and
    update follower state only if `update_state`."""

    error: ErrorCode | None
    update_state: bool
    reason: str = ""


def validate_follower_fetch(
    replica_id: int,
    replica_epoch: int,
    assignment: Collection[int],
    live_broker_epochs: Mapping[int, int],
    *,
    has_current_leader_epoch: bool,
    require_replica_epoch: bool = True,
) -> FollowerFetchVerdict:
    """A Fetch naming `replica_id` for one partition this broker leads.

    `replica_epoch` is Fetch v15+'s `ReplicaState.ReplicaEpoch` (-1 when absent or older
    versions). Not a replica of the partition: NOT_LEADER_OR_FOLLOWER, or UNKNOWN_LEADER_EPOCH when
    the request carried a current leader epoch (Kafka's answers, so a follower added by a
    reassignment retries). A missing epoch (when required) or one that is not the broker's live
    registration: STALE_BROKER_EPOCH. A broker that is not live is served but never updates state."""
    if replica_id not in assignment:
        code = (
            ErrorCode.unknown_leader_epoch
            if has_current_leader_epoch
            else ErrorCode.not_leader_or_follower
        )
        return FollowerFetchVerdict(code, False, f"replica {replica_id} is not assigned")
    live_epoch = live_broker_epochs.get(replica_id)
    if replica_epoch == UNKNOWN_BROKER_EPOCH:
        if require_replica_epoch:
            return FollowerFetchVerdict(
                ErrorCode.stale_broker_epoch, False, f"fetch of replica {replica_id} has no epoch"
            )
        return FollowerFetchVerdict(None, live_epoch is not None, "no replica epoch")
    if live_epoch is None:
        return FollowerFetchVerdict(None, False, f"replica {replica_id} is not a live broker")
    if replica_epoch != live_epoch:
        return FollowerFetchVerdict(
            ErrorCode.stale_broker_epoch,
            False,
            f"replica {replica_id} epoch {replica_epoch} is not its live epoch {live_epoch}",
        )
    return FollowerFetchVerdict(None, True)


def may_update_follower_state(
    fetch_offset: int, log_start_offset: int, leader_log_end_offset: int, diverging_epoch: bool
) -> bool:
    """A follower's fetch offset is its LEO only if the leader could read there: within
    [log start offset, leader LEO] and with no diverging epoch to truncate first."""
    return not diverging_epoch and log_start_offset <= fetch_offset <= leader_log_end_offset


# -- the validator -------------------------------------------------------------------------------


class ControllerEpochValidator:
    """One per broker; see the module docstring for the rules and how handlers call it.

    `read_controller` returns ZooKeeper's `ControllerView` after a `sync`; `read_own_broker_epoch`
    returns the czxid of this broker's `/brokers/ids/<id>` (-1 if absent); `own_broker_epoch` is
    what the broker currently believes (its registration's czxid, -1 before registering).
    """

    def __init__(
        self,
        read_controller: Callable[[], Awaitable[ControllerView]],
        read_own_broker_epoch: Callable[[], Awaitable[int]],
        own_broker_epoch: Callable[[], int],
    ) -> None:
        self._read_controller = read_controller
        self._read_own_broker_epoch = read_own_broker_epoch
        self._own_broker_epoch = own_broker_epoch
        self.verified: ControllerView | None = None
        self._controller_read: asyncio.Future[ControllerView] | None = None
        self.zookeeper_reads = 0

    def observe(self, view: ControllerView) -> None:
        """A view this broker trusts (its `/controller` watch, its own election): remembered if
        newer and complete."""
        if view.controller_id == NO_CONTROLLER:
            return
        if self.verified is None or view.controller_epoch > self.verified.controller_epoch:
            self.verified = view

    def check_cached(
        self, controller_id: int, controller_epoch: int, broker_epoch: int
    ) -> Verdict | None:
        """The verdict without ZooKeeper, or None if a read is needed."""
        controller, reason = check_controller(controller_id, controller_epoch, self.verified)
        if controller is Check.REFUSE:
            return self._refuse(ErrorCode.stale_controller_epoch, reason)
        broker, broker_reason = check_broker_epoch(broker_epoch, self._own_broker_epoch())
        if controller is Check.READ_ZOOKEEPER:
            return None
        if broker is Check.REFUSE:
            return self._refuse(ErrorCode.stale_broker_epoch, broker_reason)
        if broker is Check.READ_ZOOKEEPER:
            return None
        return ACCEPTED

    async def validate(
        self, controller_id: int, controller_epoch: int, broker_epoch: int
    ) -> Verdict:
        cached = self.check_cached(controller_id, controller_epoch, broker_epoch)
        if cached is not None:
            return cached
        controller, _ = check_controller(controller_id, controller_epoch, self.verified)
        if controller is Check.READ_ZOOKEEPER:
            zookeeper = await self._controller_from_zookeeper()
            if zookeeper.controller_id != NO_CONTROLLER and (
                self.verified is None or zookeeper.controller_epoch > self.verified.controller_epoch
            ):
                self.verified = zookeeper
            ok, reason = check_controller_against_zookeeper(
                controller_id, controller_epoch, zookeeper
            )
            if not ok:
                return self._refuse(ErrorCode.stale_controller_epoch, reason)
        broker, reason = check_broker_epoch(broker_epoch, self._own_broker_epoch())
        if broker is Check.REFUSE:
            return self._refuse(ErrorCode.stale_broker_epoch, reason)
        if broker is Check.READ_ZOOKEEPER:
            self.zookeeper_reads += 1
            registered = await self._read_own_broker_epoch()
            if registered != broker_epoch:
                return self._refuse(
                    ErrorCode.stale_broker_epoch,
                    f"broker epoch {broker_epoch} is not this broker's registration ({registered})",
                )
        return ACCEPTED

    async def _controller_from_zookeeper(self) -> ControllerView:
        # One read in flight at a time: a burst of requests (or of forged ones) costs one read.
        if self._controller_read is None or self._controller_read.done():
            self.zookeeper_reads += 1
            self._controller_read = asyncio.ensure_future(self._read_controller())
        return await asyncio.shield(self._controller_read)

    @staticmethod
    def _refuse(error: ErrorCode, reason: str) -> Verdict:
        log.warning("refused a controller request: %s", reason)
        return Verdict(error, reason)
