"""ZooKeeper errors, and the one place where kazoo's exceptions become ours.

Callers of `odradek.zk` never import kazoo's exception types: every kazoo error that leaves the
`zk` package goes through `translate_kazoo_error` first. The classes mirror the ZooKeeper result
codes that Kafka's controller and brokers act on:

* `NoNodeError`, `NodeExistsError`, `BadVersionError`, `NotEmptyError`: the request reached the
  server and was refused; retrying the same request gives the same answer.
* `ConnectionLossError`: the connection dropped while the request was in flight (or before it was
  sent). The session may still be alive, and the request may or may not have been applied; the
  retry helper in `odradek.zk.client` resends it.
* `SessionExpiredError`: the session is gone, with its ephemeral znodes and watches. Never retried
  blindly: the owner must re-register (Kafka's broker re-creates `/brokers/ids/<id>`, the
  controller resigns and re-elects).
* `ControllerMovedError`: a controller write failed the `/controller_epoch` version check, so this
  broker is no longer the controller. It is a Kafka `NOT_CONTROLLER` error, as in Kafka, where
  `ControllerMovedException` maps to that code.

Decoding errors of znode payloads (`InvalidZNodeDataError`) live here too, so that the whole package
raises from one module.
"""

from __future__ import annotations

from kazoo import exceptions as kazoo_exceptions
from kazoo.handlers.threading import KazooTimeoutError

from odradek.errors import NotControllerError, OdradekError


class ZkError(OdradekError):
    """A ZooKeeper request failed. `path` is the znode it was about, when known."""

    def __init__(self, message: str = "", *, path: str | None = None) -> None:
        super().__init__(message or self.__class__.__name__)
        self.path = path


class NoNodeError(ZkError):
    """The znode (or, for a create, its parent) does not exist."""


class NodeExistsError(ZkError):
    """A create found the znode already there."""


class BadVersionError(ZkError):
    """A conditional write or check named a znode version that is no longer current."""


class NotEmptyError(ZkError):
    """A non-recursive delete of a znode that still has children."""


class ConnectionLossError(ZkError):
    """The connection dropped; the session may survive and the request may have been applied."""


class SessionExpiredError(ZkError):
    """The ZooKeeper session expired (or the client was closed): ephemerals and watches are gone."""


class ClientClosedError(SessionExpiredError):
    """The ZkClient was closed while the request was pending, or used after close()."""


class ZkRequestTooLargeError(ZkError):
    """One operation alone exceeds the transaction size budget, so it was never sent."""


class ZkOperationError(ZkError):
    """Any other ZooKeeper refusal (no auth, invalid ACL, ...); `zk_code` is ZooKeeper's code."""

    def __init__(self, message: str = "", *, path: str | None = None, zk_code: int = 0) -> None:
        super().__init__(message, path=path)
        self.zk_code = zk_code


class InvalidZNodeDataError(ZkError):
    """A znode's payload is not the JSON (or text) that its znode class expects."""


class ControllerMovedError(NotControllerError):
    """A controller write failed its `/controller_epoch` check: another broker is controller now."""


# Checked in order: kazoo's ConnectionClosedError subclasses its SessionExpiredError, and both must
# come before the catch-all for ZookeeperError.
_TRANSLATIONS: tuple[tuple[type[BaseException], type[ZkError]], ...] = (
    (kazoo_exceptions.NoNodeError, NoNodeError),
    (kazoo_exceptions.NodeExistsError, NodeExistsError),
    (kazoo_exceptions.BadVersionError, BadVersionError),
    (kazoo_exceptions.NotEmptyError, NotEmptyError),
    (kazoo_exceptions.ConnectionClosedError, ClientClosedError),
    (kazoo_exceptions.SessionExpiredError, SessionExpiredError),
    (kazoo_exceptions.ConnectionLoss, ConnectionLossError),
    (kazoo_exceptions.ConnectionDropped, ConnectionLossError),
    (kazoo_exceptions.OperationTimeoutError, ConnectionLossError),
    (KazooTimeoutError, ConnectionLossError),
)


def translate_kazoo_error(exc: BaseException, path: str | None = None) -> BaseException:
    """Return the project's exception for a kazoo exception; anything else is returned unchanged.

    Non-kazoo exceptions (a TypeError from a bad argument, a cancellation) pass through untouched:
    they are programming errors or control flow, not ZooKeeper answers.
    """
    if isinstance(exc, ZkError):
        return exc
    for kazoo_type, ours in _TRANSLATIONS:
        if isinstance(exc, kazoo_type):
            detail = f"{ours.__name__} at {path}" if path else ours.__name__
            return ours(detail, path=path)
    if isinstance(exc, kazoo_exceptions.ZookeeperError):
        code = int(getattr(exc, "code", 0) or 0)
        name = type(exc).__name__
        detail = f"{name} (ZooKeeper code {code})" + (f" at {path}" if path else "")
        return ZkOperationError(detail, path=path, zk_code=code)
    if isinstance(exc, kazoo_exceptions.KazooException):
        return ZkOperationError(f"{type(exc).__name__}: {exc}", path=path)
    return exc


def is_multi_placeholder(result: object) -> bool:
    """True for the results ZooKeeper gives the *other* ops of an aborted transaction.

    When one op of a multi() fails, ZooKeeper reports that op's own error, code 0 ("rolled back")
    for the ops before it and RUNTIMEINCONSISTENCY for the ops after it. Only the first kind of
    real error says why the transaction failed.
    """
    return isinstance(
        result, kazoo_exceptions.RolledBackError | kazoo_exceptions.RuntimeInconsistency
    )


def is_kazoo_error(result: object) -> bool:
    """True if `result` (an element of a kazoo transaction result list) is an error."""
    return isinstance(result, kazoo_exceptions.KazooException)
