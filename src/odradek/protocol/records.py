"""The records inside a RecordBatch v2: validation and layout, native and pure-Python.

A batch's records section (after the 61-byte header, decompressed when the batch is compressed)
is `recordsCount` records back to back; the layout of one record and the rules a well-formed
section obeys are documented in the C source, `_records.c`. The short version: exactly
`recordsCount` records and no trailing byte; varints of at most 5 bytes and varlongs of at most 10,
whose value fits; each record's length equal to the bytes its fields take; key, value and header
value lengths >= -1 (-1 is null), header key lengths >= 0 and header keys UTF-8; record i has
offsetDelta i (in a producer's batch; a batch read back from a compacted log may miss records, so
there deltas need only increase: `stored=True`).

Two implementations of the same rules:

* `scan_records` / `index_records` call the native walker (`odradek.protocol._records`, built by
  `pip install -e .`), which costs no Python work per record and releases the GIL. This is what
  the broker uses on the produce path.
* `reference_scan` / `reference_index` are the rules written plainly in Python: the specification
  the property tests hold the native walker to, and the fallback when the extension is missing
  (with a warning: that is a broken installation, and 20-50x slower).

Both raise `InvalidRecordError` (INVALID_RECORD, the code Kafka's LogValidator answers for a
malformed record) with a message naming the record and what is wrong with it.

`RecordLayout` is one record's fields as positions in the records section. Readers that need keys
and values (the tools' `decode_records`, a compaction key map, a columnar reader) slice them out of
the section from these positions instead of parsing records themselves.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import NamedTuple

from odradek.errors import InvalidRecordError

log = logging.getLogger(__name__)

Buffer = bytes | bytearray | memoryview

MIN_RECORD_SIZE = 7
"""The smallest record: length, attributes, timestampDelta, offsetDelta, null key, null value and
a header count, one byte each."""


class RecordLayout(NamedTuple):
    """Where one record's fields are in its records section (lengths -1 mean null)."""

    offset_delta: int
    timestamp: int
    key_position: int
    key_length: int
    value_position: int
    value_length: int
    headers_position: int
    header_count: int
    end: int


OUTSIDE_LIMIT = 1000
"""How many records outside the timestamp bounds a scan lists (the rest are only refused): a
batch of millions of tiny records must not become millions of error entries in memory."""


class ScanResult(NamedTuple):
    """What validation learns in its pass: the smallest and largest record timestamp (-1, -1 for
    no records) and the first OUTSIDE_LIMIT records outside the timestamp bounds asked for, as
    (index, timestamp); with `require_keys`, the first OUTSIDE_LIMIT records without a key and
    how many there are (those are not in `outside`: Kafka reports a missing key first)."""

    min_timestamp: int
    max_timestamp: int
    outside: tuple[tuple[int, int], ...]
    keyless: tuple[int, ...] = ()
    keyless_count: int = 0


_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


# ---------------------------------------------------------------------------------------------
# The reference implementation


class _Malformed(Exception):
    def __init__(self, message: str, index: int, position: int) -> None:
        super().__init__(message, index, position)
        self.message = message


def _varint(buf: Buffer, position: int, end: int, max_bytes: int, bits: int) -> tuple[int, int]:
    """A zig-zag varint of at most `max_bytes` whose unsigned value fits `bits` bits."""
    raw = 0
    for count in range(max_bytes):
        if position >= end:
            raise ValueError("is cut short")
        byte = buf[position]
        position += 1
        if count == max_bytes - 1:
            if byte & 0x80:
                raise ValueError("is too long")
            if byte >> (bits - 7 * count):
                raise ValueError("does not fit its type")
        raw |= (byte & 0x7F) << (7 * count)
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), position
    raise ValueError("is too long")  # pragma: no cover - the loop returns or raises


def _to_int64(value: int) -> int:
    return (value + 2**63) % 2**64 - 2**63


