"""Length checks of a request body before kio decodes it (the native walker is `_frames.c`).

kio's native reader allocates room for a compact array from the array's declared length before it
reads any element, and Rust aborts the process when that allocation fails: one 49-byte request
whose compact array claims 2^32 - 2 elements (34 GB) used to kill the broker. Before decoding a
request, the broker therefore walks its body with the request's layout and refuses any length that
cannot fit in what follows it (`LengthCheckError`, a `ProtocolError`: the connection is closed, as
for any malformed request).

The layout of each (API, version) is compiled once from kio's message classes into the small
opcode program `_frames.c` documents: for each field in order, integers and the like are skipped
by their size, strings and bytes by their length prefix (int16/int32 for classic versions, an
unsigned varint for flexible ones), arrays by their count and then their element's program, nested
structures inline, and each structure of a flexible version ends with its tagged fields (whose
values are skipped by their size; tagged fields are never arrays in request schemas).
Fields that kio types as optional (`X | None`, from the schema's nullableVersions) get the
nullable flag; a null anywhere else is refused, as Kafka's parser refuses it. `walk_reference` is
the same walk in Python, the fallback when the extension is not built and the
specification the property tests hold the native walk to.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
import types
import typing
from functools import cache
from typing import Any

log = logging.getLogger(__name__)

FIXED, LEGACY_STRING, LEGACY_BYTES, COMPACT_BYTES, TAGGED, LEGACY_ARRAY, COMPACT_ARRAY = range(1, 8)
NULLABLE = 0x80

_FIXED_SIZES = {
    "int8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
_U16 = struct.Struct(">H")


class LayoutError(Exception):
    """A message class this compiler does not understand (a bug, raised at first use)."""


def _unwrap(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None was allowed)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) < len(typing.get_args(tp))
    return tp, False


def _scalar(kafka_type: str | None, flexible: bool, nullable: bool) -> bytes:
    if kafka_type in _FIXED_SIZES:
        return bytes([FIXED, _FIXED_SIZES[kafka_type]])
    flag = NULLABLE if nullable else 0
    if kafka_type == "string":
        return bytes([(COMPACT_BYTES if flexible else LEGACY_STRING) | flag])
    if kafka_type in ("bytes", "records"):
        return bytes([(COMPACT_BYTES if flexible else LEGACY_BYTES) | flag])
    raise LayoutError(f"unknown kafka type {kafka_type!r}")


@cache
def compile_layout(cls: type) -> bytes:
    """The layout program of the kio message class `cls` (module docstring)."""
    flexible = bool(getattr(cls, "__flexible__", False))
    hints = typing.get_type_hints(cls)
    program = bytearray()
    for field in dataclasses.fields(cls):
        if "tag" in field.metadata:
            continue  # in the tagged section
        tp, nullable = _unwrap(hints[field.name])
        kafka_type = field.metadata.get("kafka_type")
        if typing.get_origin(tp) is tuple:
            item, item_nullable = _unwrap(typing.get_args(tp)[0])
            element = (
                compile_layout(typing.cast(type, item))
                if dataclasses.is_dataclass(item)
                else _scalar(kafka_type, flexible, item_nullable)
            )
            opcode = COMPACT_ARRAY if flexible else LEGACY_ARRAY
            program.append(opcode | (NULLABLE if nullable else 0))
            program += _U16.pack(len(element)) + element
        elif dataclasses.is_dataclass(tp):
            program += compile_layout(typing.cast(type, tp))
        else:
            program += _scalar(kafka_type, flexible, nullable)
    if flexible:
        program.append(TAGGED)
    return bytes(program)


class _Cut(Exception):
    pass


def walk_reference(frame: bytes | memoryview, offset: int, program: bytes) -> int:
    """The walk of `_frames.check` in Python; returns the end, raises ValueError."""
    position = offset
    n = len(frame)

    def need(count: int, what: str) -> None:
        nonlocal position
        if count < 0 or count > n - position:
            raise ValueError(f"{what} at byte {position}")
        position += count

    def uvarint() -> int:
        nonlocal position
        value = 0
        for shift in range(0, 35, 7):
            if position >= n:
                raise ValueError(f"a varint is cut short at byte {position}")
            byte = frame[position]
            position += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value & 0xFFFFFFFF
        raise ValueError(f"a varint is too long at byte {position}")

    def integer(width: int) -> int:
        nonlocal position
        if n - position < width:
            raise ValueError(f"a length is cut short at byte {position}")
        value = int.from_bytes(frame[position : position + width], "big", signed=True)
        position += width
        return value

    def run(prog: bytes, depth: int) -> None:
        if depth > 32:
            raise ValueError(f"the layout nests too deeply at byte {position}")
        pc = 0
        while pc < len(prog):
            op, nullable = prog[pc] & 0x7F, prog[pc] & NULLABLE
            pc += 1
            if op == FIXED:
                need(prog[pc], "a fixed-size field is cut short")
                pc += 1
            elif op in (LEGACY_STRING, LEGACY_BYTES):
                length = integer(2 if op == LEGACY_STRING else 4)
                if length == -1 and not nullable:
                    raise ValueError(f"a non-nullable field is null at byte {position}")
                if length != -1:
                    need(length, "a string or bytes length does not fit")
            elif op == COMPACT_BYTES:
                length = uvarint()
                if length == 0 and not nullable:
                    raise ValueError(f"a non-nullable field is null at byte {position}")
                if length > 0:
                    need(length - 1, "a compact length does not fit")
            elif op == TAGGED:
                count = uvarint()
                if count > n - position:
                    raise ValueError(f"a tagged field count does not fit at byte {position}")
                for _ in range(count):
                    uvarint()
                    need(uvarint(), "a tagged field does not fit")
            elif op in (LEGACY_ARRAY, COMPACT_ARRAY):
                (sub,) = _U16.unpack_from(prog, pc)
                pc += 2
                if op == LEGACY_ARRAY:
                    count = integer(4)
                    if count < -1:
                        raise ValueError(f"an array length is negative at byte {position}")
                else:
                    count = uvarint() - 1
                if count == -1 and not nullable:
                    raise ValueError(f"a non-nullable array is null at byte {position}")
                if count > n - position:
                    raise ValueError(
                        f"an array claims more elements than there are bytes left at byte "
                        f"{position}"
                    )
                for _ in range(count if sub else 0):
                    run(prog[pc : pc + sub], depth + 1)
                pc += sub
            else:
                raise ValueError(f"a malformed layout program at byte {position}")

    run(program, 0)
    return position


try:
    from odradek.protocol import _frames as _native
except ImportError:  # pragma: no cover - a broken installation
    _native = None  # type: ignore[assignment]
    log.warning(
        "odradek.protocol._frames is not built (run `pip install -e .`): checking in Python"
    )

NATIVE = _native is not None


def check_lengths(frame: bytes | memoryview, offset: int, cls: type) -> None:
    """Raise ValueError if a length in the body of `frame` (from `offset`, laid out as the kio
    class `cls`) cannot fit in the bytes that follow it."""
    program = compile_layout(cls)
    if _native is None:  # pragma: no cover
        walk_reference(frame, offset, program)
        return
    try:
        _native.check(frame, offset, program)
    except _native.LengthError as e:
        raise ValueError(str(e)) from None
