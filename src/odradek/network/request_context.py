"""What a request handler knows about a request besides its body (Kafka's `RequestContext`).

The connection builds one per request and hands it to the dispatcher with the frame, so that it
travels with the request: a handler that awaits (a parked JoinGroup, a delayed produce) still sees
its own request's client, not whatever request the connection read next. Nothing here is shared
between requests.

`principal` is what the connection authenticated as (`User:alice` after SASL, the mapped
certificate DN after mutual TLS, Kafka's `User:ANONYMOUS` otherwise); `listener` is the name of the
listener the connection came in on (Metadata answers with that listener's addresses).

`size` is the request's size in bytes (what a produce quota counts); `throttle(ms)` mutes the
connection — it reads no further request from the client — for `ms` milliseconds from the time its
response is ready (KIP-219: quotas throttle by muting the channel, not by delaying the response).
`received_ns` is when the request was read off the socket (for RequestQueueTimeMs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from odradek.protocol.codec import RequestHeader

ANONYMOUS = "User:ANONYMOUS"


@dataclass(frozen=True, slots=True)
class RequestContext:
    """One request's header, where it came from and who sent it. Immutable; any thread."""

    header: RequestHeader
    connection_id: str
    """The client's address and port as the connection knows it ("127.0.0.1:53422")."""
    client_host: str
    """The client's address alone ("127.0.0.1"); "?" when the socket did not say."""
    principal: str = ANONYMOUS
    listener: str = "PLAINTEXT"
    security_protocol: str = "PLAINTEXT"
    size: int = 0
    throttle: Callable[[int], None] | None = None
    """Mute the connection for that many milliseconds (None: a context without a connection)."""
    received_ns: int = 0
    """`time.perf_counter_ns()` at the read that completed the request's frame (0: unknown);
    RequestQueueTimeMs runs from here to the handler's start."""
