"""Kafka's framing: every request and response is a 4-byte big-endian size followed by that many bytes.

Sans-I/O: `FrameDecoder` is fed whatever bytes arrive on a socket and hands back complete frames; the
connection that owns it does the reading and writing. A size that is negative or above the configured
maximum (`socket.request.max.bytes`) is a protocol violation: the decoder raises `FrameTooLargeError`
and the connection is closed — the only safe reaction, since the stream can no longer be re-synchronised.
"""

from __future__ import annotations

import struct

from odradek.errors import OdradekError

SIZE = struct.Struct(">i")
_LARGE_PIECE = 1 << 16  # a frame's piece kept as its own object from this size (`_keep`)


class FrameError(OdradekError):
    """The byte stream is not valid Kafka framing; the connection must be closed."""


class FrameTooLargeError(FrameError):
    pass


class FrameDecoder:
    """Splits a byte stream into frames.

    Not thread-safe: owned by one connection. Frames are returned as `bytes` (kio's native reader wants
    `bytes` or a read-only memoryview, never a bytearray). Each frame's bytes are copied once: a
    frame inside one read is a slice of it, a frame spread over reads is the join of its pieces (a
    read that is all frame body is kept as it is, not copied) — large produce requests arrive in
    many reads, and the copies were a third of the broker's time producing 1 KB records.
    """

    __slots__ = ("_have", "_max_frame_bytes", "_needed", "_pieces")

    def __init__(self, max_frame_bytes: int) -> None:
        # the frame (or size prefix) being assembled: large reads as they came, small ones gathered
        self._pieces: list[bytes | bytearray] = []
        self._have = 0  # bytes in _pieces
        self._max_frame_bytes = max_frame_bytes
        self._needed = -1  # size of the frame being assembled, -1 while its size is unknown

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; return every frame completed by them, in order."""
        if type(data) is not bytes:
            data = bytes(data)
        frames: list[bytes] = []
        pieces = self._pieces
        position = 0
        length = len(data)
        while position < length:
            if self._needed < 0:
                if not self._have and length - position >= 4:
                    (size,) = SIZE.unpack_from(data, position)
                    position += 4
                else:
                    take = min(4 - self._have, length - position)
                    self._keep(data, position, take)
                    self._have += take
                    position += take
                    if self._have < 4:
                        break
                    (size,) = SIZE.unpack(b"".join(pieces))
                    pieces.clear()
                    self._have = 0
                if size < 0 or size > self._max_frame_bytes:
                    raise FrameTooLargeError(
                        f"frame of {size} bytes is outside 0..{self._max_frame_bytes}"
                        " (socket.request.max.bytes)"
                    )
                self._needed = size
            needed = self._needed
            available = length - position
            if not self._have and available >= needed:
                frames.append(data[position : position + needed])
                position += needed
                self._needed = -1
                continue
            if not available:
                break
            take = min(needed - self._have, available)
            self._keep(data, position, take)
            self._have += take
            position += take
            if self._have < needed:
                break
            frames.append(b"".join(pieces))
            pieces.clear()
            self._have = 0
            self._needed = -1
        return frames

    def _keep(self, data: bytes, position: int, take: int) -> None:
        """Hold `take` bytes of `data` from `position` as part of the frame being assembled. A
        large piece is kept as its own bytes (the read itself when it is all frame body); small
        ones are gathered into one bytearray, so that a client trickling a frame in tiny reads
        cannot make the decoder hold an object per read (tens of bytes of overhead for each)."""
        pieces = self._pieces
        if take >= _LARGE_PIECE:
            pieces.append(data if take == len(data) else data[position : position + take])
        elif pieces and type(pieces[-1]) is bytearray:
            pieces[-1] += memoryview(data)[position : position + take]
        else:
            pieces.append(bytearray(memoryview(data)[position : position + take]))

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as part of a frame."""
        return self._have

    @property
    def max_frame_bytes(self) -> int:
        return self._max_frame_bytes

    @max_frame_bytes.setter
    def max_frame_bytes(self, value: int) -> None:
        """Change the bound for frames whose size is read from now on (a SASL connection is
        capped at `sasl.server.max.receive.size` until it has authenticated)."""
        self._max_frame_bytes = value

    @property
    def pending_frame_size(self) -> int:
        """The size of the frame being assembled (its size prefix has been read), or -1."""
        return self._needed


def frame(payload: bytes) -> bytes:
    """Prefix a payload with its size."""
    return SIZE.pack(len(payload)) + payload
