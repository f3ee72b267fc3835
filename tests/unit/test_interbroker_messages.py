"""The ZooKeeper-era inter-broker messages (odradek.protocol.messages) against kio's serializers.

Two kinds of check: realistic messages survive kio's writer then kio's native reader unchanged, and
small messages encode to exactly the bytes assembled here by hand from Kafka 3.2's JSON schemas
(struct.pack for fixed-width fields, unsigned varints of length + 1 for compact strings and arrays,
one 0x00 per empty tagged-field section). The hand-built bytes do not use kio, so a field out of
schema order, a wrong kafka_type or a missing struct fails them.
"""

from __future__ import annotations

import dataclasses
import io
import struct
import typing
import uuid
from types import NoneType, UnionType

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.metadata.v12.response import MetadataResponse
from kio.schema.request_header.v2.header import RequestHeader
from kio.schema.response_header.v1.header import ResponseHeader
from kio.schema.types import BrokerId, TopicName
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i8, i16, i32, i64

from odradek.protocol.messages import (
    INTERBROKER_MESSAGES,
    ControlledShutdownRequestV3,
    ControlledShutdownResponseV3,
    LeaderAndIsrRequestV5,
    LeaderAndIsrResponseV5,
    LeaderAndIsrType,
    StopReplicaRequestV3,
    StopReplicaResponseV3,
    UpdateMetadataRequestV7,
    UpdateMetadataResponseV7,
)
from odradek.protocol.messages.controlled_shutdown.v3 import response as cs3_resp
from odradek.protocol.messages.leader_and_isr.v5 import request as lai5_req
from odradek.protocol.messages.leader_and_isr.v5 import response as lai5_resp
from odradek.protocol.messages.stop_replica.v3 import request as sr3_req
from odradek.protocol.messages.stop_replica.v3 import response as sr3_resp
from odradek.protocol.messages.update_metadata.v7 import request as um7_req

TOPIC_ID = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
OTHER_TOPIC_ID = uuid.UUID("f0e1d2c3-b4a5-9687-7869-5a4b3c2d1e0f")

ALL_MESSAGE_CLASSES = [
    cls for versions in INTERBROKER_MESSAGES.values() for pair in versions.values() for cls in pair
]


# --- kio round trip --------------------------------------------------------------------------


def encode(message: typing.Any) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(message))(buffer, message)
    return buffer.getvalue()


def decode(cls: typing.Any, data: bytes) -> typing.Any:
    message, size = entity_reader(cls)(data, 0)
    assert size == len(data), f"reader consumed {size} of {len(data)} bytes"
    return message


# --- hand assembly from the schemas ----------------------------------------------------------

NO_TAGS = b"\x00"


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def int8(value: int) -> bytes:
    return struct.pack(">b", value)


def int16(value: int) -> bytes:
    return struct.pack(">h", value)


def int32(value: int) -> bytes:
    return struct.pack(">i", value)


def int64(value: int) -> bytes:
    return struct.pack(">q", value)


def boolean(value: bool) -> bytes:
    return b"\x01" if value else b"\x00"


def compact_string(value: str | None) -> bytes:
    if value is None:
        return uvarint(0)
    encoded = value.encode()
    return uvarint(len(encoded) + 1) + encoded


def compact_array(*items: bytes) -> bytes:
    return uvarint(len(items) + 1) + b"".join(items)


def int32_array(*values: int) -> bytes:
    return compact_array(*(int32(v) for v in values))


def legacy_nullable_string(value: str | None) -> bytes:
    if value is None:
        return int16(-1)
    encoded = value.encode()
    return int16(len(encoded)) + encoded


# --- realistic messages for the round trip ---------------------------------------------------


