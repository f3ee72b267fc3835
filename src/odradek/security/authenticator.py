"""The SASL side of a connection on a SASL_PLAINTEXT or SASL_SSL listener, sans-I/O (Kafka's
`SaslServerAuthenticator` and the re-authentication parts of `KafkaChannel` and `SocketServer`).

The connection feeds it frames (the payload of each size-prefixed frame) and carries out the actions
it returns, in order: `SendResponse` (encode with `odradek.protocol.codec.encode_response`),
`SendToken` (frame the raw bytes with `odradek.protocol.framing.frame`), `Authenticated` (attach the
principal), `Proceed` (hand the request to the handlers) and `Close` (flush what was queued, then
close). It never does I/O and never reads a clock: callers pass `now_ms`.

States (`SaslState`; changed only in `_set_state`):

| state | accepts | next |
|---|---|---|
| HANDSHAKE_OR_VERSIONS | ApiVersions (answered by the injected callback), SaslHandshake | HANDSHAKE after a successful ApiVersions; AUTHENTICATE_FRAMED (v1) or AUTHENTICATE_RAW (v0) after a handshake naming an enabled mechanism |
| HANDSHAKE | SaslHandshake only | as above |
| AUTHENTICATE_FRAMED | SaslAuthenticate v0-2 (KIP-152): each carries one token, each gets a response | AUTHENTICATED when the mechanism completes |
| AUTHENTICATE_RAW | raw tokens, one per frame, answered by raw frames (the pre-KIP-152 exchange after SaslHandshake v0, still used by some clients) | AUTHENTICATED |
| AUTHENTICATED | any request (`on_authenticated_request`) | re-authentication: back to AUTHENTICATE_FRAMED on a SaslHandshake |
| FAILED | nothing | (closed) |

Rules, as Kafka 3.x applies them:

* Before authentication only ApiVersions, SaslHandshake v0-1 and SaslAuthenticate v0-2 are
  allowed; anything else, an unparsable frame, or a frame larger than `max_receive_size`
  (`sasl.server.max.receive.size`, 524288) closes the connection. The connection should also cap
  its frame decoder at `max_receive_size` until `Authenticated`, so that a large size prefix is
  refused before its bytes are buffered.
* A handshake naming a mechanism that is not enabled gets UNSUPPORTED_SASL_MECHANISM with the
  enabled list, then the connection closes.
* A failed exchange gets SASL_AUTHENTICATION_FAILED with an error message in SaslAuthenticate
  (the raw exchange has no error channel: the connection just closes), the attempt is logged with
  the client address, and nothing else is processed.
* `connections.max.reauth.ms` (KIP-368): when positive, a completed authentication returns that
  lifetime in SaslAuthenticate v1+ (`session_lifetime_ms`) and the session expires then. A request
  arriving after expiry closes the connection (clients that cannot re-authenticate, v0, are
  disconnected this way, as in Kafka). Before expiry a client re-authenticates by sending
  SaslHandshake (v1) and SaslAuthenticate on the authenticated connection; the mechanism and the
  principal must not change, and a re-authentication may start at most once a second. Requests
  keep flowing until then; during re-authentication only SASL requests are allowed.
* On an authenticated connection that does not re-authenticate, SaslHandshake and SaslAuthenticate
  are answered with ILLEGAL_SASL_STATE, as Kafka's request handlers answer them.

Concurrency: one connection, one task; not thread-safe.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from odradek.protocol.build import build
from odradek.protocol.codec import (
    ApiKey,
    ProtocolError,
    RequestHeader,
    decode_request_body,
    parse_request_header,
    response_class,
)
from odradek.security.errors import AuthenticationError
from odradek.security.principal import KafkaPrincipal

log = logging.getLogger(__name__)

SASL_HANDSHAKE = int(ApiKey.SASL_HANDSHAKE)
SASL_AUTHENTICATE = 36
API_VERSIONS = int(ApiKey.API_VERSIONS)
SASL_HANDSHAKE_VERSIONS = (0, 1)
SASL_AUTHENTICATE_VERSIONS = (0, 2)
DEFAULT_MAX_RECEIVE_SIZE = 524288
MIN_REAUTH_INTERVAL_MS = 1000


class SaslServerMechanism(Protocol):
    """One server-side exchange of a mechanism (`PlainServer`, `ScramServer`)."""

    @property
    def mechanism_name(self) -> str: ...

    @property
    def complete(self) -> bool: ...

    @property
    def authorization_id(self) -> str: ...

    def evaluate(self, token: bytes) -> bytes: ...


MechanismFactory = Callable[[], SaslServerMechanism]
# Answers an ApiVersions request (header, whole frame) with a response entity; the broker's own
# ApiVersions handler, including its UNSUPPORTED_VERSION answer for versions it does not know.
ApiVersionsResponder = Callable[[RequestHeader, bytes], Any]


# -- actions -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendResponse:
    header: RequestHeader
    response: Any


@dataclass(frozen=True, slots=True)
class SendToken:
    """A raw token of the pre-KIP-152 exchange: send it as one size-prefixed frame."""

    token: bytes


@dataclass(frozen=True, slots=True)
class Authenticated:
    principal: KafkaPrincipal
    mechanism: str
    session_lifetime_ms: int  # 0: no expiry
    reauthentication: bool


@dataclass(frozen=True, slots=True)
class Proceed:
    """An authenticated connection's request: hand it to the request handlers."""


