"""Which `__consumer_offsets` partition holds a group: Kafka's placement, bit for bit.

A group's coordinator is the leader of partition `abs(hash(group id)) % partitions` of the offsets
topic, where `hash` is Java's `String.hashCode` (s[0]*31^(n-1) + ... + s[n-1] over the string's
UTF-16 code units, in 32-bit two's-complement arithmetic) and `abs` is Kafka's `Utils.abs`: the
absolute value, except that Integer.MIN_VALUE (whose negation overflows) maps to 0. Not a mask of
the sign bit (`n & 0x7fffffff`), which older Kafka code used elsewhere and which gives another
partition for every negative hash: Kafka 3.9.1's own `Utils.abs(s.hashCode()) % 50` was run to
make the test vectors. Every Kafka broker and tool computes the same partition, so a group keeps
its partition (and its stored offsets) when a cluster moves between Kafka and Odradek.

Nothing here does I/O.
"""

from __future__ import annotations

import functools

OFFSETS_TOPIC = "__consumer_offsets"
"""The internal topic of committed offsets and group metadata."""

_MASK32 = 0xFFFFFFFF


def java_string_hash(text: str) -> int:
    """`String.hashCode()` of `text`, as a signed 32-bit int."""
    data = text.encode("utf-16-be", "surrogatepass")
    value = 0
    for index in range(0, len(data), 2):
        value = (value * 31 + ((data[index] << 8) | data[index + 1])) & _MASK32
    return value - (1 << 32) if value & 0x80000000 else value


@functools.lru_cache(maxsize=1 << 17)
def partition_for(group_id: str, partitions: int) -> int:
    """The offsets-topic partition of `group_id` among `partitions` (Kafka's partitionFor).
    Memoised: every group request asks, and unloading a partition asks for every group."""
    hashed = java_string_hash(group_id)
    return (0 if hashed == -(2**31) else abs(hashed)) % partitions
