"""Build a kio entity of any version from plain values.

Each version of a Kafka message is its own kio dataclass, with its own nested classes. Request handlers
describe a response once, as nested dicts keyed by field name, and `build` turns that into the
dataclass of whatever version the client asked for: keys the version does not have are ignored,
fields the version has but the dict lacks take their schema default or a zero value of their Kafka type.
This keeps one handler per API instead of one per version.

`build` is not for the hottest paths (it introspects); Produce and Fetch responses and cached Metadata
responses are built once per request, which keeps the cost per record at zero.
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
import uuid
from collections.abc import Mapping
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode

from odradek.protocol.codec import RequestHeader, response_class

_ZERO_BY_KAFKA_TYPE: dict[str, Any] = {
    "int8": 0,
    "int16": 0,
    "int32": 0,
    "int64": 0,
    "uint16": 0,
    "uint32": 0,
    "uint64": 0,
    "float64": 0.0,
    "bool": False,
    "string": "",
    "bytes": b"",
    "records": None,
    "uuid": uuid.UUID(int=0),
    "error_code": ErrorCode.none,
    "timedelta_i32": datetime.timedelta(0),
    "timedelta_i64": datetime.timedelta(0),
    "datetime_i64": None,
}


@dataclasses.dataclass(frozen=True, slots=True)
class _FieldPlan:
    name: str
    nested: type | None  # entity class for nested entities / arrays of entities
    is_array: bool
    has_default: bool
    zero: Any
    kafka_type: str | None


def _unwrap_optional(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


@cache
def _plan(cls: type) -> tuple[_FieldPlan, ...]:
    hints = typing.get_type_hints(cls)
    plans = []
    for f in dataclasses.fields(cls):
        tp = _unwrap_optional(hints[f.name])
        nested = None
        is_array = False
        if typing.get_origin(tp) is tuple:
            is_array = True
            item = _unwrap_optional(typing.get_args(tp)[0])
            if dataclasses.is_dataclass(item):
                nested = item
        elif dataclasses.is_dataclass(tp):
            nested = tp
        has_default = (
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        )
        kafka_type = f.metadata.get("kafka_type")
        zero: Any
        if is_array:
            zero = ()
        elif kafka_type is not None:
            zero = _ZERO_BY_KAFKA_TYPE.get(kafka_type)
            if kafka_type == "string" and type(None) in typing.get_args(hints[f.name]):
                zero = None
        else:
            zero = None
        plans.append(_FieldPlan(f.name, nested, is_array, has_default, zero, kafka_type))
    return tuple(plans)


def _convert(value: Any, nested: type | None, is_array: bool) -> Any:
    if value is None:
        return None
    if nested is None:
        if is_array and not isinstance(value, tuple):
            return tuple(value)
        if isinstance(value, int) and not isinstance(value, bool | ErrorCode):
            return value
        return value
    if is_array:
        return tuple(item if isinstance(item, nested) else build(nested, item) for item in value)
    return value if isinstance(value, nested) else build(nested, value)


def build(cls: type, values: Mapping[str, Any]) -> Any:
    """Instantiate the kio dataclass `cls` from `values` (see the module docstring)."""
    kwargs: dict[str, Any] = {}
    for plan in _plan(cls):
        if plan.name in values:
            value = values[plan.name]
            if plan.kafka_type == "error_code" and not isinstance(value, ErrorCode):
                value = ErrorCode(int(value))
            elif plan.kafka_type in ("timedelta_i32", "timedelta_i64") and isinstance(value, int):
                value = datetime.timedelta(milliseconds=value)
            kwargs[plan.name] = _convert(value, plan.nested, plan.is_array)
        elif not plan.has_default:
            kwargs[plan.name] = plan.zero
    return cls(**kwargs)


def build_response(header: RequestHeader, values: Mapping[str, Any]) -> Any:
    """The response entity of `header`'s API and version, built from plain values (`build`)."""
    return build(response_class(header.api_key, header.api_version), values)
