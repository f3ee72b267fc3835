"""`OdradekDataSource`: the PySpark data source named `odradek` (see the package docstring).

Spark creates the DataSource with the user's options and then asks it, depending on the query, for
its schema and a batch reader, a stream reader, a batch writer or a stream writer. Options are
checked at each of those points (see `odradek.spark.options`), so a mistake fails `load()`,
`start()` or `save()` with a message naming the option rather than a task on an executor.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from odradek.errors import DataSourceSchemaError
from odradek.spark.arrow import source_schema
from odradek.spark.options import SinkOptions, SourceOptions
from odradek.spark.reader import OdradekBatchReader
from odradek.spark.stream import OdradekStreamReader
from odradek.spark.writer import OdradekBatchWriter, OdradekStreamWriter

__all__ = ["OdradekDataSource"]


class OdradekDataSource(DataSource):
    """Read and write Odradek (or any Kafka) topics from Spark, batch and streaming."""

    @classmethod
    def name(cls) -> str:
        return "odradek"

    def _source_options(self) -> SourceOptions:
        return SourceOptions.parse(self.options)

    def schema(self) -> StructType:
        return source_schema(self._source_options().include_headers)

    def _check_schema(self, schema: StructType, options: SourceOptions) -> None:
        expected = source_schema(options.include_headers)
        if schema != expected:
            raise DataSourceSchemaError(
                "the odradek source has a fixed schema and cannot take a user-specified one: "
                f"expected {expected.simpleString()}, got {schema.simpleString()}"
            )

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self._source_options().for_batch()
        self._check_schema(schema, options)
        return OdradekBatchReader(options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = self._source_options().for_stream()
        self._check_schema(schema, options)
        return OdradekStreamReader(options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return OdradekBatchWriter(SinkOptions.parse(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # `overwrite` is set for the complete output mode; a topic can only be appended to, and
        # Spark's Kafka sink appends in every mode too.
        return OdradekStreamWriter(SinkOptions.parse(self.options), schema)
