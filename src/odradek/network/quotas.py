"""Resource limits of the socket server: how many connections, and how many request bytes in memory.

`ConnectionQuotas` (one per broker, shared by every listener), Kafka's properties:

| property | meaning |
|---|---|
| `max.connections` | connections of the whole broker; `listener.name.<l>.max.connections` limits one listener. As in Kafka (KIP-402) the inter-broker listener does not count against the broker-wide limit, so clients cannot lock brokers out of each other |
| `max.connections.per.ip` | connections from one address |
| `max.connections.per.ip.overrides` | `host:count,...` exceptions (a host name is resolved at start-up) |

A connection over a limit is closed as soon as it is accepted, before any TLS handshake, and the
refusal is logged (at most once a second per address).

`MemoryPool` (`queued.max.request.bytes`, -1 = no limit) bounds the request bytes held in memory:
a connection reserves a frame's whole size when it reads the frame's size prefix, and keeps the
reservation until the response to that request is written. When the pool is exhausted a connection
that wants to start a frame stops reading (the kernel's socket buffer, then the client's TCP window,
hold the rest) until memory is released; frames already started always finish. As Kafka's pool
does, a reservation succeeds whenever some memory is free, so one request larger than what is
left (or than the whole pool) cannot block forever. Memory held for partial frames is therefore
bounded by the pool however many connections send size prefixes and dribble their bytes; what a
muted connection has buffered is at most one socket read.

Concurrency: event loop thread only.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Callable

from odradek.errors import ConfigError

log = logging.getLogger(__name__)

UNLIMITED = 2147483647


def parse_overrides(text: str) -> dict[str, int]:
    """`max.connections.per.ip.overrides` → {IP address text: limit}."""
    overrides: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        host, sep, count = item.rpartition(":")
        host = host.strip().strip("[]")
        try:
            limit = int(count)
        except ValueError:
            limit = -1
        if not sep or not host or limit < 0:
            raise ConfigError(
                f"invalid max.connections.per.ip.overrides entry {item!r}: expected host:count"
            )
        try:
            addresses = [str(ipaddress.ip_address(host))]
        except ValueError:
            try:
                addresses = sorted({info[4][0] for info in socket.getaddrinfo(host, None)})
            except OSError as e:
                raise ConfigError(
                    f"cannot resolve {host!r} in max.connections.per.ip.overrides: {e}"
                ) from None
        for address in addresses:
            overrides[address] = limit
    return overrides


def _normalise(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address


class ConnectionQuotas:
    def __init__(
        self,
        max_connections: int = UNLIMITED,
        max_connections_per_ip: int = UNLIMITED,
        per_ip_overrides: dict[str, int] | None = None,
        listener_limits: dict[str, int] | None = None,
        protected_listener: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_connections = max_connections
        self.max_connections_per_ip = max_connections_per_ip
        self.per_ip_overrides = {_normalise(k): v for k, v in (per_ip_overrides or {}).items()}
        self.listener_limits = dict(listener_limits or {})
        self.protected_listener = protected_listener
        self._by_ip: dict[str, int] = {}
        self._by_listener: dict[str, int] = {}
        self.total = 0  # connections counted against max.connections
        self.refused = 0
        self._clock = clock
        self._last_logged: OrderedDict[str, float] = OrderedDict()

    def limit_for(self, address: str) -> int:
        return self.per_ip_overrides.get(_normalise(address), self.max_connections_per_ip)

    def count(self, address: str) -> int:
        return self._by_ip.get(_normalise(address), 0)

    def try_acquire(self, listener: str, address: str) -> bool:
        """Count a new connection, or say (False, logged) that it must be closed."""
        address = _normalise(address)
        reason = None
        if self._by_ip.get(address, 0) >= self.limit_for(address):
            reason = f"address already has the configured maximum of {self.limit_for(address)}"
        elif self._by_listener.get(listener, 0) >= self.listener_limits.get(listener, UNLIMITED):
            reason = f"listener {listener} has its maximum of {self.listener_limits[listener]}"
        elif listener != self.protected_listener and self.total >= self.max_connections:
            reason = f"the broker has its maximum of {self.max_connections} (max.connections)"
        if reason is not None:
            self.refused += 1
            self._log_refusal(address, listener, reason)
            return False
        self._by_ip[address] = self._by_ip.get(address, 0) + 1
        self._by_listener[listener] = self._by_listener.get(listener, 0) + 1
        if listener != self.protected_listener:
            self.total += 1
        return True

    def release(self, listener: str, address: str) -> None:
        address = _normalise(address)
        remaining = self._by_ip.get(address, 0) - 1
        if remaining > 0:
            self._by_ip[address] = remaining
        else:
            self._by_ip.pop(address, None)
        self._by_listener[listener] = max(0, self._by_listener.get(listener, 0) - 1)
        if listener != self.protected_listener:
            self.total = max(0, self.total - 1)

    def _log_refusal(self, address: str, listener: str, reason: str) -> None:
        now = self._clock()
        last = self._last_logged.get(address)
        if last is not None and now - last < 1.0:
            return
        self._last_logged[address] = now
        self._last_logged.move_to_end(address)
        while len(self._last_logged) > 1024:
            self._last_logged.popitem(last=False)
        log.info("Rejected connection from %s on listener %s: %s", address, listener, reason)


class MemoryPool:
    """`queued.max.request.bytes` (see the module docstring). `capacity` <= 0: unlimited."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.available = capacity
        self._waiters: OrderedDict[int, Callable[[], bool]] = OrderedDict()

    @property
    def unlimited(self) -> bool:
        return self.capacity <= 0

    @property
    def used(self) -> int:
        return 0 if self.unlimited else self.capacity - self.available

    def try_reserve(self, size: int) -> bool:
        if self.unlimited:
            return True
        if self.available <= 0:
            return False
        self.available -= size
        return True

    def release(self, size: int) -> None:
        if self.unlimited or size <= 0:
            return
        self.available += size
        # Wake connections waiting for memory, oldest first, while there is some: each retries
        # its reservation (returns True once it got memory or no longer needs it).
        while self._waiters and self.available > 0:
            key, retry = next(iter(self._waiters.items()))
            if not retry():
                return
            self._waiters.pop(key, None)

    def wait(self, key: int, retry: Callable[[], bool]) -> None:
        self._waiters[key] = retry

    def forget(self, key: int) -> None:
        self._waiters.pop(key, None)

    @property
    def waiting(self) -> int:
        return len(self._waiters)