def realistic_leader_and_isr_v5() -> LeaderAndIsrRequestV5:
    m = lai5_req
    return m.LeaderAndIsrRequest(
        controller_id=BrokerId(2),
        controller_epoch=i32(29),
        broker_epoch=i64(0x1_0000_0123),  # czxids exceed 32 bits on long-lived ensembles
        type=i8(LeaderAndIsrType.FULL),
        topic_states=(
            m.LeaderAndIsrTopicState(
                topic_name=TopicName("orders"),
                topic_id=TOPIC_ID,
                partition_states=(
                    m.LeaderAndIsrPartitionState(
                        partition_index=i32(0),
                        controller_epoch=i32(29),
                        leader=BrokerId(2),
                        leader_epoch=i32(48),
                        isr=(BrokerId(2), BrokerId(3)),
                        zk_version=i32(112),
                        replicas=(BrokerId(2), BrokerId(3), BrokerId(1)),
                    ),
                    m.LeaderAndIsrPartitionState(
                        partition_index=i32(1),
                        controller_epoch=i32(27),
                        leader=BrokerId(-1),  # offline: no live replica in the ISR
                        leader_epoch=i32(9),
                        isr=(),
                        zk_version=i32(3),
                        replicas=(BrokerId(3), BrokerId(1), BrokerId(2)),
                    ),
                    m.LeaderAndIsrPartitionState(
                        partition_index=i32(2),
                        controller_epoch=i32(29),
                        leader=BrokerId(1),
                        leader_epoch=i32(0),
                        isr=(BrokerId(1), BrokerId(2), BrokerId(4)),
                        zk_version=i32(0),
                        replicas=(BrokerId(1), BrokerId(2), BrokerId(4), BrokerId(5)),
                        adding_replicas=(BrokerId(4), BrokerId(5)),
                        removing_replicas=(BrokerId(3),),
                        is_new=True,
                    ),
                ),
            ),
            m.LeaderAndIsrTopicState(
                topic_name=TopicName("audit.log-v2"),
                topic_id=None,
                partition_states=(),
            ),
        ),
        live_leaders=(
            m.LeaderAndIsrLiveLeader(
                broker_id=BrokerId(2), host_name="broker-2.local", port=i32(9093)
            ),
            m.LeaderAndIsrLiveLeader(broker_id=BrokerId(1), host_name="10.0.0.1", port=i32(9092)),
        ),
    )


def realistic_leader_and_isr_response(module: typing.Any) -> object:
    return module.LeaderAndIsrResponse(
        error_code=ErrorCode.none,
        topics=(
            module.LeaderAndIsrTopicError(
                topic_id=TOPIC_ID,
                partition_errors=(
                    module.LeaderAndIsrPartitionError(
                        partition_index=i32(0), error_code=ErrorCode.none
                    ),
                    module.LeaderAndIsrPartitionError(
                        partition_index=i32(1), error_code=ErrorCode.kafka_storage_error
                    ),
                    module.LeaderAndIsrPartitionError(
                        partition_index=i32(2), error_code=ErrorCode.stale_controller_epoch
                    ),
                ),
            ),
            module.LeaderAndIsrTopicError(topic_id=None, partition_errors=()),
        ),
    )


def realistic_update_metadata() -> UpdateMetadataRequestV7:
    m = um7_req
    return m.UpdateMetadataRequest(
        controller_id=BrokerId(2),
        controller_epoch=i32(29),
        broker_epoch=i64(4_294_967_396),
        topic_states=(
            m.UpdateMetadataTopicState(
                topic_name=TopicName("orders"),
                topic_id=TOPIC_ID,
                partition_states=(
                    m.UpdateMetadataPartitionState(
                        partition_index=i32(0),
                        controller_epoch=i32(29),
                        leader=BrokerId(2),
                        leader_epoch=i32(48),
                        isr=(BrokerId(2), BrokerId(3)),
                        zk_version=i32(112),
                        replicas=(BrokerId(2), BrokerId(3), BrokerId(1)),
                        offline_replicas=(BrokerId(1),),
                    ),
                    m.UpdateMetadataPartitionState(
                        partition_index=i32(1),
                        controller_epoch=i32(29),
                        leader=BrokerId(-2),  # topic queued for deletion
                        leader_epoch=i32(10),
                        isr=(BrokerId(3),),
                        zk_version=i32(4),
                        replicas=(BrokerId(3), BrokerId(1), BrokerId(2)),
                    ),
                ),
            ),
            m.UpdateMetadataTopicState(
                topic_name=TopicName("empty"), topic_id=None, partition_states=()
            ),
        ),
        live_brokers=(
            m.UpdateMetadataBroker(
                id=BrokerId(2),
                endpoints=(
                    m.UpdateMetadataEndpoint(
                        port=i32(9092),
                        host="broker-2.local",
                        listener="PLAINTEXT",
                        security_protocol=i16(0),
                    ),
                    m.UpdateMetadataEndpoint(
                        port=i32(9094),
                        host="broker-2.local",
                        listener="REPLICATION",
                        security_protocol=i16(1),
                    ),
                ),
                rack="eu-west-1a",
            ),
            m.UpdateMetadataBroker(
                id=BrokerId(3),
                endpoints=(
                    m.UpdateMetadataEndpoint(
                        port=i32(9092),
                        host="broker-3.local",
                        listener="PLAINTEXT",
                        security_protocol=i16(0),
                    ),
                ),
                rack=None,
            ),
            m.UpdateMetadataBroker(id=BrokerId(9), endpoints=(), rack=""),
        ),
    )


