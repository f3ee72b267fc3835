"""Producer ids, handed out in blocks reserved through ZooKeeper (Kafka's `ZkProducerIdManager`).

Every idempotent or transactional producer gets a producer id from InitProducerId; the id must
never be handed out twice, by any broker, across any failure. Ids are reserved in blocks of
`PRODUCER_ID_BLOCK_SIZE` in `/latest_producer_id_block`:

1. read the znode's data and version (an empty znode means no block was ever taken);
2. the new block starts right after the block read (at 0 for the first), owned by this broker;
3. write it conditionally on the version read. A BadVersionError means another broker took a
   block meanwhile: go back to 1. Only once the write succeeded are ids of the block handed out.

So an id is handed out only from a block that ZooKeeper records as taken, and every block starts
after the last recorded one: a broker that crashes loses the rest of its block (those ids are never
used), and no restart, controller change or retried write can hand out an id twice. A write that
landed but whose answer was lost (connection loss, retried by the ZooKeeper client) fails the
retry with BadVersionError; the next read then sees our own block and the loop takes the one after
it -- a wasted block, never a shared one.

Concurrency: `ProducerIdManager` runs on the broker's event loop; one allocation at a time (an
`asyncio.Lock`), callers queue behind it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from odradek.errors import KafkaError
from odradek.zk.errors import BadVersionError, NodeExistsError, NoNodeError, ZkError
from odradek.zk.znodes.producer_ids import (
    PRODUCER_ID_BLOCK_SIZE,
    ProducerIdBlock,
    ProducerIdBlockZNode,
)

log = logging.getLogger(__name__)

_INT64_MAX = 2**63 - 1
MAX_ATTEMPTS = 100
"""Conditional writes tried before giving up (each loss means another broker took a block)."""


class ProducerIdZk(Protocol):
    """The three ZooKeeper calls the manager needs (`odradek.zk.client.ZkClient` has them)."""

    async def get(self, path: str) -> tuple[bytes, object]: ...

    async def set(self, path: str, data: bytes, version: int = -1) -> object: ...

    async def create(self, path: str, data: bytes = b"") -> str: ...


class ProducerIdsExhaustedError(KafkaError):
    """Every 64-bit producer id has been handed out (Kafka treats this as fatal)."""


class ProducerIdManager:
    """Hands out producer ids of this broker's current block, taking a new block when it runs out.

    Event-loop only. `generate_producer_id` raises a KafkaError (UNKNOWN_SERVER_ERROR) when no
    block can be taken, e.g. ZooKeeper is unreachable; InitProducerId answers with it.
    """

    def __init__(
        self, broker_id: int, zk: ProducerIdZk, block_size: int = PRODUCER_ID_BLOCK_SIZE
    ) -> None:
        self.broker_id = broker_id
        self._zk = zk
        self._block_size = block_size
        self._block: ProducerIdBlock | None = None
        self._next_id = 0
        self._lock = asyncio.Lock()

    @property
    def current_block(self) -> ProducerIdBlock | None:
        return self._block

    async def generate_producer_id(self) -> int:
        async with self._lock:
            if self._block is None or self._next_id > self._block.last_producer_id:
                self._block = await self._allocate_block()
                self._next_id = self._block.first_producer_id
            producer_id = self._next_id
            self._next_id += 1
            return producer_id

    async def _allocate_block(self) -> ProducerIdBlock:
        path = ProducerIdBlockZNode.path()
        for _attempt in range(MAX_ATTEMPTS):
            try:
                data, stat = await self._zk.get(path)
                version = int(getattr(stat, "version"))  # noqa: B009 -- kazoo's ZnodeStat field
                current = ProducerIdBlockZNode.decode(data, version)
            except NoNodeError:
                await self._create_empty(path)
                continue
            except ZkError as e:
                raise KafkaError(f"cannot read {path}: {e}") from e
            if current is None:
                first = 0
            else:
                if current.last_producer_id > _INT64_MAX - self._block_size:
                    raise ProducerIdsExhaustedError(
                        f"every producer id is taken (last block ends at {current.last_producer_id})"
                    )
                first = current.next_block_first_id
            block = ProducerIdBlock(self.broker_id, first, self._block_size)
            try:
                new_stat = await self._zk.set(path, ProducerIdBlockZNode.encode(block), version)
            except BadVersionError:
                log.debug(
                    "producer id block at version %d taken by another broker; retrying", version
                )
                continue
            except ZkError as e:
                raise KafkaError(f"cannot reserve a producer id block in ZooKeeper: {e}") from e
            new_version = int(getattr(new_stat, "version", version + 1))
            block = ProducerIdBlock(self.broker_id, first, self._block_size, new_version)
            log.info(
                "acquired producer id block [%d, %d] (znode version %d)",
                block.first_producer_id,
                block.last_producer_id,
                new_version,
            )
            return block
        raise KafkaError(f"no producer id block after {MAX_ATTEMPTS} conflicting writes")

    async def _create_empty(self, path: str) -> None:
        try:
            await self._zk.create(path, b"")
        except NodeExistsError:
            pass
        except ZkError as e:
            raise KafkaError(f"cannot create {path}: {e}") from e
