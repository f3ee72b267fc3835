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


class FrameError(OdradekError):
    """The byte stream is not valid Kafka framing; the connection must be closed."""


class FrameTooLargeError(FrameError):
    pass


class FrameDecoder:
    """Splits a byte stream into frames.

    Not thread-safe: owned by one connection. Frames are returned as `bytes` (kio's native reader wants
    `bytes` or a read-only memoryview, never a bytearray).
    """

    __slots__ = ("_buffer", "_max_frame_bytes", "_needed")

    def __init__(self, max_frame_bytes: int) -> None:
        self._buffer = bytearray()
        self._max_frame_bytes = max_frame_bytes
        self._needed = -1  # size of the frame being assembled, -1 while its size is unknown

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; return every frame completed by them, in order."""
        buffer = self._buffer
        buffer += data
        frames: list[bytes] = []
        position = 0
        available = len(buffer)
        while True:
            if self._needed < 0:
                if available - position < 4:
                    break
                (size,) = SIZE.unpack_from(buffer, position)
                if size < 0 or size > self._max_frame_bytes:
                    raise FrameTooLargeError(
                        f"frame of {size} bytes is outside 0..{self._max_frame_bytes}"
                        " (socket.request.max.bytes)"
                    )
                self._needed = size
                position += 4
            if available - position < self._needed:
                break
            end = position + self._needed
            frames.append(bytes(buffer[position:end]))
            position = end
            self._needed = -1
        if position:
            del buffer[:position]
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buffer)

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