def realistic_stop_replica() -> StopReplicaRequestV3:
    m = sr3_req
    return m.StopReplicaRequest(
        controller_id=BrokerId(2),
        controller_epoch=i32(29),
        broker_epoch=i64(812),
        topic_states=(
            m.StopReplicaTopicState(
                topic_name=TopicName("orders"),
                partition_states=(
                    m.StopReplicaPartitionState(
                        partition_index=i32(0), leader_epoch=i32(-2), delete_partition=True
                    ),
                    m.StopReplicaPartitionState(partition_index=i32(1), delete_partition=True),
                ),
            ),
            m.StopReplicaTopicState(
                topic_name=TopicName("payments"),
                partition_states=(
                    m.StopReplicaPartitionState(
                        partition_index=i32(3), leader_epoch=i32(17), delete_partition=False
                    ),
                ),
            ),
            m.StopReplicaTopicState(topic_name=TopicName("nothing"), partition_states=()),
        ),
    )


def realistic_stop_replica_response() -> StopReplicaResponseV3:
    m = sr3_resp
    return m.StopReplicaResponse(
        error_code=ErrorCode.none,
        partition_errors=(
            m.StopReplicaPartitionError(
                topic_name=TopicName("orders"), partition_index=i32(0), error_code=ErrorCode.none
            ),
            m.StopReplicaPartitionError(
                topic_name=TopicName("payments"),
                partition_index=i32(3),
                error_code=ErrorCode.fenced_leader_epoch,
            ),
        ),
    )


def realistic_controlled_shutdown_response() -> ControlledShutdownResponseV3:
    m = cs3_resp
    return m.ControlledShutdownResponse(
        error_code=ErrorCode.none,
        remaining_partitions=(
            m.RemainingPartition(topic_name=TopicName("orders"), partition_index=i32(1)),
            m.RemainingPartition(
                topic_name=TopicName("__consumer_offsets"), partition_index=i32(49)
            ),
        ),
    )


ROUND_TRIP_CASES = {
    "leader_and_isr_v5": realistic_leader_and_isr_v5,
    "leader_and_isr_v5_empty": lambda: lai5_req.LeaderAndIsrRequest(
        controller_id=BrokerId(1),
        controller_epoch=i32(1),
        type=i8(0),
        topic_states=(),
        live_leaders=(),
    ),
    "leader_and_isr_response_v5": lambda: realistic_leader_and_isr_response(lai5_resp),
    "leader_and_isr_response_stale": lambda: LeaderAndIsrResponseV5(
        error_code=ErrorCode.stale_controller_epoch, topics=()
    ),
    "update_metadata_v7": realistic_update_metadata,
    "update_metadata_v7_empty": lambda: UpdateMetadataRequestV7(
        controller_id=BrokerId(1), controller_epoch=i32(1), topic_states=(), live_brokers=()
    ),
    "update_metadata_response_v7": lambda: UpdateMetadataResponseV7(
        error_code=ErrorCode.stale_broker_epoch
    ),
    "stop_replica_v3": realistic_stop_replica,
    "stop_replica_response_v3": realistic_stop_replica_response,
    "controlled_shutdown_v3": lambda: ControlledShutdownRequestV3(
        broker_id=BrokerId(3), broker_epoch=i64(77)
    ),
    "controlled_shutdown_v3_default_epoch": lambda: ControlledShutdownRequestV3(
        broker_id=BrokerId(3)
    ),
    "controlled_shutdown_response_v3": realistic_controlled_shutdown_response,
    "controlled_shutdown_response_v3_empty": lambda: ControlledShutdownResponseV3(
        error_code=ErrorCode.not_controller, remaining_partitions=()
    ),
}


@pytest.mark.parametrize("make", ROUND_TRIP_CASES.values(), ids=ROUND_TRIP_CASES.keys())
def test_round_trip_through_kio(make: typing.Callable[[], object]) -> None:
    message = make()
    assert decode(type(message), encode(message)) == message


