"""Fetched record batches → Arrow record batches of the source's schema, with no Python per record.

`ArrowDecoder.add(records, from_offset, until_offset)` takes the records of one partition as a
Fetch response carries them (batches back to back, possibly ending in a partial batch) and appends
the rows whose offsets lie in [from_offset, until_offset) to native column buffers
(`odradek.protocol._arrow`, a visitor over the same record walker the broker validates with).
Python touches each batch once (its header, and decompression, bounded by `max_decompressed`
bytes through `protocol.compression`); `take()` wraps the buffers with `pa.Array.from_buffers`
into one `pyarrow.RecordBatch`.

Rows never come from control batches (transaction markers), and rows outside the range are
trimmed (a fetch starts at the batch holding the requested offset, and may run past the range's
end). `aborted` producer ids' batches are skipped for read_committed readers: `add` takes the
Fetch response's aborted transactions as (producer id, first offset) pairs and follows Kafka's
consumer (`protocol.aborted_transactions`: an aborted transaction's batches are dropped from its
first offset to its abort marker).

The rows equal what `protocol.record_batch.decode_records` gives for the same batches (the property
tests hold the two together), with Spark's column conventions (see `spark.arrow`).

Concurrency: an ArrowDecoder belongs to one reader thread.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
from odradek.protocol._arrow import Columns
from odradek.protocol._records import InvalidRecordsError

from odradek.errors import CorruptRecordError
from odradek.protocol.aborted_transactions import AbortedTransactions
from odradek.protocol.compression import decompress_bounded
from odradek.protocol.record_batch import HEADER_SIZE, BatchHeader, CompressionType, iter_batches

__all__ = ["DEFAULT_MAX_DECOMPRESSED", "ArrowDecoder"]

DEFAULT_MAX_DECOMPRESSED = 64 * 1024 * 1024
"""The most bytes one batch may decompress to (a consumer's fetch.max.bytes is 50 MiB)."""

_LOG_APPEND_TIME_BIT = 0x08


class ArrowDecoder:
    """Accumulates rows of one partition's record batches; see the module docstring."""

    def __init__(
        self,
        topic: str,
        partition: int,
        schema: pa.Schema,
        max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.schema = schema
        self.with_headers = len(schema) > 7
        self.max_decompressed = max_decompressed
        self._columns = Columns()
        self._aborted = AbortedTransactions()  # read_committed
        self._topic_column: pa.Array = pa.array([], pa.string())
        self._partition_column: pa.Array = pa.array([], pa.int32())

    @property
    def rows(self) -> int:
        return int(self._columns.rows)

    @property
    def data_bytes(self) -> int:
        return int(self._columns.data_bytes)

    def add(
        self,
        records: bytes | bytearray | memoryview,
        from_offset: int,
        until_offset: int,
        aborted: Iterable[tuple[int, int]] = (),
        headers: Iterable[BatchHeader] | None = None,
    ) -> int:
        """Append the rows in [from_offset, until_offset) of the complete batches in `records`;
        returns the offset after the last complete batch (`from_offset` when there is none).
        `headers`: the batches' headers, when the caller has already listed them."""
        self._aborted.add(aborted)
        position = from_offset
        for header in iter_batches(records) if headers is None else headers:
            if header.magic != 2:
                raise CorruptRecordError(
                    f"{self.topic}-{self.partition}: batch at offset {header.base_offset} has "
                    f"magic {header.magic} (only v2 is read)"
                )
            position = max(position, header.next_offset)
            if header.next_offset <= from_offset:
                continue
            if header.base_offset >= until_offset:
                break
            if header.is_transactional and self._aborted.skip(header):
                continue
            if header.is_control or header.records_count == 0:
                continue
            self._append(records, header, from_offset, until_offset)
        return position

    def _append(self, records, header, from_offset: int, until_offset: int) -> None:  # type: ignore[no-untyped-def]
        payload = memoryview(records)[header.position + HEADER_SIZE : header.position + header.size]
        log_append_time = bool(header.attributes & _LOG_APPEND_TIME_BIT)
        if header.compression != CompressionType.NONE:
            payload = decompress_bounded(header.compression, payload, self.max_decompressed)
        try:
            self._columns.append(
                payload,
                header.records_count,
                header.base_offset,
                header.base_timestamp,
                log_append_time,
                header.max_timestamp,
                from_offset,
                until_offset,
                self.with_headers,
            )
        except InvalidRecordsError as e:
            self._columns.take()  # the rows so far cannot be trusted to be whole
            raise CorruptRecordError(
                f"{self.topic}-{self.partition}: batch at offset {header.base_offset}: {e.args[0]}"
            ) from None
        finally:
            if isinstance(payload, memoryview):
                payload.release()

    def _constant_columns(self, rows: int) -> tuple[pa.Array, pa.Array]:
        """The topic and partition columns of `rows` rows: slices of arrays built once for the
        largest chunk so far (a chunk's topic column is its name once per row)."""
        if rows > len(self._topic_column):
            self._topic_column = pa.repeat(pa.scalar(self.topic, pa.string()), rows)
            self._partition_column = pa.repeat(pa.scalar(self.partition, pa.int32()), rows)
        return self._topic_column.slice(0, rows), self._partition_column.slice(0, rows)

    def take(self) -> pa.RecordBatch:
        """The rows added so far as one RecordBatch of `schema`; the decoder starts empty."""
        rows, key, value, offset, timestamp, timestamp_type, headers = self._columns.take()
        schema = self.schema
        columns = [
            _binary(schema.field("key").type, rows, key),
            _binary(schema.field("value").type, rows, value),
            *self._constant_columns(rows),
            pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(offset)]),
            pa.Array.from_buffers(
                schema.field("timestamp").type, rows, [None, pa.py_buffer(timestamp)]
            ),
            pa.Array.from_buffers(pa.int32(), rows, [None, pa.py_buffer(timestamp_type)]),
        ]
        if self.with_headers:
            columns.append(_headers(schema.field("headers").type, rows, headers))
        return pa.RecordBatch.from_arrays(columns, schema=schema)


def _binary(type_: pa.DataType, rows: int, parts: tuple[bytes, bytes, bytes, int]) -> pa.Array:
    offsets, data, validity, nulls = parts
    return pa.Array.from_buffers(
        type_,
        rows,
        [pa.py_buffer(validity) if nulls else None, pa.py_buffer(offsets), pa.py_buffer(data)],
        null_count=nulls,
    )


def _headers(type_: pa.ListType, rows: int, parts: tuple) -> pa.Array:  # type: ignore[type-arg]
    list_offsets, list_validity, list_nulls, count, key, value = parts
    struct_type = type_.value_type
    keys = _binary(struct_type.field(0).type, count, key)
    values = _binary(struct_type.field(1).type, count, value)
    entries = pa.StructArray.from_arrays(
        [keys, values], fields=[struct_type.field(0), struct_type.field(1)]
    )
    return pa.Array.from_buffers(
        type_,
        rows,
        [pa.py_buffer(list_validity) if list_nulls else None, pa.py_buffer(list_offsets)],
        null_count=list_nulls,
        children=[entries],
    )
