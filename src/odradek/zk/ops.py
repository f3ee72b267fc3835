"""ZooKeeper transaction (multi) operations: the typed ops, their encoded sizes, and turning
kazoo's transaction results into per-op results or the op that failed.

Sans-I/O: `multi` (the client's transactions) submits them through kazoo.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from kazoo.client import TransactionRequest
from kazoo.protocol.states import ZnodeStat
from kazoo.security import ACL

from odradek.zk.errors import (
    ZkError,
    is_kazoo_error,
    is_multi_placeholder,
    translate_kazoo_error,
)


# Transaction operations. Results, by op: CreateOp -> the created path (with the sequence suffix
# if sequential), SetDataOp -> the new ZnodeStat, DeleteOp and CheckOp -> None.
@dataclass(frozen=True, slots=True)
class CreateOp:
    path: str
    data: bytes = b""
    ephemeral: bool = False
    sequence: bool = False


@dataclass(frozen=True, slots=True)
class SetDataOp:
    path: str
    data: bytes
    version: int = -1


@dataclass(frozen=True, slots=True)
class DeleteOp:
    path: str
    version: int = -1


@dataclass(frozen=True, slots=True)
class CheckOp:
    path: str
    version: int


ZkOp: TypeAlias = CreateOp | SetDataOp | DeleteOp | CheckOp
OpResult: TypeAlias = "str | ZnodeStat | None"

# Encoded sizes, to keep each transaction under ZooKeeper's 1 MiB request limit. A multi() op is
# a 9-byte header (type, done flag, error) then the op; strings and buffers carry a 4-byte length;
# the one ACL kazoo sends by default (world:anyone, all permissions) takes 27 bytes with its count;
# a transaction adds a 12-byte frame/request header and a 9-byte end marker.
_OP_HEADER = 9
_OPEN_ACL_BYTES = 4 + (4 + 4 + len("world") + 4 + len("anyone"))
_TRANSACTION_OVERHEAD = 12 + 9


def acl_bytes(acls: Sequence[ACL] | None) -> int:
    """Encoded size of a create's ACL list (None: kazoo's default open ACL)."""
    if acls is None:
        return _OPEN_ACL_BYTES
    return 4 + sum(4 + 4 + len(a.id.scheme.encode()) + 4 + len(a.id.id.encode()) for a in acls)


def op_size(op: ZkOp, chroot: str = "", create_acl_bytes: int = _OPEN_ACL_BYTES) -> int:
    """Bytes `op` adds to a multi() request (exact for the ACL size given)."""
    path_bytes = 4 + len(chroot.encode()) + len(op.path.encode())
    match op:
        case CreateOp():
            return _OP_HEADER + path_bytes + 4 + len(op.data) + create_acl_bytes + 4
        case SetDataOp():
            return _OP_HEADER + path_bytes + 4 + len(op.data) + 4
        case DeleteOp() | CheckOp():
            return _OP_HEADER + path_bytes + 4


def _add_to_transaction(
    transaction: TransactionRequest, op: ZkOp, acl_for: Callable[[str], list[ACL] | None]
) -> None:
    match op:
        case CreateOp():
            transaction.create(
                op.path,
                op.data,
                acl=acl_for(op.path),
                ephemeral=op.ephemeral,
                sequence=op.sequence,
            )
        case SetDataOp():
            transaction.set_data(op.path, op.data, op.version)
        case DeleteOp():
            transaction.delete(op.path, op.version)
        case CheckOp():
            transaction.check(op.path, op.version)


@dataclass(frozen=True, slots=True)
class _FailedOp:
    """The op that made a transaction abort: its index in the transaction and its error."""

    index: int
    error: ZkError


def _interpret_transaction(ops: Sequence[ZkOp], raw: list[Any]) -> list[OpResult] | _FailedOp:
    """Turn kazoo's transaction result list into per-op results, or the op that failed.

    A failed multi() does not raise in kazoo: the result list holds an exception object for every
    op. Only one is the cause; the rest are placeholders (see `is_multi_placeholder`).
    """
    if len(raw) != len(ops):
        raise ZkError(f"multi() returned {len(raw)} results for {len(ops)} ops")
    for index, result in enumerate(raw):
        if is_kazoo_error(result) and not is_multi_placeholder(result):
            error = translate_kazoo_error(result, ops[index].path)
            if not isinstance(error, ZkError):
                raise error
            return _FailedOp(index, error)
    if any(is_kazoo_error(r) for r in raw):
        raise ZkError("multi() aborted without naming the failed op")
    # kazoo gives True for delete and check; only creates (a path) and sets (a stat) have results.
    return [r if isinstance(r, str | ZnodeStat) else None for r in raw]
