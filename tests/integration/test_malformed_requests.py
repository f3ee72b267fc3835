"""Malformed, oversized and hostile frames against a live broker, over raw sockets.

The contract (DESIGN.md section 6): a malformed or oversized frame closes that one connection
with a log line, and the broker keeps serving everyone else; a Produce whose batch fails its CRC
is answered CORRUPT_MESSAGE in a well-formed response and appends nothing.

`test_fuzzed_frames_close_only_their_connection` sends several hundred frames drawn from a seeded
RNG (the seed is printed; set ODRADEK_FUZZ_SEED to replay a run) while a well-behaved producer
writes with acks=all and a few connections sit on half-sent frames. Each kind of frame has an
expectation that is checked as it is sent:

| kind                      | what is sent                                            | expected |
|---------------------------|---------------------------------------------------------|----------|
| random bytes              | 1-64 random bytes, no framing                           | anything |
| huge / negative size      | a size prefix above socket.request.max.bytes, or < 0    | closed   |
| short frame               | a frame of 0-7 bytes: shorter than a request header     | closed   |
| bad client id             | client_id length past the frame's end, or below -1      | closed   |
| unknown api               | an api key the broker does not implement                | closed   |
| unsupported version       | an implemented api at a version outside its range       | closed   |
| ApiVersions, new version  | ApiVersions at a version above 3                        | v0 answer, UNSUPPORTED_VERSION, connection usable |
| truncated body            | a valid request cut short inside its body               | closed   |
| corrupted body            | a valid request with 1-3 bytes flipped (see below)      | answer or closed |
| garbage body              | a valid header, random body (see below)                 | answer or closed |
| bad CRC / garbage records | a Produce whose records fail validation                 | CORRUPT_MESSAGE (or INVALID_RECORD for garbage, as Kafka), nothing appended |
| pipelined                 | a valid request, then garbage on the same connection    | one answer, then closed |
| valid produce             | one good batch, once, somewhere in the stream           | appended |

Random and corrupted bodies go only to APIs that answer at once whatever a decodable body asks
(`GARBAGE_BODY_APIS`). The inter-broker APIs (LeaderAndIsr, StopReplica, UpdateMetadata,
ControlledShutdown) get only header-level abuse: as in Kafka they are fenced by epochs, not by
who sends them, so garbage that happened to decode could legitimately change the broker's state.
Produce and Fetch may legitimately not answer (acks=0, long polls), and a garbled CreateTopics
may legitimately ask for millions of partitions, which
`test_a_huge_create_topics_does_not_freeze_the_broker` covers on its own.

Afterwards the broker must still be alive and registered, serve a normal client, and hold exactly
the records produced before the fuzzing plus the one valid produce.
`test_many_connections_at_once` opens hundreds of connections together, a third of them hostile.

All use a private one-broker cluster with a small socket.request.max.bytes and topic
auto-creation off (a fuzzed Metadata request must not create topics).
"""

from __future__ import annotations

import os
import random
import select
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from odradek.protocol.codec import ApiKey, decode_response
from odradek.protocol.record_batch import build_batch, read_header
from odradek.server.apis import SUPPORTED_VERSIONS
from odradek.testing import LocalCluster
from tests.integration import _wire
from tests.integration._clients import (
    Rec,
    StreamingProducer,
    consume,
    create_topic,
    produce,
    unique_topic,
)

MAX_REQUEST_BYTES = 2_000_000
FRAMES = 400
ANSWER_TIMEOUT_S = 10.0
INTER_BROKER_APIS = {
    ApiKey.LEADER_AND_ISR,
    ApiKey.STOP_REPLICA,
    ApiKey.UPDATE_METADATA,
    ApiKey.CONTROLLED_SHUTDOWN,
}
# Client APIs that answer at once whatever a decodable body asks: no long polls (Fetch), no
# acks=0 (Produce), no CreateTopics (a garbled partition count is a legitimate request for
# millions of partitions: see test_a_huge_create_topics_does_not_freeze_the_broker).
GARBAGE_BODY_APIS = [
    ApiKey.API_VERSIONS,
    ApiKey.METADATA,
    ApiKey.LIST_OFFSETS,
    ApiKey.OFFSET_FOR_LEADER_EPOCH,
    ApiKey.DELETE_TOPICS,
]


def fuzz_seed() -> int:
    seed = int(os.environ.get("ODRADEK_FUZZ_SEED", random.SystemRandom().randrange(2**32)))
    print(f"fuzz seed {seed} (replay with ODRADEK_FUZZ_SEED={seed})")
    return seed


