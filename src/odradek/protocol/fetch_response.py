"""Fetch responses (v4-v15) encoded as a list of parts, records left in their segment files.

A Fetch response is mostly record bytes. Rather than read those bytes into Python and copy them
into a response buffer, the log hands out `FileRecords` — a segment's file descriptor, a byte
position and a length — and this encoder writes everything around them (frame size, header,
topic and partition fields, each records field's length prefix) as bytes, leaving each
`FileRecords` as its own part. The connection then sends the bytes with the transport and the
file ranges with `sendfile(2)`, so that on a plaintext connection record bytes go from the page
cache to the socket without passing through Python (Kafka's FileRecords/`transferTo`). On a TLS
connection the connection reads each range into bytes (`FileRecords.read`) and hands the parts
to the TLS transport one by one, so record bytes are copied once before encryption.

Layout by version (Kafka's FetchResponse.json): v7+ carry the top-level error code and session
id; v12+ are flexible (compact arrays, strings and bytes; empty tagged-field sections); v13+ name
topics by id; v4+ have last_stable_offset and aborted_transactions, v5+ log_start_offset and v11+
preferred_read_replica. Odradek never sets the tagged fields (diverging epoch, current leader,
snapshot id); aborted transactions are written for read_committed reads and null otherwise.

Sans-I/O: `FileRecords.read` is the only call that touches a file, and only when asked.
"""

from __future__ import annotations

import os
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from odradek.errors import InvariantError
from odradek.protocol.varint import uvarint

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_HEADER = struct.Struct(">ii")  # frame size, correlation id
_TOP_V7 = struct.Struct(">ihi")  # throttle, error code, session id
_PARTITION_V4 = struct.Struct(">ihqq")  # index, error, HW, LSO
_PARTITION_V5 = struct.Struct(">ihqqq")  # + log start offset
_ABORTED = struct.Struct(">qq")  # producer id, first offset
_NULL_ABORTED = _INT32.pack(-1)
_MINUS_ONE = _INT32.pack(-1)


class FileHandle:
    """A descriptor of its own on a segment file (a dup of the log's), closed when the last
    reference to it goes: a response waiting to be sent keeps reading the file it was built
    from even if the log closes or deletes that segment meanwhile, and can never read whatever
    file the log's descriptor number is reused for."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = os.dup(fd)

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


@dataclass(frozen=True, slots=True)
class FileRecords:
    """`size` bytes of whole record batches at `position` of an open segment file."""

    handle: FileHandle | int
    """The file: a `FileHandle`, or a bare descriptor its caller keeps open (tests, tools)."""
    position: int
    size: int

    @property
    def fd(self) -> int:
        handle = self.handle
        return handle if isinstance(handle, int) else handle.fd

    def __len__(self) -> int:
        return self.size

    def read(self) -> bytes:
        """The bytes themselves (the copying path: TLS connections, tools)."""
        data = os.pread(self.fd, self.size, self.position)
        if len(data) != self.size:
            raise OSError(f"segment shrank under a read: {len(data)} of {self.size} bytes")
        return data


Records = bytes | bytearray | memoryview | FileRecords


@dataclass(frozen=True, slots=True)
class EncodedResponse:
    """A whole response frame as parts (bytes and `FileRecords`), written by the connection as
    is: bytes through the transport, file ranges by sendfile."""

    parts: list[bytes | FileRecords]


@dataclass(frozen=True, slots=True)
class PartitionAnswer:
    index: int
    error_code: int
    high_watermark: int
    log_start_offset: int
    records: Records | None
    last_stable_offset: int = -1
    """-1: the high watermark (no transaction holds the partition back)."""
    aborted_transactions: Sequence[tuple[int, int]] | None = None
    """(producer id, first offset) of the aborted transactions a read_committed read overlaps."""


@dataclass(frozen=True, slots=True)
class TopicAnswer:
    name: str
    topic_id: uuid.UUID | None
    partitions: list[PartitionAnswer]


def encode_fetch_response(
    version: int,
    correlation_id: int,
    error_code: int,
    session_id: int,
    topics: Sequence[TopicAnswer],
    throttle_ms: int = 0,
) -> list[bytes | FileRecords]:
    """The whole response frame (size prefix included) as parts: bytes and `FileRecords`.

    Consecutive bytes are joined, so a response without records is a single part."""
    flexible = version >= 12
    parts: list[bytes | FileRecords] = []
    out = bytearray()
    out += b"\0\0\0\0\0\0\0\0"  # frame size and correlation id, filled in last
    if flexible:
        out += b"\0"  # response header tagged fields
    if version >= 7:
        out += _TOP_V7.pack(throttle_ms, error_code, session_id)
    else:
        out += _INT32.pack(throttle_ms)
    out += uvarint(len(topics) + 1) if flexible else _INT32.pack(len(topics))
    partition_struct = _PARTITION_V5 if version >= 5 else _PARTITION_V4
    for topic in topics:
        if version >= 13:
            out += (topic.topic_id or uuid.UUID(int=0)).bytes
        else:
            name = topic.name.encode()
            out += uvarint(len(name) + 1) if flexible else _INT16.pack(len(name))
            out += name
        partitions = topic.partitions
        out += uvarint(len(partitions) + 1) if flexible else _INT32.pack(len(partitions))
        for p in partitions:
            stable = p.last_stable_offset if p.last_stable_offset >= 0 else p.high_watermark
            if version >= 5:
                out += partition_struct.pack(
                    p.index, p.error_code, p.high_watermark, stable, p.log_start_offset
                )
            else:
                out += partition_struct.pack(p.index, p.error_code, p.high_watermark, stable)
            aborted = p.aborted_transactions
            if aborted is None:
                out += b"\0" if flexible else _NULL_ABORTED
            else:
                out += uvarint(len(aborted) + 1) if flexible else _INT32.pack(len(aborted))
                for producer_id, first_offset in aborted:
                    out += _ABORTED.pack(producer_id, first_offset)
                    if flexible:
                        out += b"\0"  # aborted transaction tagged fields
            if version >= 11:
                out += _MINUS_ONE  # preferred read replica
            records = p.records
            if records is None:
                out += b"\0" if flexible else _MINUS_ONE
            else:
                size = len(records)
                out += uvarint(size + 1) if flexible else _INT32.pack(size)
                if size:
                    if isinstance(records, FileRecords):
                        parts.append(bytes(out))
                        out.clear()
                        parts.append(records)
                    else:
                        out += records
            if flexible:
                out += b"\0"  # partition tagged fields
        if flexible:
            out += b"\0"  # topic tagged fields
    if flexible:
        out += b"\0"  # response tagged fields
    if out:
        parts.append(bytes(out))
    total = sum(len(part) for part in parts)
    first = parts[0]
    if not isinstance(first, bytes):
        raise InvariantError("a fetch response must start with its header")
    parts[0] = _HEADER.pack(total - 4, correlation_id) + first[8:]
    return parts
