"""The fast read's in-place Fetch v11 reader (`spark.fetch_response`) agrees with kio's decoder on
responses the broker's encoder writes, refuses truncated frames, and `_arrow.Columns.take()`
hands buffers over that stay intact while the next chunk is decoded."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from odradek.protocol._arrow import Buffer, Columns

from odradek.protocol.codec import ApiKey, ProtocolError, decode_response
from odradek.protocol.fetch_response import PartitionAnswer, TopicAnswer, encode_fetch_response
from odradek.spark.fetch_response import read_fetch_partition

partitions = st.lists(
    st.builds(
        PartitionAnswer,
        st.integers(0, 5),
        st.sampled_from([0, 1, 6]),
        st.integers(-1, 2**40),
        st.integers(-1, 2**40),
        st.one_of(st.none(), st.binary(max_size=300)),
        st.integers(-1, 2**40),
        st.one_of(
            st.none(),
            st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**40)), max_size=3),
        ),
    ),
    max_size=4,
)
topics = st.lists(
    st.builds(TopicAnswer, st.sampled_from(["a", "b", "topic-1"]), st.uuids(), partitions),
    max_size=3,
)


def _body(error: int, answer: list[TopicAnswer]) -> bytes:
    frame = b"".join(encode_fetch_response(11, 7, error, 0, answer))  # type: ignore[arg-type]
    return frame[8:]  # size prefix and correlation id


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([0, 70]), topics, st.sampled_from(["a", "b", "c"]), st.integers(0, 5))
def test_reads_what_kio_decodes(
    error: int, answer: list[TopicAnswer], topic: str, partition: int
) -> None:
    body = _body(error, answer)
    _, response = decode_response(ApiKey.FETCH, 11, b"\0\0\0\7" + body)
    expected = next(
        (
            p
            for t in response.responses
            if t.topic == topic
            for p in t.partitions
            if p.partition_index == partition
        ),
        None,
    )
    got_error, got = read_fetch_partition(memoryview(body).toreadonly(), topic, partition)
    assert got_error == response.error_code == error
    if expected is None:
        assert got is None
        return
    assert got is not None
    assert got.error_code == expected.error_code
    assert got.high_watermark == expected.high_watermark
    assert got.last_stable_offset == expected.last_stable_offset
    assert got.log_start_offset == expected.log_start_offset
    assert got.aborted_transactions == [
        (a.producer_id, a.first_offset) for a in (expected.aborted_transactions or ())
    ]
    assert (None if got.records is None else bytes(got.records)) == expected.records


def test_truncated_frames_are_refused() -> None:
    answer = [TopicAnswer("a", None, [PartitionAnswer(0, 0, 10, 0, b"r" * 100, 10, [(1, 2)])])]  # type: ignore[arg-type]
    body = _body(0, answer)
    assert read_fetch_partition(memoryview(body), "a", 0)[1] is not None
    for end in (0, 5, 11, 20, len(body) - 101, len(body) - 1):
        with pytest.raises(ProtocolError):
            read_fetch_partition(memoryview(body)[:end], "a", 0)
    # A records length past the end of the frame.
    bad = body[:-104] + struct.pack(">i", 1000) + body[-100:]
    with pytest.raises(ProtocolError):
        read_fetch_partition(memoryview(bad), "a", 0)


def test_taken_buffers_are_handed_over_and_survive_the_next_chunk() -> None:
    columns = Columns()
    first = columns.take()
    assert first[0] == 0 and isinstance(first[1][1], Buffer)
    data = first[1][0]
    assert bytes(memoryview(data)) == b"\0\0\0\0" and len(data) == 4
    with pytest.raises(TypeError):
        memoryview(data)[0:1] = b"x"  # read-only
    # Two takes in a row: the second's buffers are new memory, the first's are unchanged.
    again = columns.take()
    assert bytes(memoryview(again[1][0])) == b"\0\0\0\0"
    assert memoryview(data).tobytes() == b"\0\0\0\0"