def test_round_trip_covers_every_message_class() -> None:
    covered = {type(make()) for make in ROUND_TRIP_CASES.values()}
    assert covered == set(ALL_MESSAGE_CLASSES)


# --- exact bytes -----------------------------------------------------------------------------


def leader_and_isr_request_bytes() -> bytes:
    """The small LeaderAndIsr request of the exact-bytes tests."""
    partition = (
        int32(4)  # partition_index
        + int32(3)  # controller_epoch
        + int32(1)  # leader
        + int32(5)  # leader_epoch
        + int32_array(1, 2)  # isr
        + int32(7)  # zk_version
        + int32_array(1, 2, 3)  # replicas
        + int32_array(3)  # adding_replicas
        + int32_array()  # removing_replicas
        + boolean(True)  # is_new
        + NO_TAGS
    )
    topic = compact_string("t") + TOPIC_ID.bytes + compact_array(partition) + NO_TAGS
    leader = int32(1) + compact_string("h") + int32(9092) + NO_TAGS
    return (
        int32(1)  # controller_id
        + int32(3)  # controller_epoch
        + int64(-1)  # broker_epoch (default)
        + int8(2)  # type: FULL
        + compact_array(topic)
        + compact_array(leader)
        + NO_TAGS
    )


def small_leader_and_isr(module: typing.Any, **partition_extra: object) -> object:
    return module.LeaderAndIsrRequest(
        controller_id=BrokerId(1),
        controller_epoch=i32(3),
        type=i8(LeaderAndIsrType.FULL),
        topic_states=(
            module.LeaderAndIsrTopicState(
                topic_name=TopicName("t"),
                topic_id=TOPIC_ID,
                partition_states=(
                    module.LeaderAndIsrPartitionState(
                        partition_index=i32(4),
                        controller_epoch=i32(3),
                        leader=BrokerId(1),
                        leader_epoch=i32(5),
                        isr=(BrokerId(1), BrokerId(2)),
                        zk_version=i32(7),
                        replicas=(BrokerId(1), BrokerId(2), BrokerId(3)),
                        adding_replicas=(BrokerId(3),),
                        is_new=True,
                        **partition_extra,
                    ),
                ),
            ),
        ),
        live_leaders=(
            module.LeaderAndIsrLiveLeader(broker_id=BrokerId(1), host_name="h", port=i32(9092)),
        ),
    )


def test_leader_and_isr_v5_request_bytes() -> None:
    message = small_leader_and_isr(lai5_req)
    expected = leader_and_isr_request_bytes()
    assert encode(message) == expected
    assert decode(LeaderAndIsrRequestV5, expected) == message


@pytest.mark.parametrize("module", [lai5_resp], ids=["v5"])
def test_leader_and_isr_response_bytes(module: typing.Any) -> None:
    message = module.LeaderAndIsrResponse(
        error_code=ErrorCode.none,
        topics=(
            module.LeaderAndIsrTopicError(
                topic_id=TOPIC_ID,
                partition_errors=(
                    module.LeaderAndIsrPartitionError(
                        partition_index=i32(4), error_code=ErrorCode.kafka_storage_error
                    ),
                    module.LeaderAndIsrPartitionError(
                        partition_index=i32(5), error_code=ErrorCode.none
                    ),
                ),
            ),
        ),
    )
    expected = (
        int16(0)
        + compact_array(
            TOPIC_ID.bytes
            + compact_array(int32(4) + int16(56) + NO_TAGS, int32(5) + int16(0) + NO_TAGS)
            + NO_TAGS
        )
        + NO_TAGS
    )
    assert encode(message) == expected
    assert decode(type(message), expected) == message


