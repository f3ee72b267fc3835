"""Regression tests for what the protocol fuzzer found, each named after the bug.

1. A compact array whose length claims about four billion elements made kio's native reader
   allocate tens of gigabytes before reading any element; the allocation failed and Rust aborted
   the broker process. A 49-byte OffsetFetch v7 did it (seed 7, frame 2381).
2. A null (length 0 / -1) array in a field Kafka's schemas never allow to be null reached the
   handlers as None, which raised TypeError: the connection was closed as an internal error
   (AlterPartitionReassignments, ListPartitionReassignments, OffsetForLeaderEpoch, ListOffsets,
   LeaveGroup, FindCoordinator, SyncGroup, DeleteGroups, Fetch ...). Kafka's parser refuses such a
   request as malformed, and so does Odradek now.
3. DeleteTopics (and the config and partition APIs) with a name ZooKeeper refuses as a path ("."
   or one holding a NUL) raised ZooKeeper's BadArguments as an internal error; an illegal name
   names no topic: UNKNOWN_TOPIC_OR_PARTITION.
4. CreatePartitions (even validate-only) asking for 134 million partitions made the broker
   compute their assignment on its event loop, which answered nothing else for longer than the
   fuzzer's 20 seconds; CreateTopics already refused more replicas than an assignment znode holds,
   and now CreatePartitions does too (INVALID_PARTITIONS).
"""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from odradek.protocol.codec import ApiKey
from tests.integration import _wire

# frame 2381 of seed 7: OffsetFetch v7, group "fz-group-2", one topic "fz-absent" whose
# partition_indexes compact array claims 0x0D305FFF7F - 1 elements.
FOUR_BILLION_ELEMENTS = bytes.fromhex(
    "0000002d00090007 0000094d 0004 66757a7a 00"
    "0b 667a2d67726f75702d32 02 0a 667a2d616273656e74 ffffc9c134 00 00 00".replace(" ", "")
)


def test_decoding_a_compact_array_of_four_billion_elements_does_not_abort() -> None:
    """Checked in a child process: before the fix, the decode aborted the interpreter."""
    code = (
        "from odradek.protocol.codec import ProtocolError, decode_request_body, "
        "parse_request_header\n"
        f"frame = bytes.fromhex({FOUR_BILLION_ELEMENTS[4:].hex()!r})\n"
        "try:\n"
        "    decode_request_body(parse_request_header(frame), frame)\n"
        "except ProtocolError as e:\n"
        "    print('refused:', e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "an array claims more elements than there are bytes left" in done.stdout


def broker(make_cluster: Any) -> Any:
    return make_cluster(1, auto_create_topics_enable=False).broker(1)


def no_internal_error(broker: Any) -> None:
    """The broker refused the request as malformed, not by failing inside a handler."""
    text = broker.log.read_text()
    assert "internal error" not in text and "Traceback" not in text


def closed(bootstrap: str, frame: bytes) -> bool:
    with _wire.WireConnection.to(bootstrap) as connection:
        connection.send_bytes(frame)
        return connection.wait_closed() == []


def test_a_compact_array_claiming_four_billion_elements_closes_only_its_connection(
    make_cluster: Any,
) -> None:
    server = broker(make_cluster)
    assert closed(server.bootstrap, FOUR_BILLION_ELEMENTS)
    assert _wire.cluster_view(server.bootstrap)[0] == 1  # alive, the controller, answering
    assert "an array claims more elements than there are bytes left" in server.log.read_text()


def null_array_frames() -> list[tuple[str, bytes]]:
    """Requests whose non-nullable arrays are null (compact length 0 / classic length -1)."""
    frames = []

    def flexible(api: int, version: int, body: bytes) -> bytes:
        header = struct.pack(">hhih", api, version, 1, 4) + b"fuzz" + b"\x00"
        return _wire.SIZE.pack(len(header) + len(body)) + header + body

    def classic(api: int, version: int, body: bytes) -> bytes:
        header = struct.pack(">hhih", api, version, 1, 4) + b"fuzz"
        return _wire.SIZE.pack(len(header) + len(body)) + header + body

    # AlterPartitionReassignments v0: timeout, topics [name "t", partitions = null]
    frames.append(
        (
            "AlterPartitionReassignments",
            flexible(45, 0, struct.pack(">i", 100) + b"\x02\x02t\x00\x00\x00"),
        )
    )
    # ListPartitionReassignments v0: timeout, topics [name "t", partition_indexes = null]
    frames.append(
        (
            "ListPartitionReassignments",
            flexible(46, 0, struct.pack(">i", 100) + b"\x02\x02t\x00\x00\x00"),
        )
    )
    # OffsetForLeaderEpoch v2 (classic): topics [topic "t", partitions = null]
    frames.append(
        (
            "OffsetForLeaderEpoch",
            classic(23, 2, struct.pack(">ih", 1, 1) + b"t" + struct.pack(">i", -1)),
        )
    )
    # ListOffsets v1 (classic): replica_id, topics [name "t", partitions = null]
    frames.append(
        ("ListOffsets", classic(2, 1, struct.pack(">iih", -1, 1, 1) + b"t" + struct.pack(">i", -1)))
    )
    # DeleteGroups v0 (classic): groups_names = null
    frames.append(("DeleteGroups", classic(42, 0, struct.pack(">i", -1))))
    return frames


@pytest.mark.parametrize("name", [n for n, _ in null_array_frames()])
def test_a_null_array_where_kafka_never_allows_null_closes_the_connection(
    make_cluster: Any, name: str
) -> None:
    server = broker(make_cluster)
    frame = dict(null_array_frames())[name]
    assert closed(server.bootstrap, frame)
    assert _wire.cluster_view(server.bootstrap)[0] == 1
    assert "is null" in server.log.read_text()
    no_internal_error(server)


@pytest.mark.parametrize("name", [".", "fuzz-ta\x00get", "a/b", "..", "x" * 300])
def test_delete_topics_with_a_name_zookeeper_refuses_answers_unknown_topic(
    make_cluster: Any, name: str
) -> None:
    server = broker(make_cluster)
    with _wire.WireConnection.to(server.bootstrap) as connection:
        response = connection.request(
            ApiKey.DELETE_TOPICS, 4, {"topic_names": [name], "timeout": 1000}
        )
    (result,) = response.responses
    assert result.error_code == ErrorCode.unknown_topic_or_partition
    no_internal_error(server)


def test_create_partitions_asking_for_134_million_is_refused_promptly(make_cluster: Any) -> None:
    server = broker(make_cluster)
    from tests.integration._clients import create_topic

    create_topic(server.bootstrap, "grown", replication_factor=1)
    started = time.monotonic()
    with _wire.WireConnection.to(server.bootstrap) as connection:
        response = connection.request(
            ApiKey.CREATE_PARTITIONS,
            3,
            {
                "topics": [{"name": "grown", "count": 134_217_730, "assignments": None}],
                "timeout": 1000,
                "validate_only": True,
            },
        )
    (result,) = response.results
    assert result.error_code == ErrorCode.invalid_partitions
    assert time.monotonic() - started < 5