class _Walker:
    """The reference walk: one record at a time, every rule spelled out."""

    def __init__(self, buf: Buffer, consecutive: bool = True) -> None:
        self.buf = buf
        self.position = 0
        self.index = -1
        self.consecutive = consecutive
        self.previous_delta = -1

    def fail(self, message: str) -> _Malformed:
        return _Malformed(f"record {self.index}{message}", self.index, self.position)

    def read(self, end: int, what: str, long: bool = False) -> int:
        try:
            value, self.position = _varint(
                self.buf, self.position, end, 10 if long else 5, 64 if long else 32
            )
        except ValueError as e:
            raise self.fail(f": the {what} varint {e}") from None
        return value

    def record_is_cut(self, n: int) -> bool:
        """Prefix walks: whether the next record is not wholly within the bytes there are."""
        try:
            length, position = _varint(self.buf, self.position, n, 5, 32)
        except ValueError as e:
            return str(e) == "is cut short"
        return length > n - position

    def record(self, n: int, base_timestamp: int) -> RecordLayout:
        length = self.read(n, "length")
        if length < 0:
            raise self.fail(f" has a negative length {length}")
        if length > n - self.position:
            raise self.fail(
                f" has length {length} but only {n - self.position} bytes of records remain"
            )
        end = self.position + length
        if self.position >= end:
            raise self.fail(" has no attributes byte")
        self.position += 1
        timestamp = _to_int64(base_timestamp + self.read(end, "timestampDelta", long=True))
        offset_delta = self.read(end, "offsetDelta")
        if (
            offset_delta != self.index
            if self.consecutive
            else offset_delta < 0 or offset_delta <= self.previous_delta
        ):
            rule = "consecutive" if self.consecutive else "increasing"
            raise self.fail(
                f" has offsetDelta {offset_delta} (records must have {rule} offset deltas)"
            )
        self.previous_delta = offset_delta
        key_position, key_length = self.field(end, "key")
        value_position, value_length = self.field(end, "value")
        header_count = self.read(end, "header count")
        if header_count < 0:
            raise self.fail(f" has header count {header_count}")
        if header_count > (end - self.position) // 2:
            raise self.fail(
                f": {header_count} headers cannot fit in the {end - self.position} bytes left "
                "of the record"
            )
        headers_position = self.position
        for h in range(header_count):
            header_key_length = self.read(end, "header key length")
            if header_key_length < 0:
                raise self.fail(
                    f": header {h} has key length {header_key_length} (header keys cannot be null)"
                )
            if header_key_length > end - self.position:
                raise self.fail(f": header {h}'s key runs past the record")
            try:
                bytes(self.buf[self.position : self.position + header_key_length]).decode()
            except UnicodeDecodeError:
                raise self.fail(f": header {h}'s key is not UTF-8") from None
            self.position += header_key_length
            header_value_length = self.read(end, "header value length")
            if header_value_length < -1:
                raise self.fail(f": header {h} has value length {header_value_length}")
            if header_value_length > end - self.position:
                raise self.fail(f": header {h}'s value runs past the record")
            self.position += max(header_value_length, 0)
        if self.position != end:
            raise self.fail(
                f" has length {length} but its fields take {self.position - (end - length)} bytes"
            )
        return RecordLayout(
            offset_delta,
            timestamp,
            key_position,
            key_length,
            value_position,
            value_length,
            headers_position,
            header_count,
            end,
        )

    def field(self, end: int, what: str) -> tuple[int, int]:
        """A key or value: (position of its bytes, length or -1 for null)."""
        length = self.read(end, f"{what} length")
        if length < -1:
            raise self.fail(f" has {what} length {length}")
        position = self.position
        if length > end - position:
            raise self.fail(f": its {what} of {length} bytes runs past the record")
        self.position += max(length, 0)
        return position, length


def _walk(
    buf: Buffer,
    count: int,
    base_timestamp: int,
    visit: Callable[[int, RecordLayout], None],
    prefix: bool = False,
    consecutive: bool = True,
) -> None:
    n = len(buf)
    if count < 0:
        raise _Malformed(f"recordsCount {count} is negative", -1, 0)
    if not prefix and count > n // MIN_RECORD_SIZE:
        raise _Malformed(f"recordsCount {count} cannot fit in {n} bytes of records", -1, 0)
    walker = _Walker(buf, consecutive)
    for index in range(count):
        walker.index = index
        if prefix and walker.record_is_cut(n):
            return
        visit(index, walker.record(n, base_timestamp))
    if walker.position != n:
        raise _Malformed(
            f"{n - walker.position} bytes follow the last of the {count} records",
            count,
            walker.position,
        )


def reference_scan(
    records: Buffer,
    records_count: int,
    base_timestamp: int,
    lower: int | None = None,
    upper: int | None = None,
    prefix: bool = False,
    require_keys: bool = False,
) -> ScanResult:
    """`scan_records` in plain Python (see the module docstring)."""
    check = lower is not None or upper is not None
    low = _INT64_MIN if lower is None else lower
    high = _INT64_MAX if upper is None else upper
    timestamps: list[int] = []
    outside: list[tuple[int, int]] = []
    keyless: list[int] = []

    def visit(index: int, record: RecordLayout) -> None:
        timestamps.append(record.timestamp)
        if require_keys and record.key_length < 0:
            keyless.append(index)
            return
        outside_bounds = check and record.timestamp != -1 and not low <= record.timestamp <= high
        if outside_bounds and len(outside) < OUTSIDE_LIMIT:
            outside.append((index, record.timestamp))

    try:
        _walk(records, records_count, base_timestamp, visit, prefix)
    except _Malformed as e:
        raise InvalidRecordError(e.message) from None
    listed = tuple(keyless[:OUTSIDE_LIMIT])
    if not timestamps:
        return ScanResult(-1, -1, (), listed, len(keyless))
    return ScanResult(min(timestamps), max(timestamps), tuple(outside), listed, len(keyless))


