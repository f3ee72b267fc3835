"""What a request handler knows about a request besides its body (Kafka's `RequestContext`).

The connection builds one per request and hands it to the dispatcher with the frame, so that it
travels with the request: a handler that awaits (a parked JoinGroup, a delayed produce) still sees
its own request's client, not whatever request the connection read next. Nothing here is shared
between requests.

`principal` is Kafka's `User:ANONYMOUS` until listeners authenticate clients; an authenticator will
set it on the connection, and every request of that connection then carries it here.
"""

from __future__ import annotations

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
