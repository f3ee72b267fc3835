"""Byte-level mutations of framed requests, and of the record batches inside Produce requests.

A mutation takes a valid frame (4-byte size, header, body) and returns the bytes to send. The
size prefix is rewritten to match what follows unless the mutation is about the size itself, so
that most mutants reach the request decoder rather than stopping at the framing layer (which
tests/integration/test_malformed_requests.py already covers):

| kind          | what                                                                        |
|---------------|-----------------------------------------------------------------------------|
| none          | the valid frame                                                             |
| truncate      | the body cut at a random point                                              |
| flip          | 1-4 random bits flipped in the body                                         |
| splice        | a random range of the body replaced by random bytes                         |
| insert        | random bytes inserted into the body                                         |
| delete        | a random range of the body removed                                          |
| int           | an int16/int32 or a varint at a random position set to an extreme value    |
| length        | the length prefix of a string the request carries set to a huge, negative or|
|               | off-by-one value (strings' prefixes are found by looking for the string)    |
| tail          | random bytes appended                                                       |
| size          | the frame's size prefix set to a wrong value (the rest unchanged)            |
| records       | (Produce) the records field replaced by a mutated batch, CRC recomputed or not|

Everything is drawn from the `random.Random` passed in, so a frame is reproducible from its seed.
"""

from __future__ import annotations

import random
import struct

import google_crc32c

from odradek.protocol.record_batch import HEADER_SIZE

SIZE = struct.Struct(">i")
EXTREME_INT32 = [0x7FFFFFFF, -(2**31), -1, -2, 0, 1, 2**16, 2**24]
EXTREME_INT16 = [0x7FFF, -(2**15), -1, -2, 0]
EXTREME_VARINTS = [
    b"\xff\xff\xff\xff\x0f",
    b"\xff\xff\xff\xff\xff",
    b"\x80\x80\x80\x80\x80\x80",
    b"\x00",
    b"\x01",
    b"\xfe\xff\xff\xff\x07",
]
KINDS = [
    "none",
    "truncate",
    "flip",
    "flip",
    "splice",
    "insert",
    "delete",
    "int",
    "int",
    "length",
    "length",
    "tail",
    "size",
]


def reframe(payload: bytes) -> bytes:
    return SIZE.pack(len(payload)) + payload


def mutate_frame(
    frame: bytes, body_start: int, strings: list[bytes], rng: random.Random, kind: str
) -> bytes:
    """`frame` (size prefix included) mutated by `kind` (module docstring)."""
    payload = bytearray(frame[4:])
    start = max(0, body_start - 4)
    span = max(1, len(payload) - start)
    if kind == "none":
        return frame
    if kind == "truncate":
        return reframe(bytes(payload[: start + rng.randrange(span)]))
    if kind == "flip":
        for _ in range(rng.randint(1, 4)):
            position = start + rng.randrange(span)
            if position < len(payload):
                payload[position] ^= 1 << rng.randrange(8)
    elif kind == "splice":
        position = start + rng.randrange(span)
        payload[position : position + rng.randint(1, 8)] = rng.randbytes(rng.randint(1, 8))
    elif kind == "insert":
        position = start + rng.randrange(span)
        payload[position:position] = rng.randbytes(rng.randint(1, 16))
    elif kind == "delete":
        position = start + rng.randrange(span)
        del payload[position : position + rng.randint(1, 8)]
    elif kind == "int":
        position = start + rng.randrange(span)
        width = rng.choice(["i16", "i32", "varint"])
        if width == "i16":
            raw = struct.pack(">h", rng.choice(EXTREME_INT16))
        elif width == "i32":
            raw = struct.pack(">i", rng.choice(EXTREME_INT32))
        else:
            raw = rng.choice(EXTREME_VARINTS)
        payload[position : position + len(raw)] = raw
    elif kind == "length":
        _mutate_a_length(payload, start, strings, rng)
    elif kind == "tail":
        payload += rng.randbytes(rng.randint(1, 64))
    elif kind == "size":
        wrong = rng.choice([len(payload) - 1, len(payload) + rng.randint(1, 100), 0, -1, 2**31 - 1])
        return SIZE.pack(wrong) + bytes(payload)
    return reframe(bytes(payload))


def _mutate_a_length(
    payload: bytearray, start: int, strings: list[bytes], rng: random.Random
) -> None:
    """Find a string the request carries and rewrite the length in front of it: a big-endian
    int16 (classic strings) or an unsigned varint of length + 1 (compact strings)."""
    candidates = [s for s in strings if s and bytes(payload).find(s, start) >= 0]
    if not candidates:
        position = start + rng.randrange(max(1, len(payload) - start))
        payload[position : position + 4] = struct.pack(">i", rng.choice(EXTREME_INT32))
        return
    text = rng.choice(candidates)
    at = bytes(payload).find(text, start)
    classic = at >= 2 and struct.unpack_from(">h", payload, at - 2)[0] == len(text)
    if classic:
        value = rng.choice([0x7FFF, -2, -1, len(text) + 1, len(text) - 1, 0])
        struct.pack_into(">h", payload, at - 2, value)
    elif at >= 1:
        replacement = rng.choice(
            [b"\xff\xff\xff\xff\x07", b"\x00", bytes([len(text) + 2]), bytes([len(text)])]
        )
        payload[at - 1 : at] = replacement


def fix_crc(batch: bytearray) -> None:
    if len(batch) >= HEADER_SIZE:
        struct.pack_into(">I", batch, 17, google_crc32c.value(bytes(batch[21:])))


def mutate_batch(batch: bytes, rng: random.Random) -> bytes:
    """A record batch damaged somewhere, with its CRC recomputed most of the time (so that the
    broker must look at the records to see what is wrong)."""
    data = bytearray(batch)
    for _ in range(rng.randint(1, 3)):
        if not data:
            break
        position = rng.randrange(len(data))
        roll = rng.random()
        if roll < 0.5:
            data[position] ^= 1 << rng.randrange(8)
        elif roll < 0.7:
            data[position : position + rng.randint(1, 6)] = rng.randbytes(rng.randint(0, 6))
        elif roll < 0.85:
            del data[position:]
        else:
            data[position:position] = rng.randbytes(rng.randint(1, 6))
    if len(data) >= 12:
        struct.pack_into(">i", data, 8, len(data) - 12)  # keep the framing, mostly
    if rng.random() < 0.85:
        fix_crc(data)
    return bytes(data)
