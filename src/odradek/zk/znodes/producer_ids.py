"""`/latest_producer_id_block`: the last block of producer ids handed to a broker.

Kafka's `ProducerIdBlockZNode` (ZooKeeper mode): JSON version 1,
`{"version":1,"broker":<id>,"block_start":"<first id>","block_end":"<last id>"}` -- the two ids
are decimal strings, as Kafka writes them. A broker takes the next block by writing the block
that follows this one conditionally on the znode version it read; the znode exists (empty) from
cluster start-up (`PERSISTENT_PATHS`), so the very first block is written at version 0.

See the package docstring for the conventions every class here follows.
"""

from __future__ import annotations

from dataclasses import dataclass

from odradek.zk.errors import InvalidZNodeDataError
from odradek.zk.znodes._common import _dumps, _int, _loads, _str

PRODUCER_ID_BLOCK_SIZE = 1000
"""Ids per block (Kafka's `ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE`)."""


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    """Ids `first_producer_id .. last_producer_id`, both included, owned by `broker_id`."""

    broker_id: int
    first_producer_id: int
    size: int
    zk_version: int = -1

    @property
    def last_producer_id(self) -> int:
        return self.first_producer_id + self.size - 1

    @property
    def next_block_first_id(self) -> int:
        return self.first_producer_id + self.size


class ProducerIdBlockZNode:
    """`/latest_producer_id_block` (JSON version 1)."""

    @staticmethod
    def path() -> str:
        return "/latest_producer_id_block"

    @staticmethod
    def encode(block: ProducerIdBlock) -> bytes:
        return _dumps(
            {
                "version": 1,
                "broker": block.broker_id,
                "block_start": str(block.first_producer_id),
                "block_end": str(block.last_producer_id),
            }
        )

    @staticmethod
    def decode(data: bytes, stat_version: int) -> ProducerIdBlock | None:
        """The block, or None when the znode holds no block yet (empty data)."""
        if not data:
            return None
        where = ProducerIdBlockZNode.path()
        obj = _loads(data, where)
        broker = _int(obj, "broker", where)
        try:
            start = int(_str(obj, "block_start", where))
            end = int(_str(obj, "block_end", where))
        except ValueError:
            raise InvalidZNodeDataError(
                f"{where}: block bounds are not integers", path=where
            ) from None
        if start < 0 or end < start:
            raise InvalidZNodeDataError(f"{where}: invalid block [{start}, {end}]", path=where)
        return ProducerIdBlock(broker, start, end - start + 1, stat_version)
