"""Fuzzed frames: what to send, whether it is safe to send, and what the broker must do with it.

`make_frame(seed, index, names)` derives frame number `index` of a run from the run's seed alone
(its own `random.Random(f"{seed}:{index}")`), so any frame can be rebuilt from the two numbers a
failure report prints. A frame is a random valid request of a random API and version the broker
advertises (`generate.py`), mutated (`mutate.py`); Produce requests also get mutated record
batches. Then the frame is decoded locally with the broker's own codec, which decides two things:

Safety. Some requests that decode are legitimately destructive and would change what the test
checks at the end, or legitimately expensive; they are not sent (counted as skipped):

* the inter-broker APIs (LeaderAndIsr, StopReplica, UpdateMetadata, ControlledShutdown) are fenced
  by epochs, not by who sends them, so only frames that do *not* decode are sent;
* CreateTopics, CreatePartitions, AlterConfigs and IncrementalAlterConfigs only with
  validate_only set (a garbled one may ask for millions of partitions, or retention.ms=1);
* nothing that names the canary topic in Produce, DeleteTopics, DeleteRecords or a reassignment;
  nothing that deletes the topics the fuzzer writes to.

Expectation (`Expect`): a frame whose header or body does not decode must close the connection
without an answer; one that decodes must be answered with a well-formed response to it, except
that Produce with acks=0 gets no answer and Produce, Fetch, JoinGroup and SyncGroup may wait
(long polls, acks=all, rebalances) — they must not close the connection. A frame with a wrong
size prefix may do anything but crash the broker.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import Any

from odradek.protocol.codec import (
    ApiKey,
    ProtocolError,
    decode_request_body,
    parse_request_header,
)
from odradek.server.apis import SUPPORTED_VERSIONS
from tests.fuzz.generate import Names, random_request
from tests.fuzz.mutate import KINDS, mutate_batch, mutate_frame, reframe

INTER_BROKER = {
    ApiKey.LEADER_AND_ISR,
    ApiKey.STOP_REPLICA,
    ApiKey.UPDATE_METADATA,
    ApiKey.CONTROLLED_SHUTDOWN,
}
VALIDATE_ONLY = {
    ApiKey.CREATE_TOPICS,
    ApiKey.CREATE_PARTITIONS,
    ApiKey.ALTER_CONFIGS,
    ApiKey.INCREMENTAL_ALTER_CONFIGS,
}
MAY_WAIT = {ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP}
APIS = sorted(SUPPORTED_VERSIONS)
PRODUCE_SHARE = 0.15
"""Frames that are Produce requests carrying mutated record batches."""


class Expect(enum.Enum):
    CLOSED = "closed without an answer"
    ANSWER = "an answer"
    ANSWER_OR_WAIT = "an answer, or a wait, but not a closed connection"
    NOTHING = "no answer (acks=0), and not a closed connection"
    ANYTHING = "anything but a dead broker"


@dataclass(frozen=True)
class Frame:
    seed: int
    index: int
    api_key: int
    version: int
    kind: str
    data: bytes
    correlation_id: int
    expect: Expect

    def describe(self) -> str:
        name = ApiKey(self.api_key).name if self.api_key in ApiKey._value2member_map_ else "?"
        return (
            f"frame {self.index} of seed {self.seed}: {name} v{self.version}, mutation "
            f"{self.kind}, expected {self.expect.value}\n"
            f"replay: ODRADEK_FUZZ_SEED={self.seed} ODRADEK_FUZZ_FRAME={self.index}\n"
            f"{hexdump(self.data)}"
        )


def hexdump(data: bytes, limit: int = 4096) -> str:
    lines = []
    for offset in range(0, min(len(data), limit), 16):
        chunk = data[offset : offset + 16]
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset:08x}  {chunk.hex(' '):<47}  {text}")
    if len(data) > limit:
        lines.append(f"... ({len(data)} bytes in all)")
    return "\n".join(lines)


def _names_in(entity: Any) -> set[str]:
    """Every string anywhere in a decoded request (topic names among them)."""
    found: set[str] = set()
    stack = [entity]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.add(item)
        elif isinstance(item, tuple | list):
            stack.extend(item)
        elif hasattr(item, "__dataclass_fields__"):
            stack.extend(getattr(item, name) for name in item.__dataclass_fields__)
    return found


def _flags(entity: Any, name: str) -> list[Any]:
    found = []
    stack = [entity]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple | list):
            stack.extend(item)
        elif hasattr(item, "__dataclass_fields__"):
            for field in item.__dataclass_fields__:
                value = getattr(item, field)
                if field == name:
                    found.append(value)
                stack.append(value)
    return found


def _unsafe(api_key: int, entity: Any, names: Names, protected: frozenset[str]) -> bool:
    if api_key in INTER_BROKER:
        return True
    if api_key in VALIDATE_ONLY and not all(_flags(entity, "validate_only") or [False]):
        return True
    strings = _names_in(entity)
    if strings & names.forbidden:
        return True
    destructive = {ApiKey.DELETE_TOPICS, ApiKey.ALTER_PARTITION_REASSIGNMENTS}
    return api_key in destructive and bool(strings & protected)


def classify(
    data: bytes, api_key: int, version: int, names: Names, protected: frozenset[str]
) -> Expect | None:
    """What the broker must do with `data` (a frame), or None when it is not safe to send."""
    payload = data[4:]
    try:
        header = parse_request_header(payload)
        low, high = SUPPORTED_VERSIONS.get(header.api_key, (1, 0))
        if not low <= header.api_version <= high:
            if header.api_key == ApiKey.API_VERSIONS:
                return Expect.ANSWER  # KIP-511: answered in v0 with UNSUPPORTED_VERSION
            return Expect.CLOSED
        entity = decode_request_body(header, payload)
    except ProtocolError:
        return Expect.CLOSED
    if _unsafe(header.api_key, entity, names, protected):
        return None
    if header.api_key == ApiKey.PRODUCE and int(entity.acks) == 0:
        return Expect.NOTHING
    if header.api_key in MAY_WAIT:
        return Expect.ANSWER_OR_WAIT
    return Expect.ANSWER


def make_frame(seed: int, index: int, names: Names, protected: frozenset[str]) -> Frame | None:
    """Frame `index` of the run `seed` (module docstring); None when unsafe to send."""
    rng = random.Random(f"{seed}:{index}")
    correlation_id = index & 0x7FFFFFFF
    if rng.random() < PRODUCE_SHARE:
        return _produce_frame(rng, seed, index, names, protected)
    api_key = rng.choice(APIS)
    low, high = SUPPORTED_VERSIONS[api_key]
    version = rng.randint(low, high)
    valid = random_request(api_key, version, rng, names, correlation_id)
    kind = rng.choice(KINDS)
    if api_key in INTER_BROKER and kind in ("none", "flip", "int", "length", "tail"):
        kind = "truncate"  # the frames of these APIs that get sent must not decode
    strings = [s.encode() for s in (*names.topics, *names.groups, "fuzz")]
    data = mutate_frame(valid, _body_start(valid), strings, rng, kind)
    if kind == "size":
        return Frame(seed, index, api_key, version, kind, data, correlation_id, Expect.ANYTHING)
    expect = classify(data, api_key, version, names, protected)
    if expect is None:
        return None
    return Frame(seed, index, api_key, version, kind, data, correlation_id, expect)


def _produce_frame(
    rng: random.Random, seed: int, index: int, names: Names, protected: frozenset[str]
) -> Frame | None:
    from odradek.protocol.build import build
    from odradek.protocol.codec import encode_request, request_class
    from tests.fuzz.generate import records_value

    version = rng.randint(3, SUPPORTED_VERSIONS[ApiKey.PRODUCE][1])
    records = records_value(rng) or b""
    if rng.random() < 0.7:
        records = mutate_batch(records, rng)
    topic = rng.choice(list(names.topics))
    values = {
        "transactional_id": None,
        "acks": rng.choice([-1, 1, 1]),
        "timeout": 5_000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": records}]}],
    }
    entity = build(request_class(ApiKey.PRODUCE, version), values)
    data = encode_request(ApiKey.PRODUCE, version, index & 0x7FFFFFFF, "fuzz", entity)
    expect = classify(data, ApiKey.PRODUCE, version, names, protected)
    if expect is None:
        return None
    return Frame(seed, index, ApiKey.PRODUCE, version, "records", data, index & 0x7FFFFFFF, expect)


def _body_start(frame: bytes) -> int:
    """Where the body starts in a frame the codec encoded (size prefix included)."""
    header = parse_request_header(frame[4:])
    return 4 + header.size


__all__ = ["Expect", "Frame", "classify", "hexdump", "make_frame", "reframe"]
