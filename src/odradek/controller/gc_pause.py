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

Concurrency: event-loop thread only (the counter is not locked).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from contextlib import contextmanager

# Longer than a 100K-partition failover's work on this machine, far shorter than the time cyclic
# garbage of a serving broker takes to matter.
MAX_PAUSE_S = 10.0

_depth = 0
_was_enabled = False
_limit: asyncio.TimerHandle | None = None


def _pause_limit_reached() -> None:
    global _limit
    _limit = None
    if _depth > 0 and _was_enabled:
        gc.enable()


@contextmanager
def paused_gc() -> Iterator[None]:
    """Run the body with the cyclic garbage collector disabled (nesting allowed)."""
    global _depth, _was_enabled, _limit
    if _depth == 0:
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
            if _was_enabled:
                gc.enable()


def pause_depth() -> int:
    """How many `paused_gc` bodies are running (for tests)."""
    return _depth