def test_update_metadata_v7_request_bytes() -> None:
    m = um7_req
    message = m.UpdateMetadataRequest(
        controller_id=BrokerId(1),
        controller_epoch=i32(3),
        broker_epoch=i64(0x1_0000_0002),
        topic_states=(
            m.UpdateMetadataTopicState(
                topic_name=TopicName("t"),
                topic_id=TOPIC_ID,
                partition_states=(
                    m.UpdateMetadataPartitionState(
                        partition_index=i32(4),
                        controller_epoch=i32(3),
                        leader=BrokerId(2),
                        leader_epoch=i32(5),
                        isr=(BrokerId(2),),
                        zk_version=i32(7),
                        replicas=(BrokerId(1), BrokerId(2)),
                        offline_replicas=(BrokerId(1),),
                    ),
                ),
            ),
        ),
        live_brokers=(
            m.UpdateMetadataBroker(
                id=BrokerId(1),
                endpoints=(
                    m.UpdateMetadataEndpoint(
                        port=i32(9092), host="h", listener="PLAINTEXT", security_protocol=i16(3)
                    ),
                ),
                rack=None,
            ),
            m.UpdateMetadataBroker(id=BrokerId(2), endpoints=(), rack="r1"),
        ),
    )
    partition = (
        int32(4)
        + int32(3)
        + int32(2)
        + int32(5)
        + int32_array(2)
        + int32(7)
        + int32_array(1, 2)
        + int32_array(1)
        + NO_TAGS
    )
    topic = compact_string("t") + TOPIC_ID.bytes + compact_array(partition) + NO_TAGS
    endpoint = int32(9092) + compact_string("h") + compact_string("PLAINTEXT") + int16(3) + NO_TAGS
    broker_1 = int32(1) + compact_array(endpoint) + compact_string(None) + NO_TAGS
    broker_2 = int32(2) + compact_array() + compact_string("r1") + NO_TAGS
    expected = (
        int32(1)
        + int32(3)
        + int64(0x1_0000_0002)
        + compact_array(topic)
        + compact_array(broker_1, broker_2)
        + NO_TAGS
    )
    assert encode(message) == expected
    assert decode(UpdateMetadataRequestV7, expected) == message


def test_update_metadata_v7_response_bytes() -> None:
    message = UpdateMetadataResponseV7(error_code=ErrorCode.stale_controller_epoch)
    expected = int16(11) + NO_TAGS
    assert encode(message) == expected
    assert decode(UpdateMetadataResponseV7, expected) == message


def test_stop_replica_v3_request_bytes() -> None:
    m = sr3_req
    message = m.StopReplicaRequest(
        controller_id=BrokerId(1),
        controller_epoch=i32(3),
        topic_states=(
            m.StopReplicaTopicState(
                topic_name=TopicName("t"),
                partition_states=(
                    m.StopReplicaPartitionState(
                        partition_index=i32(4), leader_epoch=i32(-2), delete_partition=True
                    ),
                    m.StopReplicaPartitionState(
                        partition_index=i32(5), leader_epoch=i32(8), delete_partition=False
                    ),
                ),
            ),
            m.StopReplicaTopicState(topic_name=TopicName("u"), partition_states=()),
        ),
    )
    topic_t = (
        compact_string("t")
        + compact_array(
            int32(4) + int32(-2) + boolean(True) + NO_TAGS,
            int32(5) + int32(8) + boolean(False) + NO_TAGS,
        )
        + NO_TAGS
    )
    topic_u = compact_string("u") + compact_array() + NO_TAGS
    expected = int32(1) + int32(3) + int64(-1) + compact_array(topic_t, topic_u) + NO_TAGS
    assert encode(message) == expected
    assert decode(StopReplicaRequestV3, expected) == message


def test_stop_replica_v3_response_bytes() -> None:
    m = sr3_resp
    message = m.StopReplicaResponse(
        error_code=ErrorCode.none,
        partition_errors=(
            m.StopReplicaPartitionError(
                topic_name=TopicName("t"),
                partition_index=i32(4),
                error_code=ErrorCode.fenced_leader_epoch,
            ),
        ),
    )
    expected = (
        int16(0) + compact_array(compact_string("t") + int32(4) + int16(74) + NO_TAGS) + NO_TAGS
    )
    assert encode(message) == expected
    assert decode(StopReplicaResponseV3, expected) == message


def test_controlled_shutdown_v3_request_bytes() -> None:
    message = ControlledShutdownRequestV3(broker_id=BrokerId(2), broker_epoch=i64(0x1_0000_0005))
    expected = int32(2) + int64(0x1_0000_0005) + NO_TAGS
    assert encode(message) == expected
    assert decode(ControlledShutdownRequestV3, expected) == message


def test_controlled_shutdown_v3_response_bytes() -> None:
    m = cs3_resp
    message = m.ControlledShutdownResponse(
        error_code=ErrorCode.none,
        remaining_partitions=(
            m.RemainingPartition(topic_name=TopicName("t"), partition_index=i32(4)),
            m.RemainingPartition(topic_name=TopicName("u"), partition_index=i32(0)),
        ),
    )
    expected = (
        int16(0)
        + compact_array(
            compact_string("t") + int32(4) + NO_TAGS,
            compact_string("u") + int32(0) + NO_TAGS,
        )
        + NO_TAGS
    )
    assert encode(message) == expected
    assert decode(ControlledShutdownResponseV3, expected) == message


