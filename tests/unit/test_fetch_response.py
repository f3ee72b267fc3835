"""The parts encoder of Fetch responses agrees byte for byte with kio's encoder, v4-v15 (last
stable offsets and aborted transactions included)."""

from __future__ import annotations

import os
import tempfile
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from odradek.protocol.build import build_response
from odradek.protocol.codec import ApiKey, RequestHeader, encode_response
from odradek.protocol.fetch_response import (
    FileRecords,
    PartitionAnswer,
    TopicAnswer,
    encode_fetch_response,
)

partitions = st.lists(
    st.builds(
        PartitionAnswer,
        st.integers(0, 1000),
        st.sampled_from([0, 1, 3, 6, 100]),
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
    st.builds(TopicAnswer, st.text("abc-_.", min_size=1, max_size=20), st.uuids(), partitions),
    max_size=4,
)


def kio_bytes(version: int, correlation_id: int, error: int, session: int, answer: list) -> bytes:
    header = RequestHeader(ApiKey.FETCH, version, correlation_id, "c", 0)
    response = build_response(
        header,
        {
            "throttle_time": 0,
            "error_code": error,
            "session_id": session,
            "responses": [
                {
                    "topic": t.name,
                    "topic_id": t.topic_id,
                    "partitions": [
                        {
                            "partition_index": p.index,
                            "error_code": p.error_code,
                            "high_watermark": p.high_watermark,
                            "last_stable_offset": (
                                p.last_stable_offset
                                if p.last_stable_offset >= 0
                                else p.high_watermark
                            ),
                            "log_start_offset": p.log_start_offset,
                            "aborted_transactions": (
                                None
                                if p.aborted_transactions is None
                                else [
                                    {"producer_id": pid, "first_offset": first}
                                    for pid, first in p.aborted_transactions
                                ]
                            ),
                            "preferred_read_replica": -1,
                            "records": p.records,
                        }
                        for p in t.partitions
                    ],
                }
                for t in answer
            ],
        },
    )
    return encode_response(header, response)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(4, 15),
    st.integers(0, 2**31 - 1),
    st.sampled_from([0, 70, 71]),
    st.integers(0, 2**31 - 1),
    topics,
)
def test_parts_encoder_matches_kio(
    version: int, correlation_id: int, error: int, session: int, answer: list[TopicAnswer]
) -> None:
    parts = encode_fetch_response(version, correlation_id, error, session, answer)
    assert b"".join(parts) == kio_bytes(version, correlation_id, error, session, answer)  # type: ignore[arg-type]


def test_file_records_stay_parts_and_read_back() -> None:
    with tempfile.TemporaryFile() as f:
        f.write(b"x" * 10 + b"RECORDS" + b"y" * 10)
        f.flush()
        records = FileRecords(f.fileno(), 10, 7)
        answer = [TopicAnswer("t", uuid.uuid4(), [PartitionAnswer(0, 0, 5, 0, records)])]
        for version in (4, 12, 15):
            parts = encode_fetch_response(version, 9, 0, 0, answer)
            assert records in parts
            joined = b"".join(p.read() if isinstance(p, FileRecords) else p for p in parts)
            inline = [
                TopicAnswer("t", answer[0].topic_id, [PartitionAnswer(0, 0, 5, 0, b"RECORDS")])
            ]
            assert joined == kio_bytes(version, 9, 0, 0, inline)
        assert os.pread(f.fileno(), 7, 10) == records.read()
