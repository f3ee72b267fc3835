"""Pausing Python's cyclic garbage collector while the controller (or a broker applying its
requests) works through thousands of partitions.

Why: a controller event for 10,000 partitions allocates a few hundred thousand objects (leader/ISR
states, state-change entries, request entities) that outlive the young generations, so the
collector runs hundreds of times during the event and, every time the survivors grow by a quarter,
a full collection that walks every object of the broker: its logs, partitions, metadata cache and
the controller's context. Measured in-process on the fake ZooKeeper (the controller's BrokerChange
for a broker leading 10,000 partitions): about a fifth of the event's CPU time.

Nothing is lost by pausing: reference counting still frees every object that is not in a cycle at
once, and the collector, enabled again when the work is done, finds the cycles created meanwhile at
its next run. The pause nests (a counter): the controller's event and a LeaderAndIsr being applied
on the same event loop may overlap across awaits, and the collector comes back only when the last
of them is done, and only if it was enabled before the first.

The pause is bounded (`MAX_PAUSE_S`): an event can wait a long time across awaits (ZooKeeper
retries while a quorum is lost, a slow broker), and meanwhile the broker goes on serving clients,
whose cyclic garbage (exceptions with their tracebacks, futures) would pile up unseen. A timer on
the event loop enables the collector again once the pause has lasted that long; the bodies still
running then carry on with it enabled.

Freezing what survived (`freeze_after_pauses`, only in a process that is a broker and nothing
else). What a paused body built (partition states, metadata, the controller's context) lives on,
and every full collection walks it again: with 10,000 partitions on RF 3, a broker holds about two
million tracked objects and a full collection took 0.24-0.37 s, found nothing to collect, and fell
in the middle of a controlled shutdown's or a failover's requests. So when the last pause ends,
`gc.freeze` moves every object alive into the collector's permanent generation (constant time),
and later collections only walk what was allocated since. What that leaves uncollected are
reference cycles among the frozen objects that die later; a broker makes few (the full collections
above freed 0-4 objects each), and at most every `UNFREEZE_INTERVAL_S` the frozen objects are
handed back to the collector (`gc.unfreeze`) for its next full collection to sweep once.

Only a pause whose body left many new objects (`FREEZE_MIN_OBJECTS` or more tracked objects) is
followed by a freeze. A freeze also takes whatever cyclic garbage the collector has not swept yet
(the tracebacks of refused requests, say) out of its reach for up to `UNFREEZE_INTERVAL_S`: after
every small pause -- an UpdateMetadata for one topic, a controller event that writes one ISR --
that was a steady leak under request traffic (the protocol fuzzer's broker grew by 171 MB in
200,000 frames, most of it garbage frozen alive), for a gain of nothing, since what a small body
builds costs a full collection next to nothing to walk.

Concurrency: event-loop thread only (the counter is not locked).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager

# Longer than a 100K-partition failover's work on this machine, far shorter than the time cyclic
# garbage of a serving broker takes to matter.
MAX_PAUSE_S = 10.0

UNFREEZE_INTERVAL_S = 600.0

FREEZE_MIN_OBJECTS = 50_000
"""The fewest new tracked objects a pause's body must leave for a freeze to follow it (a full
collection walks 50,000 objects in a few milliseconds; a 10,000-partition event leaves millions)."""

_depth = 0
_count_at_start = 0
_was_enabled = False
_limit: asyncio.TimerHandle | None = None
_freeze = False
_last_unfreeze = 0.0


def freeze_after_pauses(enabled: bool = True) -> None:
    """Freeze the objects alive whenever the last pause ends (see the module docstring); for a
    process that runs one broker and nothing else."""
    global _freeze, _last_unfreeze
    _freeze = enabled
    _last_unfreeze = time.monotonic()


def _freeze_survivors(grown: int) -> None:
    """At the end of the outermost pause, whose body left `grown` new tracked objects."""
    global _last_unfreeze
    now = time.monotonic()
    if now - _last_unfreeze >= UNFREEZE_INTERVAL_S:
        gc.unfreeze()  # the next full collection sweeps everything once
        _last_unfreeze = now
    elif grown >= FREEZE_MIN_OBJECTS:
        gc.freeze()


def _pause_limit_reached() -> None:
    global _limit
    _limit = None
    if _depth > 0 and _was_enabled:
        gc.enable()


@contextmanager
def paused_gc() -> Iterator[None]:
    """Run the body with the cyclic garbage collector disabled (nesting allowed)."""
    global _depth, _was_enabled, _limit, _count_at_start
    if _depth == 0:
        # With the collector off, the youngest generation's count is the tracked objects made
        # minus those freed since its last collection.
        _count_at_start = gc.get_count()[0]
        _was_enabled = gc.isenabled()
        gc.disable()
        try:
            _limit = asyncio.get_running_loop().call_later(MAX_PAUSE_S, _pause_limit_reached)
        except RuntimeError:  # no event loop in this thread: nothing can outlast the body
            _limit = None
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            if _limit is not None:
                _limit.cancel()
                _limit = None
            if _freeze:
                _freeze_survivors(gc.get_count()[0] - _count_at_start)
            if _was_enabled:
                gc.enable()


def pause_depth() -> int:
    """How many `paused_gc` bodies are running (for tests)."""
    return _depth