# --- defaults, nulls and tagged fields -------------------------------------------------------


def test_schema_defaults() -> None:
    """Defaults are the schema's: broker epoch -1 ("do not check"), not new, recovered, no epoch."""
    assert ControlledShutdownRequestV3(broker_id=BrokerId(1)).broker_epoch == -1
    assert (
        UpdateMetadataRequestV7(
            controller_id=BrokerId(1), controller_epoch=i32(1), topic_states=(), live_brokers=()
        ).broker_epoch
        == -1
    )
    state = lai5_req.LeaderAndIsrPartitionState(
        partition_index=i32(0),
        controller_epoch=i32(1),
        leader=BrokerId(1),
        leader_epoch=i32(0),
        isr=(BrokerId(1),),
        zk_version=i32(0),
        replicas=(BrokerId(1),),
    )
    assert (
        state.adding_replicas,
        state.removing_replicas,
        state.is_new,
    ) == (
        (),
        (),
        False,
    )
    stop = sr3_req.StopReplicaPartitionState(partition_index=i32(0), delete_partition=False)
    assert stop.leader_epoch == -1
    broker = um7_req.UpdateMetadataBroker(id=BrokerId(1), endpoints=())
    assert broker.rack is None


def test_null_rack_and_empty_rack_differ_on_the_wire() -> None:
    def broker_bytes(rack: str | None) -> bytes:
        return encode(um7_req.UpdateMetadataBroker(id=BrokerId(1), endpoints=(), rack=rack))

    assert broker_bytes(None) == int32(1) + compact_array() + b"\x00" + NO_TAGS
    assert broker_bytes("") == int32(1) + compact_array() + b"\x01" + NO_TAGS
    assert decode(um7_req.UpdateMetadataBroker, broker_bytes(None)).rack is None
    assert decode(um7_req.UpdateMetadataBroker, broker_bytes("")).rack == ""


def test_only_the_schemas_nullable_fields_accept_none() -> None:
    """In these versions only UpdateMetadata's ``rack`` is nullable (and uuids, which kio types so)."""
    nullable = set()
    for cls in all_entity_classes():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.metadata.get("kafka_type") == "uuid":
                continue
            if typing.get_origin(hints[f.name]) is UnionType:
                nullable.add(f"{cls.__name__}.{f.name}")
    assert nullable == {"UpdateMetadataBroker.rack"}


def test_zero_topic_id_reads_back_as_none() -> None:
    """kio maps the zero UUID to None: a topic without an id must be built with ``topic_id=None``."""
    topic = lai5_req.LeaderAndIsrTopicState(
        topic_name=TopicName("t"), topic_id=uuid.UUID(int=0), partition_states=()
    )
    data = encode(topic)
    assert data == compact_string("t") + bytes(16) + compact_array() + NO_TAGS
    assert decode(lai5_req.LeaderAndIsrTopicState, data) == dataclasses.replace(
        topic, topic_id=None
    )


def test_no_message_declares_tagged_fields() -> None:
    """Kafka 3.2's schemas declare no tagged field in these versions; the sections stay empty."""
    for cls in all_entity_classes():
        tagged = [f.name for f in dataclasses.fields(cls) if "tag" in f.metadata]
        assert tagged == [], f"{cls.__qualname__} declares tagged fields {tagged}"


def test_kio_refuses_unknown_tagged_fields() -> None:
    """Pins a kio 0.6.5 limitation that the codec must translate (see the package docstring).

    Kafka would skip an unknown tag; kio's native reader raises KeyError. If a kio upgrade starts
    skipping unknown tags this test fails, and the translation can go.
    """
    with_unknown_tag = int16(0) + uvarint(1) + uvarint(5) + uvarint(2) + b"\xab\xcd"
    with pytest.raises(KeyError):
        decode(UpdateMetadataResponseV7, with_unknown_tag)


# --- class variables, headers and the registry -----------------------------------------------


def nested_entity_types(cls: type) -> list[typing.Any]:
    """The entity classes referenced by ``cls``'s fields (tuple element types included)."""
    found: list[typing.Any] = []
    for f in dataclasses.fields(cls):
        hint = typing.get_type_hints(cls)[f.name]
        if typing.get_origin(hint) is tuple:
            hint = typing.get_args(hint)[0]
        if typing.get_origin(hint) is UnionType:
            hint = next(a for a in typing.get_args(hint) if a is not NoneType)
        if dataclasses.is_dataclass(hint):
            found.append(hint)
    return found


