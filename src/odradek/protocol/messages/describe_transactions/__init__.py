"""DescribeTransactionsResponse v0 with TransactionStartTimeMs as a plain int64.

kio types the field as a timezone-aware datetime and its native reader refuses negative values,
but Kafka sends -1 there for a transaction that has not started (Empty, or an unknown id), so a
client reading kio's class cannot read Kafka's (or our) answer for those. This class is kio's,
field for field, except that `transaction_start_time` is an int of milliseconds (-1: none); the
wire bytes are identical. The request is kio's own.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kio.schema.describe_transactions.v0 import request as _request
from kio.schema.describe_transactions.v0 import response as _response
from kio.static.primitive import i64

_HEADER_ATTRIBUTES = ("__type__", "__version__", "__flexible__", "__api_key__", "__header_schema__")


def _clone(cls: type, replace: dict[str, tuple[Any, dict[str, str]]]) -> type:
    fields: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(cls):
        if f.name in replace:
            kind, metadata = replace[f.name]
            fields.append((f.name, kind, dataclasses.field(metadata=metadata)))
            continue
        options: dict[str, Any] = {"metadata": f.metadata}
        if f.default is not dataclasses.MISSING:
            options["default"] = f.default
        if f.default_factory is not dataclasses.MISSING:
            options["default_factory"] = f.default_factory
        fields.append((f.name, f.type, dataclasses.field(**options)))
    namespace = {name: getattr(cls, name) for name in _HEADER_ATTRIBUTES}
    return dataclasses.make_dataclass(
        cls.__name__, fields, namespace=namespace, frozen=True, slots=True, kw_only=True
    )


TransactionState = _clone(
    _response.TransactionState, {"transaction_start_time": (i64, {"kafka_type": "int64"})}
)
DescribeTransactionsResponse = _clone(
    _response.DescribeTransactionsResponse,
    {"transaction_states": (tuple[TransactionState, ...], {})},  # type: ignore[valid-type]
)
DescribeTransactionsRequest = _request.DescribeTransactionsRequest

DESCRIBE_TRANSACTIONS: dict[int, tuple[type, type]] = {
    0: (DescribeTransactionsRequest, DescribeTransactionsResponse)
}
