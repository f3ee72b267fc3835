"""The source's schema, and consumed messages turned into Arrow record batches.

The schema is Spark's Kafka source schema, column for column, so a query ports by changing the
format name:

    key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp,
    timestampType int [, headers array<struct<key:string,value:binary>>]

`headers` exists only with `includeHeaders=true`. `timestampType` uses the Java client's ids (0
CreateTime, 1 LogAppendTime, -1 none); librdkafka numbers the same types one higher. A record
without headers has a null `headers` value, as in Spark.

Readers yield `pyarrow.RecordBatch` objects, not Python tuples: PySpark then hands the columns to
the JVM as they are instead of converting each value. PySpark checks a batch's Arrow schema
against `to_arrow_schema(schema, timezone="UTC")` for equality, types and nullability alike, so
batches are built with exactly that schema. The only per-record Python work is one list
comprehension per column over the messages of a chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

__all__ = ["HEADER_TYPE", "arrow_schema", "record_batch", "source_schema"]

_ONE = pa.scalar(1, pa.int32())

HEADER_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)

_BASE_FIELDS = [
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
]


def source_schema(include_headers: bool) -> StructType:
    fields = list(_BASE_FIELDS)
    if include_headers:
        fields.append(StructField("headers", HEADER_TYPE))
    return StructType(fields)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema PySpark expects for `schema` (timestamps in microseconds, UTC)."""
    return to_arrow_schema(schema, timezone="UTC")


def record_batch(
    messages: Sequence[Any], topic: str, partition: int, schema: pa.Schema
) -> pa.RecordBatch:
    """One RecordBatch from consumed messages (confluent-kafka `Message`s without errors) of one
    partition. `schema` decides whether a headers column is built."""
    n = len(messages)
    timestamps = [m.timestamp() for m in messages]
    millis = pa.array([t[1] for t in timestamps], pa.int64())
    columns = [
        pa.array([m.key() for m in messages], pa.binary()),
        pa.array([m.value() for m in messages], pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array([m.offset() for m in messages], pa.int64()),
        pc.multiply(millis, 1000).cast(schema.field("timestamp").type),
        pc.subtract(pa.array([t[0] for t in timestamps], pa.int32()), _ONE),
    ]
    if len(schema) > len(columns):
        columns.append(pa.array([m.headers() for m in messages], schema.field("headers").type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)
