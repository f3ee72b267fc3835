"""One partition's answer in a Fetch v11 response, read in place from the response frame.

The range reader's fast path (`spark.fetch`) asks for one partition per Fetch and gets back up to
`FETCH_MAX_BYTES` of records. Decoding the whole response with kio would copy the records field
into a fresh `bytes` object (tens of MB per response, and fresh multi-megabyte allocations are
slow on these machines); this reader walks the few fixed fields with `struct` instead and returns
the records as a `memoryview` slice of the frame, so the bytes are copied once, by the Arrow
decoder, into the column buffers. No Python work per record or per batch happens here.

Fetch v11 response body (after the 4-byte correlation id; v11 is not a flexible version):

    throttle_time_ms int32, error_code int16, session_id int32,
    responses [topic string(int16 length), partitions [partition_index int32, error_code int16,
        high_watermark int64, last_stable_offset int64, log_start_offset int64,
        aborted_transactions nullable [producer_id int64, first_offset int64],
        preferred_read_replica int32, records nullable bytes(int32 length)]]

Arrays carry an int32 count (-1 for null). Anything that does not fit the frame raises
`ProtocolError`. Sans-I/O: bytes in, values out.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from odradek.protocol.codec import ProtocolError

__all__ = ["FetchedPartition", "read_fetch_partition"]

_HEAD = struct.Struct(">ihi")  # throttle_time_ms, error_code, session_id
_COUNT = struct.Struct(">i")
_LENGTH = struct.Struct(">h")
_PARTITION = struct.Struct(">ihqqq")  # index, error_code, high watermark, LSO, log start
_ABORTED = struct.Struct(">qq")
_PREFERRED = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    """One partition of a Fetch response. `records` is a view of the response frame: valid as
    long as the frame's buffer is (see `spark.wire.BrokerSocket.receive_frame`)."""

    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted_transactions: list[tuple[int, int]]  # (producer id, first offset)
    records: memoryview | None


def _unpack(layout: struct.Struct, body: memoryview, position: int) -> tuple[tuple, int]:  # type: ignore[type-arg]
    if position + layout.size > len(body):
        raise ProtocolError(f"Fetch response ends at {len(body)} inside a field at {position}")
    return layout.unpack_from(body, position), position + layout.size


def read_fetch_partition(
    body: memoryview, topic: str, partition: int
) -> tuple[int, FetchedPartition | None]:
    """(the response's top-level error code, the answer for `topic`-`partition` or None if the
    response lacks it) from a Fetch v11 response `body` (the frame after the correlation id)."""
    (_throttle, error_code, _session), position = _unpack(_HEAD, body, 0)
    (topics,), position = _unpack(_COUNT, body, position)
    wanted = topic.encode()
    found = None
    for _ in range(max(topics, 0)):
        (length,), position = _unpack(_LENGTH, body, position)
        if length < 0 or position + length > len(body):
            raise ProtocolError(f"Fetch response: topic name of {length} bytes at {position}")
        name = body[position : position + length]
        position += length
        (partitions,), position = _unpack(_COUNT, body, position)
        for _ in range(max(partitions, 0)):
            item, position = _read_partition(body, position)
            if found is None and item[0] == partition and name == wanted:
                found = item[1]
    return error_code, found


def _read_partition(body: memoryview, position: int) -> tuple[tuple[int, FetchedPartition], int]:
    (index, error_code, high, stable, start), position = _unpack(_PARTITION, body, position)
    (count,), position = _unpack(_COUNT, body, position)
    aborted = []
    for _ in range(max(count, 0)):
        (producer_id, first_offset), position = _unpack(_ABORTED, body, position)
        aborted.append((producer_id, first_offset))
    _preferred, position = _unpack(_PREFERRED, body, position)
    (size,), position = _unpack(_COUNT, body, position)
    records = None
    if size >= 0:
        if position + size > len(body):
            raise ProtocolError(f"Fetch response: records of {size} bytes at {position}")
        records = body[position : position + size]
        position += size
    return (index, FetchedPartition(error_code, high, stable, start, aborted, records)), position
