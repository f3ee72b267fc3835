"""A fetcher's side of an incremental fetch session (KIP-227; Kafka's `FetchSessionHandler`).

The follower's replica fetcher asks the same leader for the same partitions every few hundred
milliseconds. With a session, only the first request is full; each later one names just the
partitions whose fetch parameters changed since the previous request (a new fetch offset after an
append, a new leader epoch, ...) or that joined, and lists those to forget; the leader answers
only partitions with something new. An idle follower of 10,000 partitions then sends and receives
a few bytes per fetch instead of every partition twice.

State per handler (one per fetcher, so one per leader connection):
- `session_id`, `epoch`: the request metadata to send next. (0, 0) asks for a new session in a
  full request; (S, 0) closes S and asks for a new one; (S, n > 0) is incremental.
- `sent`: each partition's parameters as the leader's session holds them.

`build` gives the next request's partitions (and the ones to forget); `handle_response` moves the
state on (any top-level error, and a lost response, start over with a full request that closes
the old session: after a lost response we cannot know which epoch the leader expects).

Sans-I/O; used only from its fetcher's task.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import NamedTuple

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0

PartitionKey = tuple[Hashable, int]


def _next_epoch(epoch: int) -> int:
    return 1 if epoch == 0x7FFFFFFF else epoch + 1


class PartitionParams(NamedTuple):
    """A named tuple: built for every partition of every fetch, and compared with what was sent
    (a tuple compares in C)."""

    fetch_offset: int
    log_start_offset: int
    max_bytes: int
    current_leader_epoch: int
    last_fetched_epoch: int


@dataclass(frozen=True, slots=True)
class FetchRequestData:
    session_id: int
    epoch: int
    to_send: dict[PartitionKey, PartitionParams]
    to_forget: list[PartitionKey]

    @property
    def full(self) -> bool:
        return self.epoch == INITIAL_EPOCH


class FetchSessionHandler:
    def __init__(self) -> None:
        self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self.sent: dict[PartitionKey, PartitionParams] = {}
        self._pending: dict[PartitionKey, PartitionParams] | None = None

    def build(self, wanted: dict[PartitionKey, PartitionParams]) -> FetchRequestData:
        """The next request for the partitions `wanted` now (every partition the fetcher would
        name in a full request)."""
        self._pending = dict(wanted)
        if self.epoch == INITIAL_EPOCH:
            return FetchRequestData(self.session_id, INITIAL_EPOCH, dict(wanted), [])
        sent = self.sent
        to_send = {key: p for key, p in wanted.items() if sent.get(key) != p}
        to_forget = [key for key in sent if key not in wanted]
        return FetchRequestData(self.session_id, self.epoch, to_send, to_forget)

    def handle_response(self, error: bool, session_id: int) -> None:
        """After a response arrived: `error` for a top-level error (session or otherwise)."""
        pending, self._pending = self._pending, None
        if error or pending is None:
            self.reset()
            return
        if self.epoch == INITIAL_EPOCH:
            # A full request: a session id opens a session, 0 means the leader has no slot (or
            # no sessions); the next request is full again and asks for one again.
            self.session_id = session_id
            self.epoch = _next_epoch(INITIAL_EPOCH) if session_id != INVALID_SESSION_ID else 0
        else:
            self.epoch = _next_epoch(self.epoch)
        self.sent = pending

    def reset(self) -> None:
        """Start over: the next request is full and closes the current session, if any."""
        self.epoch = INITIAL_EPOCH
        self.sent = {}
        self._pending = None
