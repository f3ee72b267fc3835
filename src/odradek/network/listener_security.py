"""What the socket server needs to know about a listener's security, without knowing how it is done.

The network layer sits below `odradek.security` (DESIGN.md §9), so it sees authentication through
the small interfaces here; `odradek.server.listeners` builds them from broker properties with the
security package.

* TLS (SSL and SASL_SSL listeners): `ssl_context`; the handshake runs before the connection object
  sees a byte, with `ssl_handshake_timeout`. After it, `principal_for_certificate` turns the
  client's certificate (DER bytes, None without one) into the connection's principal
  (`User:CN=...`), or raises `AuthenticationRefused` to close the connection.
* SASL (SASL_PLAINTEXT and SASL_SSL listeners): `new_sasl_session(client_address)` makes one
  `SaslSession` per connection. While it is `authenticating` every frame goes to `receive_frame`
  (frames are capped at `max_receive_size` until then); afterwards every request goes to
  `on_request` first. Both return actions, carried out in order by the connection:
  `Reply` (a response entity for a request header, answered in order with the others),
  `ReplyRaw` (bytes to send as one size-prefixed frame: the pre-KIP-152 SASL exchange),
  `SetPrincipal` (authentication succeeded), `PROCEED` (hand the request to the handlers) and
  `Close` (send what is queued, then close).

Immutable listener descriptions; sessions belong to one connection (event loop thread).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from odradek.errors import OdradekError
from odradek.protocol.codec import RequestHeader

ANONYMOUS = "User:ANONYMOUS"


class AuthenticationRefused(OdradekError):
    """The connection must be closed: its credentials (a certificate no mapping rule accepts)
    are refused."""


@dataclass(frozen=True, slots=True)
class Reply:
    header: RequestHeader
    response: Any


@dataclass(frozen=True, slots=True)
class ReplyRaw:
    data: bytes


@dataclass(frozen=True, slots=True)
class SetPrincipal:
    principal: str


@dataclass(frozen=True, slots=True)
class Proceed:
    pass


@dataclass(frozen=True, slots=True)
class Close:
    reason: str


PROCEED = Proceed()
Action = Reply | ReplyRaw | SetPrincipal | Proceed | Close


class SaslSession(Protocol):
    @property
    def authenticating(self) -> bool: ...

    @property
    def max_receive_size(self) -> int: ...

    def receive_frame(self, frame: bytes, now_ms: int) -> Sequence[Action]: ...

    def on_request(self, header: RequestHeader, frame: bytes, now_ms: int) -> Sequence[Action]: ...


@dataclass(frozen=True, slots=True)
class ListenerSecurity:
    """A listener's name, protocol and how its connections authenticate."""

    listener: str = "PLAINTEXT"
    security_protocol: str = "PLAINTEXT"
    ssl_context: ssl.SSLContext | None = None
    principal_for_certificate: Callable[[bytes | None], str] | None = None
    new_sasl_session: Callable[[str], SaslSession] | None = None
    ssl_handshake_timeout: float = 10.0


PLAINTEXT = ListenerSecurity()
