"""The ZooKeeper client's transactions: `multi` (all or nothing), `checked_multi` (a controller
write, fenced by `/controller_epoch`'s znode version) and `chunked_multi` (many independent ops in
pipelined transactions under ZooKeeper's request size limit).

`ZkMulti` is a base of `ZkClient` (client.py); it works on the kazoo client and helpers
`ZkClient` defines, declared below. The ops themselves are in `ops`.

Concurrency: as `ZkClient`'s — call only on the thread of the loop that ran `start()`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooClient
from kazoo.security import ACL

from odradek.zk.errors import (
    BadVersionError,
    ControllerMovedError,
    NoNodeError,
    ZkError,
    ZkRequestTooLargeError,
)
from odradek.zk.ops import (
    _TRANSACTION_OVERHEAD,
    CheckOp,
    OpResult,
    ZkOp,
    _add_to_transaction,
    _FailedOp,
    _interpret_transaction,
    op_size,
)
from odradek.zk.retry import retry_on_connection_loss
from odradek.zk.znodes import ControllerEpochZNode

DEFAULT_MAX_MULTI_BYTES = 900_000  # ZooKeeper refuses requests over jute.maxbuffer (1 MiB)


class ZkMulti:
    """Transactions of `ZkClient` (see the module docstring)."""

    # set by ZkClient.__init__
    _kazoo: KazooClient
    _chroot: str
    connection_loss_retry_s: float

    if TYPE_CHECKING:  # defined by ZkClient

        @property
        def _create_acl_bytes(self) -> int: ...

        def _acl_for(self, path: str) -> list[ACL] | None: ...

        def _bridge(self, async_result: Any, path: str | None) -> asyncio.Future[Any]: ...

    # -- transactions ------------------------------------------------------------------------

    def _submit_transaction(self, ops: Sequence[ZkOp]) -> asyncio.Future[Any]:
        transaction = self._kazoo.transaction()
        for op in ops:
            _add_to_transaction(transaction, op, self._acl_for)
        return self._bridge(transaction.commit_async(), None)

    async def _commit(
        self, ops: Sequence[ZkOp], first: asyncio.Future[Any] | None = None
    ) -> list[OpResult] | _FailedOp:
        raw = await retry_on_connection_loss(
            lambda: self._submit_transaction(ops),
            deadline_s=self.connection_loss_retry_s,
            first=first,
        )
        return _interpret_transaction(ops, raw)

    async def multi(self, ops: Sequence[ZkOp]) -> list[OpResult]:
        """Apply `ops` atomically; raise the error of the op that failed (all or nothing)."""
        if not ops:
            return []
        outcome = await self._commit(ops)
        if isinstance(outcome, _FailedOp):
            raise outcome.error
        return outcome

    @staticmethod
    def _epoch_check(epoch_zk_version: int | None) -> list[ZkOp]:
        if epoch_zk_version is None:
            return []
        return [CheckOp(ControllerEpochZNode.path(), epoch_zk_version)]

    @staticmethod
    def _controller_moved(
        epoch_zk_version: int | None, failure: _FailedOp
    ) -> ControllerMovedError | None:
        """ControllerMovedError if `failure` is the epoch check (op 0) of a checked transaction."""
        if (
            epoch_zk_version is not None
            and failure.index == 0
            and isinstance(failure.error, BadVersionError | NoNodeError)
        ):
            return ControllerMovedError(
                f"/controller_epoch is no longer at znode version {epoch_zk_version}"
            )
        return None

    async def checked_multi(self, epoch_zk_version: int, ops: Sequence[ZkOp]) -> list[OpResult]:
        """A controller write: `ops` in one transaction that first checks `/controller_epoch` is
        still at `epoch_zk_version`. ControllerMovedError if it is not (another controller was
        elected since); otherwise like `multi`. Returns the results of `ops` only."""
        outcome = await self._commit([*self._epoch_check(epoch_zk_version), *ops])
        if isinstance(outcome, _FailedOp):
            raise self._controller_moved(epoch_zk_version, outcome) or outcome.error
        return outcome[1:]

    async def chunked_multi(
        self,
        epoch_zk_version: int | None,
        ops: Sequence[ZkOp],
        max_bytes: int = DEFAULT_MAX_MULTI_BYTES,
    ) -> list[OpResult | ZkError]:
        """Apply many independent ops in transactions of at most `max_bytes`, all pipelined.

        Each transaction checks `/controller_epoch` first unless `epoch_zk_version` is None. The
        result list is aligned with `ops`: each op's result, or its own error. When one op fails,
        ZooKeeper aborts its whole transaction; the other ops are resent without it, so one
        partition's stale version does not fail its neighbours (the ops must not depend on each
        other). An op too large to send alone gets ZkRequestTooLargeError. Raises
        ControllerMovedError if the epoch check fails, and connection/session errors as they are.

        Steps: 1. split ops into chunks by encoded size; 2. submit every chunk's transaction before
        awaiting any (they are all in flight at once); 3. settle each chunk, resending survivors.
        """
        results: list[OpResult | ZkError] = [None] * len(ops)
        check = self._epoch_check(epoch_zk_version)
        budget = max_bytes - _TRANSACTION_OVERHEAD - sum(op_size(c, self._chroot) for c in check)
        chunks: list[list[int]] = []
        current: list[int] = []
        used = 0
        for index, op in enumerate(ops):
            size = op_size(op, self._chroot, self._create_acl_bytes)
            if size > budget:
                results[index] = ZkRequestTooLargeError(
                    f"{size}-byte op exceeds the {max_bytes}-byte transaction budget", path=op.path
                )
                continue
            if current and used + size > budget:
                chunks.append(current)
                current, used = [], 0
            current.append(index)
            used += size
        if current:
            chunks.append(current)

        in_flight = [self._submit_transaction([*check, *(ops[i] for i in c)]) for c in chunks]
        outcomes = await asyncio.gather(
            *(
                self._settle_chunk(epoch_zk_version, check, ops, chunk, first, results)
                for chunk, first in zip(chunks, in_flight, strict=True)
            ),
            return_exceptions=True,
        )
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        if errors:
            raise next((e for e in errors if isinstance(e, ControllerMovedError)), errors[0])
        return results

    async def _settle_chunk(
        self,
        epoch_zk_version: int | None,
        check: list[ZkOp],
        ops: Sequence[ZkOp],
        chunk: list[int],
        first: asyncio.Future[Any],
        results: list[OpResult | ZkError],
    ) -> None:
        pending = chunk
        attempt: asyncio.Future[Any] | None = first
        while pending:
            transaction = [*check, *(ops[i] for i in pending)]
            outcome = await self._commit(transaction, first=attempt)
            if not isinstance(outcome, _FailedOp):
                for index, result in zip(pending, outcome[len(check) :], strict=True):
                    results[index] = result
                return
            moved = self._controller_moved(epoch_zk_version, outcome)
            if moved is not None:
                raise moved
            failed = outcome.index - len(check)
            results[pending[failed]] = outcome.error
            pending = pending[:failed] + pending[failed + 1 :]
            attempt = None
