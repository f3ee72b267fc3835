"""The field primitives of the coordinators' on-disk records: the keys and values of
`__consumer_offsets` (`group/schemas.py`) and `__transaction_state` (`transaction/log_records.py`),
both Kafka message schemas stored as an int16 version and the message in that version's layout.

Fixed-width integers are big-endian. Flexible versions write lengths and counts as an unsigned
varint (7 bits a byte, low bits first, high bit set on every byte but the last) of the value + 1,
0 for null, and end every struct with a tagged-field section (an unsigned varint count, then per
field an unsigned varint tag, an unsigned varint size and that many bytes), which a reader skips:
no tagged field is known to either schema. Every malformation raises CorruptRecordError.

Nothing here does I/O.
"""

from __future__ import annotations

import struct

from odradek.errors import CorruptRecordError


def write_uvarint(out: bytearray, value: int) -> None:
    """Append `value` (>= 0) as an unsigned varint."""
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


class RecordReader:
    """Reads the fields of one record from `position` on; each read advances `position`."""

    __slots__ = ("data", "position")

    # What a read past the end says (a subclass may name its record).
    OVERRUN = "a field runs past the end of the record"

    def __init__(self, data: bytes | memoryview, position: int = 0) -> None:
        self.data = data
        self.position = position

    def take(self, size: int) -> bytes:
        end = self.position + size
        if size < 0 or end > len(self.data):
            raise CorruptRecordError(self.OVERRUN)
        chunk = bytes(self.data[self.position : end])
        self.position = end
        return chunk

    def fixed(self, layout: struct.Struct) -> int:
        return int(layout.unpack(self.take(layout.size))[0])

    def uvarint(self) -> int:
        result = shift = 0
        while True:
            if self.position >= len(self.data) or shift > 63:
                raise CorruptRecordError("malformed unsigned varint")
            byte = self.data[self.position]
            self.position += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())

    def end(self, name: str) -> None:
        """Refuse bytes left after the record `name`."""
        if self.position != len(self.data):
            raise CorruptRecordError(f"{len(self.data) - self.position} stray bytes after {name}")