def all_entity_classes() -> list[type]:
    seen: list[type] = []
    pending = list(ALL_MESSAGE_CLASSES)
    while pending:
        cls = pending.pop()
        if cls not in seen:
            seen.append(cls)
            pending.extend(nested_entity_types(cls))
    return seen


def test_headers_match_kio_flexible_messages() -> None:
    """Requests use kio's request header v2, responses kio's response header v1, as kio's own."""
    assert MetadataRequest.__header_schema__ is RequestHeader
    assert MetadataResponse.__header_schema__ is ResponseHeader
    for api_key, versions in INTERBROKER_MESSAGES.items():
        for version, (request_cls, response_cls) in versions.items():
            assert request_cls.__header_schema__ is RequestHeader
            assert response_cls.__header_schema__ is ResponseHeader
            assert RequestHeader.__version__ == 2 and RequestHeader.__flexible__
            assert ResponseHeader.__version__ == 1 and ResponseHeader.__flexible__
            for root, kind in (
                (request_cls, EntityType.request),
                (response_cls, EntityType.response),
            ):
                assert root.__type__ is kind
                assert (root.__api_key__, root.__version__, root.__flexible__) == (
                    api_key,
                    version,
                    True,
                )


def test_nested_entities_carry_their_message_class_variables() -> None:
    """Every nested struct repeats its message's api key, version, flexibility and header."""
    for versions in INTERBROKER_MESSAGES.values():
        for pair in versions.values():
            for root in pair:
                stack = nested_entity_types(root)
                assert stack or root.__name__.startswith(
                    ("UpdateMetadataResponse", "ControlledShutdownRequest")
                )
                while stack:
                    nested = stack.pop()
                    assert nested.__type__ is EntityType.nested
                    assert (
                        nested.__api_key__,
                        nested.__version__,
                        nested.__flexible__,
                        nested.__header_schema__,
                    ) == (root.__api_key__, root.__version__, True, root.__header_schema__), nested
                    stack.extend(nested_entity_types(nested))


def test_registry_lists_the_four_apis() -> None:
    assert {k: sorted(v) for k, v in INTERBROKER_MESSAGES.items()} == {
        4: [5],
        5: [3],
        6: [7],
        7: [3],
    }
    assert INTERBROKER_MESSAGES[4][5] == (LeaderAndIsrRequestV5, LeaderAndIsrResponseV5)
    assert INTERBROKER_MESSAGES[5][3] == (StopReplicaRequestV3, StopReplicaResponseV3)
    assert INTERBROKER_MESSAGES[6][7] == (UpdateMetadataRequestV7, UpdateMetadataResponseV7)
    assert INTERBROKER_MESSAGES[7][3] == (ControlledShutdownRequestV3, ControlledShutdownResponseV3)


def test_full_request_and_response_frames() -> None:
    """Header then body, as a codec will write them: the header is kio's v2/v1, unchanged."""
    request = ControlledShutdownRequestV3(broker_id=BrokerId(2), broker_epoch=i64(9))
    header = request.__header_schema__(
        request_api_key=request.__api_key__,
        request_api_version=request.__version__,
        correlation_id=i32(42),
        client_id="broker-2",
    )
    frame = encode(header) + encode(request)
    assert frame == (
        int16(7)
        + int16(3)
        + int32(42)
        + legacy_nullable_string("broker-2")  # the one string that stays legacy in header v2
        + NO_TAGS
        + int32(2)
        + int64(9)
        + NO_TAGS
    )
    # kio's readers return the value and the number of bytes they consumed from the offset.
    parsed_header, header_size = entity_reader(RequestHeader)(frame, 0)
    assert parsed_header == header
    parsed_body, body_size = entity_reader(ControlledShutdownRequestV3)(frame, header_size)
    assert (parsed_body, header_size + body_size) == (request, len(frame))

    response = ControlledShutdownResponseV3(error_code=ErrorCode.none, remaining_partitions=())
    response_header = response.__header_schema__(correlation_id=i32(42))
    assert (
        encode(response_header) + encode(response)
        == int32(42) + NO_TAGS + int16(0) + compact_array() + NO_TAGS
    )
