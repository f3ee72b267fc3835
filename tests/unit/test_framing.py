"""The sans-I/O request path without sockets: the frame decoder and the request-header parser fed
whole, byte by byte, and in random splits (TCP delivers a stream, not messages)."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odradek.protocol.codec import ApiKey, ProtocolError, RequestHeader, parse_request_header
from odradek.protocol.framing import FrameDecoder, FrameTooLargeError, frame

MAX_FRAME = 1024

payloads = st.lists(st.binary(max_size=300), max_size=8)


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` cut at the given positions (taken modulo its length, deduplicated)."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def feed_all(decoder: FrameDecoder, pieces: list[bytes]) -> list[bytes]:
    frames: list[bytes] = []
    for piece in pieces:
        frames.extend(decoder.feed(piece))
    return frames


# --- frames -------------------------------------------------------------------------------------


@given(payloads)
def test_frames_fed_whole(messages: list[bytes]) -> None:
    decoder = FrameDecoder(MAX_FRAME)
    assert decoder.feed(b"".join(frame(m) for m in messages)) == messages
    assert decoder.buffered == 0


@given(payloads)
def test_frames_fed_byte_by_byte(messages: list[bytes]) -> None:
    stream = b"".join(frame(m) for m in messages)
    decoder = FrameDecoder(MAX_FRAME)
    assert feed_all(decoder, [stream[i : i + 1] for i in range(len(stream))]) == messages
    assert decoder.buffered == 0


@given(payloads, st.lists(st.integers(min_value=0), max_size=20))
def test_frames_fed_in_random_splits(messages: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frame(m) for m in messages)
    decoder = FrameDecoder(MAX_FRAME)
    assert feed_all(decoder, split_at(stream, cuts)) == messages
    assert decoder.buffered == 0


@given(st.binary(min_size=1, max_size=300), st.integers(min_value=1))
def test_an_incomplete_frame_waits_for_the_rest(payload: bytes, cut: int) -> None:
    data = frame(payload)
    cut = cut % (len(data) - 1) + 1  # 1 .. len-1: never the whole frame
    decoder = FrameDecoder(MAX_FRAME)
    assert decoder.feed(data[:cut]) == []
    assert decoder.feed(data[cut:]) == [payload]


def test_frames_are_bytes_not_bytearrays() -> None:
    (received,) = FrameDecoder(MAX_FRAME).feed(frame(b"abc"))
    assert type(received) is bytes


@pytest.mark.parametrize("size", [MAX_FRAME + 1, 2**31 - 1, -1, -(2**31)])
def test_a_size_outside_the_limit_is_refused_even_split(size: int) -> None:
    prefix = struct.pack(">i", size)
    decoder = FrameDecoder(MAX_FRAME)
    assert decoder.feed(prefix[:2]) == []
    with pytest.raises(FrameTooLargeError):
        decoder.feed(prefix[2:] + b"x")


def test_the_largest_allowed_frame_passes() -> None:
    assert FrameDecoder(MAX_FRAME).feed(frame(b"x" * MAX_FRAME)) == [b"x" * MAX_FRAME]


def test_frames_before_an_oversized_one_are_not_lost() -> None:
    decoder = FrameDecoder(MAX_FRAME)
    assert decoder.feed(frame(b"ok")) == [b"ok"]
    with pytest.raises(FrameTooLargeError):
        decoder.feed(struct.pack(">i", MAX_FRAME + 1))


# --- request headers ------------------------------------------------------------------------------

# (api key, version): header v1 for the first two (non-flexible), v2 for the others.
NON_FLEXIBLE = [(ApiKey.PRODUCE, 3), (ApiKey.METADATA, 8)]
FLEXIBLE = [(ApiKey.METADATA, 12), (ApiKey.API_VERSIONS, 3), (ApiKey.LEADER_AND_ISR, 5)]

client_ids = st.one_of(st.none(), st.text(max_size=40))
tagged_fields = st.lists(
    st.tuples(st.integers(min_value=0, max_value=2**20), st.binary(max_size=40)), max_size=3
)


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def header_bytes(
    api_key: int,
    version: int,
    correlation_id: int,
    client_id: str | None,
    tags: list[tuple[int, bytes]] | None,
) -> bytes:
    """A request header as Kafka writes it: v1 (no tags) or v2 (`tags` is not None)."""
    if client_id is None:
        data = struct.pack(">hhih", api_key, version, correlation_id, -1)
    else:
        encoded = client_id.encode()
        data = struct.pack(">hhih", api_key, version, correlation_id, len(encoded)) + encoded
    if tags is not None:
        data += uvarint(len(tags))
        for tag, value in tags:
            data += uvarint(tag) + uvarint(len(value)) + value
    return data


headers = st.one_of(
    st.tuples(st.sampled_from(NON_FLEXIBLE), st.just(None)),
    st.tuples(st.sampled_from(FLEXIBLE), tagged_fields),
)


@given(
    headers,
    st.integers(min_value=-(2**31), max_value=2**31 - 1),
    client_ids,
    st.binary(max_size=50),
)
def test_request_headers_parse(
    api: tuple[tuple[int, int], list[tuple[int, bytes]] | None],
    correlation_id: int,
    client_id: str | None,
    body: bytes,
) -> None:
    (api_key, version), tags = api
    head = header_bytes(api_key, version, correlation_id, client_id, tags)
    parsed = parse_request_header(head + body)
    assert parsed == RequestHeader(api_key, version, correlation_id, client_id, len(head))


@settings(max_examples=50)
@given(headers, client_ids, st.binary(max_size=50), st.lists(st.integers(min_value=0), max_size=12))
def test_request_headers_through_the_decoder_in_random_splits(
    api: tuple[tuple[int, int], list[tuple[int, bytes]] | None],
    client_id: str | None,
    body: bytes,
    cuts: list[int],
) -> None:
    """Three pipelined requests arriving in arbitrary pieces, and byte by byte, parse as sent."""
    (api_key, version), tags = api
    requests = [
        header_bytes(api_key, version, correlation_id, client_id, tags) + body
        for correlation_id in (1, 2, 3)
    ]
    stream = b"".join(frame(r) for r in requests)
    for pieces in (split_at(stream, cuts), [stream[i : i + 1] for i in range(len(stream))]):
        received = feed_all(FrameDecoder(MAX_FRAME), pieces)
        assert [parse_request_header(r).correlation_id for r in received] == [1, 2, 3]
        assert all(parse_request_header(r).client_id == client_id for r in received)


@given(headers, client_ids)
def test_every_truncated_header_is_a_protocol_error(
    api: tuple[tuple[int, int], list[tuple[int, bytes]] | None], client_id: str | None
) -> None:
    (api_key, version), tags = api
    head = header_bytes(api_key, version, 7, client_id, tags)
    for end in range(len(head)):
        with pytest.raises(ProtocolError):
            parse_request_header(head[:end])


def test_a_client_id_that_is_not_utf8_is_a_protocol_error() -> None:
    head = struct.pack(">hhih", ApiKey.METADATA, 8, 1, 2) + b"\xff\xfe"
    with pytest.raises(ProtocolError):
        parse_request_header(head)


def test_an_invalid_client_id_length_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        parse_request_header(struct.pack(">hhih", ApiKey.METADATA, 8, 1, -2))


def test_an_unknown_version_still_yields_the_header() -> None:
    """ApiVersions of a version nobody describes is answered (KIP-511), so the header parses."""
    head = header_bytes(ApiKey.API_VERSIONS, 99, 5, "c", None)
    assert parse_request_header(head) == RequestHeader(ApiKey.API_VERSIONS, 99, 5, "c", len(head))


def test_a_read_that_is_all_frame_body_is_kept_not_copied() -> None:
    body = bytes(range(256)) * 4096  # 1 MiB, arriving in three reads
    data = frame(body)
    middle = data[1000:500_000]
    decoder = FrameDecoder(len(body))
    assert decoder.feed(data[:1000]) == []
    assert decoder.feed(middle) == []
    assert decoder._pieces[-1] is middle
    assert decoder.buffered == 500_000 - 4
    assert decoder.feed(data[500_000:]) == [body]
    assert decoder.buffered == 0 and decoder.pending_frame_size == -1


def test_a_frame_inside_one_read_comes_back_as_bytes_from_any_buffer() -> None:
    stream = frame(b"one") + frame(b"") + frame(b"three")
    for data in (stream, bytearray(stream), memoryview(stream)):
        frames = FrameDecoder(MAX_FRAME).feed(data)  # type: ignore[arg-type]
        assert frames == [b"one", b"", b"three"]
        assert all(type(f) is bytes for f in frames)


def test_a_frame_trickled_in_tiny_reads_is_held_in_one_buffer() -> None:
    # A hostile client sending a large frame a byte at a time must not make the decoder hold an
    # object per read: the small pieces are gathered (memory stays about the frame's size).
    body = bytes(range(256)) * 64
    data = frame(body)
    decoder = FrameDecoder(len(body))
    for i in range(len(data) - 1):
        assert decoder.feed(data[i : i + 1]) == []
    assert len(decoder._pieces) == 1
    assert decoder.feed(data[-1:]) == [body]