def private_cluster(make_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    return make_cluster(
        1,
        socket_request_max_bytes=MAX_REQUEST_BYTES,
        auto_create_topics_enable=False,
    )


def header(api_key: int, version: int, correlation_id: int, client_id: bytes | None) -> bytes:
    """The fixed part of a request header and the client id. For a flexible version the header
    continues with tagged fields, which a fuzzed body then supplies (or garbles)."""
    length = -1 if client_id is None else len(client_id)
    return _wire.HEADER_PREFIX.pack(api_key, version, correlation_id, length) + (client_id or b"")


def framed(payload: bytes) -> bytes:
    return _wire.SIZE.pack(len(payload)) + payload


def valid_requests(topic: str) -> list[tuple[int, int, dict[str, Any]]]:
    """(api key, version, values) of well-formed requests to cut or corrupt."""
    batch = build_batch([(b"key", b"value", [("h", b"v")], 1_700_000_000_000)])
    return [
        (ApiKey.METADATA, 9, {"topics": [{"name": topic}], "allow_auto_topic_creation": False}),
        (ApiKey.METADATA, 1, {"topics": [{"name": topic}]}),
        (ApiKey.API_VERSIONS, 3, {"client_software_name": "fuzz", "client_software_version": "1"}),
        (
            ApiKey.LIST_OFFSETS,
            5,
            {
                "replica_id": -1,
                "topics": [
                    {
                        "name": topic,
                        "partitions": [
                            {"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1}
                        ],
                    }
                ],
            },
        ),
        (ApiKey.PRODUCE, 8, _wire.produce_values(topic, 0, batch)),
        (
            ApiKey.CREATE_TOPICS,
            5,
            {
                "topics": [
                    {
                        "name": "fuzz-never-created",
                        "num_partitions": 1,
                        "replication_factor": 1,
                        "assignments": [],
                        "configs": [],
                    }
                ],
                "timeout": 1000,
                "validate_only": True,
            },
        ),
    ]


@dataclass
class Outcome:
    """What happened to one fuzzed connection."""

    closed: bool
    frames: list[bytes]
    timed_out: bool = False


def exchange(bootstrap: str, data: bytes, wait: bool, answers: int = 0) -> Outcome:
    """Send `data` on a new connection; with `wait`, read until the broker closes it, or has
    sent `answers` frames (0: any number), or ANSWER_TIMEOUT_S passes."""
    with _wire.WireConnection.to(bootstrap) as connection:
        if not connection.send_bytes(data):
            return Outcome(closed=True, frames=[])
        if not wait:
            return Outcome(closed=False, frames=[])
        frames: list[bytes] = []
        try:
            while not answers or len(frames) < answers:
                frames.append(connection.read_frame(ANSWER_TIMEOUT_S))
        except _wire.ConnectionClosed:
            return Outcome(closed=True, frames=frames)
        except _wire.NoAnswer:
            return Outcome(closed=False, frames=frames, timed_out=True)
        return Outcome(closed=False, frames=frames)


class Fuzzer:
    """Draws frames from a seeded RNG and checks each one's expectation (module docstring)."""

    def __init__(self, seed: int, bootstrap: str, topic: str) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.bootstrap = bootstrap
        self.topic = topic
        self.correlation_id = 1000
        self.counts: dict[str, int] = {}
        self.valid_produce_done = False
        self.kinds: list[Callable[[], None]] = [
            self.random_bytes,
            self.huge_size,
            self.negative_size,
            self.short_frame,
            self.bad_client_id,
            self.unknown_api,
            self.unsupported_version,
            self.api_versions_new_version,
            self.truncated_body,
            self.corrupted_body,
            self.garbage_body,
            self.bad_crc_produce,
            self.garbage_records_produce,
            self.pipelined,
        ]

    def next_correlation_id(self) -> int:
        self.correlation_id += 1
        return self.correlation_id

    def run(self, frames: int) -> None:
        valid_at = self.rng.randrange(frames)
        for number in range(frames):
            if number == valid_at:
                self.valid_produce()
            kind = self.rng.choice(self.kinds)
            self.counts[kind.__name__] = self.counts.get(kind.__name__, 0) + 1
            kind()

    def fail(self, what: str) -> AssertionError:
        return AssertionError(f"{what} (fuzz seed {self.seed})")

    def expect_closed(self, kind: str, data: bytes) -> None:
        outcome = exchange(self.bootstrap, data, wait=True)
        if not outcome.closed or outcome.frames:
            raise self.fail(f"{kind}: {data.hex()} left the connection {outcome}")

    def expect_answer_or_closed(self, kind: str, data: bytes, correlation_id: int) -> None:
        outcome = exchange(self.bootstrap, data, wait=True, answers=1)
        if outcome.timed_out:
            raise self.fail(f"{kind}: {data.hex()} neither answered nor closed")
        for frame in outcome.frames:
            (answered,) = struct.unpack_from(">i", frame)
            if answered != correlation_id:
                raise self.fail(f"{kind}: answer to correlation id {answered}")

    # -- the kinds --------------------------------------------------------------------------

    def random_bytes(self) -> None:
        exchange(self.bootstrap, self.rng.randbytes(self.rng.randint(1, 64)), wait=False)

    def huge_size(self) -> None:
        size = self.rng.randint(MAX_REQUEST_BYTES + 1, 2**31 - 1)
        tail = self.rng.randbytes(self.rng.randint(0, 16))
        self.expect_closed("huge size", _wire.SIZE.pack(size) + tail)

    def negative_size(self) -> None:
        size = self.rng.randint(-(2**31), -1)
        self.expect_closed("negative size", _wire.SIZE.pack(size) + self.rng.randbytes(8))

    def short_frame(self) -> None:
        self.expect_closed("short frame", framed(self.rng.randbytes(self.rng.randint(0, 7))))

    def bad_client_id(self) -> None:
        api_key, version = ApiKey.METADATA, 9
        if self.rng.random() < 0.5:
            length = self.rng.randint(5, 30_000)  # longer than what follows
            payload = _wire.HEADER_PREFIX.pack(api_key, version, 1, length) + b"abc"
        else:
            length = self.rng.randint(-(2**15), -2)
            payload = _wire.HEADER_PREFIX.pack(api_key, version, 1, length) + b"\0" * 8
        self.expect_closed("bad client id", framed(payload))

    def unknown_api(self) -> None:
        while (api_key := self.rng.randint(-(2**15), 2**15 - 1)) in SUPPORTED_VERSIONS:
            pass
        version = self.rng.randint(0, 20)
        body = self.rng.randbytes(self.rng.randint(0, 40))
        self.expect_closed("unknown api", framed(header(api_key, version, 1, b"fuzz") + body))

    def unsupported_version(self) -> None:
        api_key = self.rng.choice([k for k in SUPPORTED_VERSIONS if k != ApiKey.API_VERSIONS])
        low, high = SUPPORTED_VERSIONS[api_key]
        versions = [v for v in range(-3, high + 30) if not low <= v <= high]
        version = self.rng.choice(versions)
        body = self.rng.randbytes(self.rng.randint(0, 40))
        self.expect_closed(
            "unsupported version", framed(header(api_key, version, 1, b"fuzz") + body)
        )

    def api_versions_new_version(self) -> None:
        """KIP-511: a version the broker does not know is answered in v0 with
        UNSUPPORTED_VERSION and the supported ranges, and the client may retry on the same
        connection."""
        version = self.rng.randint(4, 2**15 - 1)
        correlation_id = self.next_correlation_id()
        data = _wire.raw_request_frame(ApiKey.API_VERSIONS, version, correlation_id)
        with _wire.WireConnection.to(self.bootstrap) as connection:
            connection.send_bytes(data)
            got, answer = decode_response(ApiKey.API_VERSIONS, 0, connection.read_frame())
            if got != correlation_id or answer.error_code != ErrorCode.unsupported_version:
                raise self.fail(f"ApiVersions v{version}: answered {got} {answer}")
            advertised = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
            if advertised != SUPPORTED_VERSIONS:
                raise self.fail(f"ApiVersions v{version} advertised {advertised}")
            retry = connection.request(ApiKey.API_VERSIONS, 3, {})
            if retry.error_code != ErrorCode.none:
                raise self.fail(f"ApiVersions v3 after v{version}: {retry}")

    def _encoded(self, corruptible_only: bool = False) -> tuple[int, bytes, int]:
        """A random valid request: (correlation id, framed bytes, where its body starts)."""
        candidates = valid_requests(self.topic)
        if corruptible_only:
            candidates = [r for r in candidates if r[0] in GARBAGE_BODY_APIS]
        api_key, version, values = self.rng.choice(candidates)
        correlation_id = self.next_correlation_id()
        data = _wire.request_frame(api_key, version, correlation_id, values)
        return correlation_id, data, _wire.body_start(api_key, version)

    def truncated_body(self) -> None:
        _, data, start = self._encoded()
        cut = self.rng.randint(start, len(data) - 1)  # at least one body byte missing
        self.expect_closed("truncated body", framed(data[4:cut]))

    def corrupted_body(self) -> None:
        # Not Produce or CreateTopics, for the reasons given at GARBAGE_BODY_APIS.
        correlation_id, data, start = self._encoded(corruptible_only=True)
        corrupted = bytearray(data)
        for _ in range(self.rng.randint(1, 3)):
            position = self.rng.randrange(start, len(corrupted))
            corrupted[position] ^= self.rng.randint(1, 255)
        self.expect_answer_or_closed("corrupted body", bytes(corrupted), correlation_id)

    def garbage_body(self) -> None:
        api_key = self.rng.choice(GARBAGE_BODY_APIS)
        low, high = SUPPORTED_VERSIONS[api_key]
        version = self.rng.randint(low, high)
        correlation_id = self.next_correlation_id()
        body = self.rng.randbytes(self.rng.randint(0, 80))
        data = framed(header(api_key, version, correlation_id, b"fuzz") + body)
        self.expect_answer_or_closed("garbage body", data, correlation_id)

    def _produce_rejected(
        self, kind: str, records: bytes, codes: tuple[ErrorCode, ...] = (ErrorCode.corrupt_message,)
    ) -> None:
        with _wire.WireConnection.to(self.bootstrap) as connection:
            answer = _wire.produce(connection, self.topic, 0, records)
        if answer.error_code not in codes:
            raise self.fail(f"{kind}: answered {answer}")

    def bad_crc_produce(self) -> None:
        count = self.rng.randint(1, 5)
        batch = bytearray(
            build_batch([(b"k", self.rng.randbytes(8), [], 1_700_000_000_000)] * count)
        )
        position = self.rng.randrange(17, len(batch))  # the CRC itself or what it covers
        batch[position] ^= self.rng.randint(1, 255)
        if read_header(batch).is_transactional:
            # The flip set the transactional bit: as in Kafka, that refuses the whole request
            # (no transactional id) before anyone looks at the CRC.
            codes = (ErrorCode.transactional_id_authorization_failed,)
        else:
            codes = (ErrorCode.corrupt_message,)
        self._produce_rejected("bad CRC", bytes(batch), codes)

    def garbage_records_produce(self) -> None:
        # As Kafka: CORRUPT_MESSAGE when what looks like a batch header is impossible,
        # INVALID_RECORD when there is no complete batch at all.
        self._produce_rejected(
            "garbage records",
            self.rng.randbytes(self.rng.randint(1, 200)),
            (ErrorCode.corrupt_message, ErrorCode.invalid_record),
        )

    def pipelined(self) -> None:
        correlation_id = self.next_correlation_id()
        valid = _wire.raw_request_frame(ApiKey.API_VERSIONS, 0, correlation_id)
        garbage = framed(header(-1, 0, 1, None) + self.rng.randbytes(10))
        outcome = exchange(self.bootstrap, valid + garbage, wait=True)
        answered = [struct.unpack_from(">i", f)[0] for f in outcome.frames]
        if not outcome.closed or answered != [correlation_id]:
            raise self.fail(f"pipelined: {outcome}")

    def valid_produce(self) -> None:
        batch = build_batch([(b"valid", b"mid-fuzz", [], 1_700_000_000_000)])
        with _wire.WireConnection.to(self.bootstrap) as connection:
            answer = _wire.produce(connection, self.topic, 0, batch)
        if answer.error_code != ErrorCode.none:
            raise self.fail(f"the valid produce failed: {answer}")
        self.valid_produce_done = True


def half_sent_frames(bootstrap: str, count: int) -> list[socket.socket]:
    """Connections that announce a frame and send only part of it, then go quiet."""
    sockets = []
    for i in range(count):
        sock = socket.create_connection(_address(bootstrap), timeout=10)
        sock.sendall(_wire.SIZE.pack(100 + i) + b"\0\x12\0\0")
        sockets.append(sock)
    return sockets


def _address(bootstrap: str) -> tuple[str, int]:
    host, _, port = bootstrap.rpartition(":")
    return host, int(port)


def test_fuzzed_frames_close_only_their_connection(make_cluster: Any):
    seed = fuzz_seed()
    cluster = private_cluster(make_cluster)
    bootstrap = cluster.broker(1).bootstrap
    topic, steady = unique_topic("fuzz-target"), unique_topic("fuzz-steady")
    for name in (topic, steady):
        create_topic(cluster.bootstrap_servers, name, replication_factor=1)
    before = [
        Rec(f"k{i}".encode(), f"before-{i}".encode(), (("h", b"1"),), 1_700_000_000_000 + i)
        for i in range(50)
    ]
    assert produce("confluent", bootstrap, topic, 0, before) == list(range(50))

    producer = StreamingProducer(bootstrap, steady, acks=-1)
    producer.start()
    idle = half_sent_frames(bootstrap, 20)
    fuzzer = Fuzzer(seed, bootstrap, topic)
    try:
        acknowledged_before = producer.acknowledged_count()
        fuzzer.run(FRAMES)
        acknowledged_during = producer.acknowledged_count() - acknowledged_before
    finally:
        for sock in idle:
            sock.close()
        unreported = producer.stop(timeout=60)
    print(f"frames by kind: {fuzzer.counts}")

    # The well-behaved producer was not disturbed: it kept writing, nothing failed, no gaps.
    assert unreported == 0
    assert producer.failed == []
    assert acknowledged_during > 0
    assert [o for o, _ in producer.acknowledged] == list(range(len(producer.acknowledged)))

    # The broker is alive, registered, and serves a normal client.
    assert cluster.is_alive(1)
    assert cluster.registered_brokers() == [1]
    assert fuzzer.valid_produce_done
    assert _wire.log_end_offset(bootstrap, topic) == 51  # 50 before, plus the one valid produce
    consumed = consume("confluent", bootstrap, topic, 0, 0, 51)
    assert [c.offset for c in consumed] == list(range(51))
    assert all(c.matches(r) for c, r in zip(consumed, before, strict=False))
    assert (consumed[50].key, consumed[50].value) == (b"valid", b"mid-fuzz")
    steady_end = _wire.log_end_offset(bootstrap, steady)
    assert steady_end == len(producer.acknowledged)
    after = Rec(b"after", b"fuzzing", (), 1_700_000_000_000)
    assert produce("confluent", bootstrap, topic, 0, [after]) == [51]
    # Each closed connection was logged (DESIGN.md: "closes that connection with a log line").
    assert "closing connection from" in cluster.broker(1).log.read_text()


def test_many_connections_at_once(make_cluster: Any):
    cluster = private_cluster(make_cluster)
    bootstrap = cluster.broker(1).bootstrap
    topic = unique_topic("crowd")
    create_topic(cluster.bootstrap_servers, topic, replication_factor=1)
    rng = random.Random(fuzz_seed())

    # 300 well-behaved and 150 hostile connections, all open at the same time, requests sent
    # before any answer is read.
    good: list[tuple[_wire.WireConnection, int]] = []
    bad: list[_wire.WireConnection] = []
    try:
        for i in range(450):
            connection = _wire.WireConnection.to(bootstrap)
            if i % 3 == 2:
                connection.send_bytes(_wire.SIZE.pack(-1) + rng.randbytes(20))
                bad.append(connection)
            else:
                correlation_id, data = connection.encode(ApiKey.API_VERSIONS, 3, {})
                connection.send_bytes(data)
                good.append((connection, correlation_id))
        for connection, correlation_id in good:
            answer = connection.read_response(ApiKey.API_VERSIONS, 3, correlation_id)
            assert answer.error_code == ErrorCode.none
        for connection in bad:
            assert connection.wait_closed() == []
        # The good connections stay usable: a produce on each of the first 20.
        for number, (connection, _) in enumerate(good[:20]):
            batch = build_batch([(b"k", f"crowd-{number}".encode(), [], 1_700_000_000_000)])
            assert _wire.produce(connection, topic, 0, batch).base_offset == number
    finally:
        for connection in [c for c, _ in good] + bad:
            connection.close()
    assert _wire.log_end_offset(bootstrap, topic) == 20


def test_a_huge_create_topics_does_not_freeze_the_broker(make_cluster: Any):
    cluster = private_cluster(make_cluster)
    bootstrap = cluster.broker(1).bootstrap
    huge = _wire.request_frame(
        ApiKey.CREATE_TOPICS,
        5,
        1,
        {
            "topics": [
                {
                    "name": unique_topic("huge"),
                    "num_partitions": 3_000_000,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [],
                }
            ],
            "timeout": 30_000,
            "validate_only": True,
        },
    )
    with _wire.WireConnection.to(bootstrap) as hostile, _wire.WireConnection.to(bootstrap) as other:
        assert _wire.cluster_view(bootstrap)[0] == 1  # both connections are served now
        hostile.send_bytes(huge)
        slowest = 0.0
        deadline = time.monotonic() + 20
        # Until the big request is answered: every Metadata on the other connection is quick.
        while time.monotonic() < deadline and not select.select([hostile.sock], [], [], 0)[0]:
            started = time.monotonic()
            other.request(ApiKey.METADATA, 9, {"topics": [], "allow_auto_topic_creation": False})
            slowest = max(slowest, time.monotonic() - started)
    assert slowest < 2.0, f"a Metadata request waited {slowest:.1f}s behind the CreateTopics"