def reference_index(
    records: Buffer, records_count: int, base_timestamp: int, stored: bool = False
) -> list[RecordLayout]:
    """`index_records` in plain Python."""
    layouts: list[RecordLayout] = []
    try:
        _walk(
            records,
            records_count,
            base_timestamp,
            lambda _i, r: layouts.append(r),
            consecutive=not stored,
        )
    except _Malformed as e:
        raise InvalidRecordError(e.message) from None
    return layouts


# ---------------------------------------------------------------------------------------------
# The native implementation

try:
    from odradek.protocol import _records as _native
except ImportError:  # pragma: no cover - exercised only by a broken installation
    _native = None  # type: ignore[assignment]
    log.warning(
        "odradek.protocol._records is not built (run `pip install -e .`): validating records in "
        "pure Python, which is much slower"
    )

NATIVE = _native is not None
"""Whether the native walker is in use."""

_ROW = struct.Struct("=9q")


def scan_records(
    records: Buffer,
    records_count: int,
    base_timestamp: int,
    lower: int | None = None,
    upper: int | None = None,
    prefix: bool = False,
    require_keys: bool = False,
) -> ScanResult:
    """Validate a records section in one pass; InvalidRecordError on the first malformation.

    `lower`/`upper` (optional, inclusive, clamped to int64) are timestamp bounds: the result lists
    the first OUTSIDE_LIMIT records with a timestamp other than -1 outside them, with their
    timestamps. With `prefix`, `records`
    is only the start of the section (a decompression stopped at its limit): the walk stops at
    the first record not wholly there, refusing only malformations in the bytes it has. With
    `require_keys` (a compacted topic) records without a key are listed (see ScanResult).
    """
    if lower is not None:
        lower = max(lower, _INT64_MIN)
    if upper is not None:
        upper = min(upper, _INT64_MAX)
    if _native is None:  # pragma: no cover
        return reference_scan(
            records, records_count, base_timestamp, lower, upper, prefix, require_keys
        )
    if not _INT64_MIN <= records_count <= _INT64_MAX:
        raise InvalidRecordError(f"recordsCount {records_count} is out of range")
    try:
        return ScanResult._make(
            _native.scan(records, records_count, base_timestamp, lower, upper, prefix, require_keys)
        )
    except _native.InvalidRecordsError as e:
        raise InvalidRecordError(e.args[0]) from None


def index_records(
    records: Buffer, records_count: int, base_timestamp: int, stored: bool = False
) -> list[RecordLayout]:
    """Validate a records section and return every record's layout.

    `stored`: the records were read from the log, where compaction may have removed some, so
    offset deltas need only increase (a producer's batch has deltas 0, 1, 2, ...)."""
    if _native is None:  # pragma: no cover
        return reference_index(records, records_count, base_timestamp, stored)
    try:
        rows = _native.index(records, records_count, base_timestamp, stored)
    except _native.InvalidRecordsError as e:
        raise InvalidRecordError(e.args[0]) from None
    return [RecordLayout._make(row) for row in _ROW.iter_unpack(rows)]


def find_timestamp(
    records: Buffer, records_count: int, base_timestamp: int, target: int, min_delta: int
) -> tuple[int, int] | None:
    """The first record with timestamp >= `target` and offset delta >= `min_delta`, as
    (offset delta, timestamp); None when there is none. The walk stops at that record. The
    records are stored ones (see `index_records`)."""
    if _native is None:  # pragma: no cover
        return reference_find_timestamp(records, records_count, base_timestamp, target, min_delta)
    try:
        found = _native.find_timestamp(records, records_count, base_timestamp, target, min_delta)
    except _native.InvalidRecordsError as e:
        raise InvalidRecordError(e.args[0]) from None
    return None if found is None else (found[0], found[1])


def reference_find_timestamp(
    records: Buffer, records_count: int, base_timestamp: int, target: int, min_delta: int
) -> tuple[int, int] | None:
    """`find_timestamp` in plain Python (it validates the whole section first)."""
    for layout in reference_index(records, records_count, base_timestamp, stored=True):
        if layout.timestamp >= target and layout.offset_delta >= min_delta:
            return layout.offset_delta, layout.timestamp
    return None
