"""Unsigned varints as Kafka's flexible versions write lengths (compact strings and arrays, tagged
fields): seven bits a byte, least significant first, the high bit set on every byte but the last.
Concurrency: pure functions."""

from __future__ import annotations

__all__ = ["uvarint"]


def uvarint(value: int) -> bytes:
    """`value` (>= 0) as an unsigned varint."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