@dataclass(frozen=True, slots=True)
class Close:
    reason: str


Action = SendResponse | SendToken | Authenticated | Proceed | Close
PROCEED = Proceed()


class SaslState(enum.Enum):
    HANDSHAKE_OR_VERSIONS = "handshake or versions"
    HANDSHAKE = "handshake"
    AUTHENTICATE_FRAMED = "authenticate (SaslAuthenticate)"
    AUTHENTICATE_RAW = "authenticate (raw tokens)"
    AUTHENTICATED = "authenticated"
    FAILED = "failed"


class SaslServerAuthenticator:
    """The SASL state machine of one connection (see the module docstring)."""

    def __init__(
        self,
        mechanisms: Mapping[str, MechanismFactory],
        api_versions: ApiVersionsResponder,
        *,
        client_address: str = "?",
        connections_max_reauth_ms: int = 0,
        max_receive_size: int = DEFAULT_MAX_RECEIVE_SIZE,
    ) -> None:
        self._factories = dict(mechanisms)
        self.enabled_mechanisms = tuple(mechanisms)
        self._api_versions = api_versions
        self.client_address = client_address
        self.connections_max_reauth_ms = connections_max_reauth_ms
        self.max_receive_size = max_receive_size
        self.state = SaslState.HANDSHAKE_OR_VERSIONS
        self._server: SaslServerMechanism | None = None
        self.mechanism: str | None = None
        self.principal: KafkaPrincipal | None = None
        self.session_expiry_ms: int | None = None
        self._reauthenticating = False
        self._last_reauth_start_ms: int | None = None

    # -- the two entry points ----------------------------------------------------------------

    @property
    def authenticating(self) -> bool:
        """True while every frame must go to `receive_frame` (not to the request handlers)."""
        return self.state not in (SaslState.AUTHENTICATED, SaslState.FAILED)

    def receive_frame(self, frame: bytes, now_ms: int) -> list[Action]:
        """A frame received while `authenticating`."""
        if self.state is SaslState.FAILED:
            return [Close("authentication already failed")]
        if len(frame) > self.max_receive_size:
            return self._fail_silently(
                f"frame of {len(frame)} bytes exceeds sasl.server.max.receive.size "
                f"{self.max_receive_size} during authentication"
            )
        if self.state is SaslState.AUTHENTICATE_RAW:
            return self._raw_token(frame, now_ms)
        try:
            header = parse_request_header(frame)
        except ProtocolError as e:
            return self._fail_silently(f"not a Kafka request during authentication: {e}")
        if self.state in (SaslState.HANDSHAKE_OR_VERSIONS, SaslState.HANDSHAKE):
            if header.api_key == API_VERSIONS and self.state is SaslState.HANDSHAKE_OR_VERSIONS:
                return self._api_versions_request(header, frame)
            if header.api_key == SASL_HANDSHAKE:
                return self._handshake(header, frame)
            return self._fail_silently(
                f"unexpected request (api key {header.api_key}) during SASL handshake"
            )
        # AUTHENTICATE_FRAMED
        if header.api_key != SASL_AUTHENTICATE:
            return self._fail_silently(
                f"unexpected request (api key {header.api_key}) during SASL authentication"
            )
        return self._authenticate_request(header, frame, now_ms)

    def on_authenticated_request(
        self, header: RequestHeader, frame: bytes, now_ms: int
    ) -> list[Action]:
        """Every request of an AUTHENTICATED connection, before the handlers see it: expiry,
        re-authentication, and SASL requests that are out of place."""
        if self.state is not SaslState.AUTHENTICATED:
            return [Close(f"request in state {self.state.name}")]
        if self.session_expiry_ms is not None and now_ms >= self.session_expiry_ms:
            self._set_state(SaslState.FAILED)
            return [Close("SASL session expired (connections.max.reauth.ms)")]
        if header.api_key == SASL_HANDSHAKE:
            recently = (
                self._last_reauth_start_ms is not None
                and now_ms - self._last_reauth_start_ms < MIN_REAUTH_INTERVAL_MS
            )
            if self.session_expiry_ms is not None and not recently:
                self._last_reauth_start_ms = now_ms
                self._reauthenticating = True
                self._set_state(SaslState.HANDSHAKE)
                return self._handshake(header, frame)
            return [self._response(header, {"error_code": ErrorCode.illegal_sasl_state})]
        if header.api_key == SASL_AUTHENTICATE:
            return [
                self._response(
                    header,
                    {
                        "error_code": ErrorCode.illegal_sasl_state,
                        "error_message": "SaslAuthenticate request received after successful "
                        "authentication",
                    },
                )
            ]
        return [PROCEED]

    # -- steps --------------------------------------------------------------------------------

    def _api_versions_request(self, header: RequestHeader, frame: bytes) -> list[Action]:
        response = self._api_versions(header, frame)
        # An error answer (a version we do not know) lets the client retry with another version.
        if getattr(response, "error_code", ErrorCode.none) == ErrorCode.none:
            self._set_state(SaslState.HANDSHAKE)
        return [SendResponse(header, response)]

    def _handshake(self, header: RequestHeader, frame: bytes) -> list[Action]:
        if not SASL_HANDSHAKE_VERSIONS[0] <= header.api_version <= SASL_HANDSHAKE_VERSIONS[1]:
            return self._fail_silently(f"SaslHandshake v{header.api_version} is not supported")
        try:
            request = decode_request_body(header, frame)
        except ProtocolError as e:
            return self._fail_silently(f"malformed SaslHandshake: {e}")
        mechanism = str(request.mechanism)
        values = {"mechanisms": list(self.enabled_mechanisms)}
        if mechanism not in self._factories:
            self._set_state(SaslState.FAILED)
            log.info(
                "Failed authentication with %s (unsupported SASL mechanism %r)",
                self.client_address,
                mechanism,
            )
            return [
                self._response(
                    header, {**values, "error_code": ErrorCode.unsupported_sasl_mechanism}
                ),
                Close(f"unsupported SASL mechanism {mechanism!r}"),
            ]
        response = self._response(header, {**values, "error_code": ErrorCode.none})
        if self._reauthenticating and mechanism != self.mechanism:
            self._set_state(SaslState.FAILED)
            reason = (
                f"SASL mechanism '{mechanism}' requested by client is not supported for "
                f"re-authentication of mechanism '{self.mechanism}'"
            )
            log.info("Failed re-authentication with %s (%s)", self.client_address, reason)
            return [response, Close(reason)]
        self.mechanism = mechanism
        self._server = self._factories[mechanism]()
        framed = header.api_version >= 1
        self._set_state(SaslState.AUTHENTICATE_FRAMED if framed else SaslState.AUTHENTICATE_RAW)
        return [response]

    def _authenticate_request(
        self, header: RequestHeader, frame: bytes, now_ms: int
    ) -> list[Action]:
        if not SASL_AUTHENTICATE_VERSIONS[0] <= header.api_version <= SASL_AUTHENTICATE_VERSIONS[1]:
            return self._fail_silently(f"SaslAuthenticate v{header.api_version} is not supported")
        try:
            request = decode_request_body(header, frame)
        except ProtocolError as e:
            return self._fail_silently(f"malformed SaslAuthenticate: {e}")
        try:
            reply, done = self._evaluate(bytes(request.auth_bytes), now_ms)
        except AuthenticationError as e:
            self._log_failure(e)
            return [
                self._response(
                    header,
                    {"error_code": ErrorCode.sasl_authentication_failed, "error_message": str(e)},
                ),
                Close(f"authentication failed: {e.log_detail}"),
            ]
        lifetime = done.session_lifetime_ms if done is not None else 0
        actions: list[Action] = [
            self._response(
                header,
                {"error_code": ErrorCode.none, "auth_bytes": reply, "session_lifetime": lifetime},
            )
        ]
        if done is not None:
            actions.append(done)
        return actions

    def _raw_token(self, token: bytes, now_ms: int) -> list[Action]:
        try:
            reply, done = self._evaluate(token, now_ms)
        except AuthenticationError as e:
            self._log_failure(e)
            return [Close(f"authentication failed: {e.log_detail}")]
        actions: list[Action] = [SendToken(reply)]
        if done is not None:
            actions.append(done)
        return actions

    def _evaluate(self, token: bytes, now_ms: int) -> tuple[bytes, Authenticated | None]:
        """Run the mechanism; on completion switch to AUTHENTICATED and return the action."""
        server = self._server
        if server is None:
            raise AuthenticationError("Authentication failed: no SASL mechanism selected")
        try:
            reply = server.evaluate(token)
        except AuthenticationError:
            self._set_state(SaslState.FAILED)
            raise
        if not server.complete:
            return reply, None
        principal = KafkaPrincipal.user(server.authorization_id)
        if self._reauthenticating and principal != self.principal:
            self._set_state(SaslState.FAILED)
            raise AuthenticationError(
                f"Cannot change principals during re-authentication from {self.principal}: "
                f"{principal}"
            )
        lifetime = max(0, self.connections_max_reauth_ms)
        self.session_expiry_ms = now_ms + lifetime if lifetime > 0 else None
        done = Authenticated(principal, server.mechanism_name, lifetime, self._reauthenticating)
        self.principal = principal
        self._reauthenticating = False
        self._server = None
        self._set_state(SaslState.AUTHENTICATED)
        return reply, done

    # -- helpers ------------------------------------------------------------------------------

    def _set_state(self, state: SaslState) -> None:
        log.debug("SASL state of %s: %s -> %s", self.client_address, self.state.name, state.name)
        self.state = state

    def _fail_silently(self, reason: str) -> list[Action]:
        self._set_state(SaslState.FAILED)
        log.info("Failed authentication with %s (%s)", self.client_address, reason)
        return [Close(reason)]

    def _log_failure(self, error: AuthenticationError) -> None:
        what = "re-authentication" if self._reauthenticating else "authentication"
        log.info(
            "Failed %s with %s (mechanism %s: %s)",
            what,
            self.client_address,
            self.mechanism,
            error.log_detail,
        )

    @staticmethod
    def _response(header: RequestHeader, values: dict[str, Any]) -> SendResponse:
        return SendResponse(
            header, build(response_class(header.api_key, header.api_version), values)
        )
