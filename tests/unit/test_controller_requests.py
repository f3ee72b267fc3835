"""The controller's own encoders for LeaderAndIsr v5 and UpdateMetadata v7
(`protocol.controller_requests`) give exactly the bytes kio's generic writer gives, for any
request, and a broker decodes them back to the same request."""

from __future__ import annotations

import dataclasses
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from odradek.protocol.codec import (
    ApiKey,
    EncodedRequest,
    decode_request_body,
    encode_body,
    encode_request,
    parse_request_header,
)
from odradek.protocol.controller_requests import (
    LeaderAndIsrPartition,
    UpdateMetadataPartition,
    encode_leader_and_isr_v5,
    encode_update_metadata_v7,
)
from odradek.protocol.messages.leader_and_isr.v5.request import (
    LeaderAndIsrLiveLeader,
    LeaderAndIsrPartitionState,
    LeaderAndIsrRequest,
    LeaderAndIsrTopicState,
)
from odradek.protocol.messages.update_metadata.v7.request import (
    UpdateMetadataBroker,
    UpdateMetadataEndpoint,
    UpdateMetadataPartitionState,
    UpdateMetadataRequest,
    UpdateMetadataTopicState,
)

int8 = st.integers(min_value=-(2**7), max_value=2**7 - 1)
int16 = st.integers(min_value=-(2**15), max_value=2**15 - 1)
int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# Lists long enough for a two-byte length varint (127 and more elements), as well as the usual.
replica_lists = st.one_of(
    st.lists(st.integers(min_value=-1, max_value=5), max_size=4).map(tuple),
    st.lists(int32, min_size=120, max_size=140).map(tuple),
)
names = st.text(min_size=1, max_size=200)
topic_ids = st.one_of(st.none(), st.uuids())


@st.composite
def leader_and_isr_partitions(draw: st.DrawFn) -> LeaderAndIsrPartitionState:
    return LeaderAndIsrPartitionState(
        partition_index=draw(int32),
        controller_epoch=draw(int32),
        leader=draw(int32),
        leader_epoch=draw(int32),
        isr=draw(replica_lists),
        zk_version=draw(int32),
        replicas=draw(replica_lists),
        adding_replicas=draw(replica_lists),
        removing_replicas=draw(replica_lists),
        is_new=draw(st.booleans()),
    )


@st.composite
def leader_and_isr_requests(draw: st.DrawFn) -> LeaderAndIsrRequest:
    topics = draw(
        st.lists(
            st.builds(
                LeaderAndIsrTopicState,
                topic_name=names,
                topic_id=topic_ids,
                partition_states=st.lists(leader_and_isr_partitions(), max_size=5).map(tuple),
            ),
            max_size=4,
        )
    )
    leaders = draw(
        st.lists(
            st.builds(LeaderAndIsrLiveLeader, broker_id=int32, host_name=names, port=int32),
            max_size=3,
        )
    )
    return LeaderAndIsrRequest(
        controller_id=draw(int32),
        controller_epoch=draw(int32),
        broker_epoch=draw(int64),
        type=draw(int8),
        topic_states=tuple(topics),
        live_leaders=tuple(leaders),
    )


@st.composite
def update_metadata_partitions(draw: st.DrawFn) -> UpdateMetadataPartitionState:
    return UpdateMetadataPartitionState(
        partition_index=draw(int32),
        controller_epoch=draw(int32),
        leader=draw(int32),
        leader_epoch=draw(int32),
        isr=draw(replica_lists),
        zk_version=draw(int32),
        replicas=draw(replica_lists),
        offline_replicas=draw(replica_lists),
    )


@st.composite
def update_metadata_requests(draw: st.DrawFn) -> UpdateMetadataRequest:
    topics = draw(
        st.lists(
            st.builds(
                UpdateMetadataTopicState,
                topic_name=names,
                topic_id=topic_ids,
                partition_states=st.lists(update_metadata_partitions(), max_size=5).map(tuple),
            ),
            max_size=4,
        )
    )
    endpoint = st.builds(
        UpdateMetadataEndpoint, port=int32, host=names, listener=names, security_protocol=int16
    )
    brokers = draw(
        st.lists(
            st.builds(
                UpdateMetadataBroker,
                id=int32,
                endpoints=st.lists(endpoint, max_size=3).map(tuple),
                rack=st.one_of(st.none(), names),
            ),
            max_size=3,
        )
    )
    return UpdateMetadataRequest(
        controller_id=draw(int32),
        controller_epoch=draw(int32),
        broker_epoch=draw(int64),
        topic_states=tuple(topics),
        live_brokers=tuple(brokers),
    )


def _decoded(api_key: ApiKey, version: int, request: object, body: bytes) -> object:
    frame = encode_request(api_key, version, 7, "controller", EncodedRequest(request, body))
    header = parse_request_header(frame[4:])
    return decode_request_body(header, frame[4:])


@settings(max_examples=120)
@given(leader_and_isr_requests())
def test_leader_and_isr_bytes_are_kios(request: LeaderAndIsrRequest) -> None:
    body = encode_leader_and_isr_v5(request)
    assert body == encode_body(request).body
    assert _decoded(ApiKey.LEADER_AND_ISR, 5, request, body) == request


@settings(max_examples=120)
@given(update_metadata_requests())
def test_update_metadata_bytes_are_kios(request: UpdateMetadataRequest) -> None:
    body = encode_update_metadata_v7(request)
    assert body == encode_body(request).body
    assert _decoded(ApiKey.UPDATE_METADATA, 7, request, body) == request


def test_shared_replica_lists_are_written_in_every_partition() -> None:
    """The per-request memo of encoded arrays must not leak one partition's list into another's."""
    states = tuple(
        LeaderAndIsrPartitionState(
            partition_index=p,
            controller_epoch=1,
            leader=p % 3,
            leader_epoch=p,
            isr=(1, 2, 3)[: 1 + p % 3],
            zk_version=p,
            replicas=(1, 2, 3) if p % 2 else (3, 2, 1),
            is_new=p == 4,
        )
        for p in range(10)
    )
    request = LeaderAndIsrRequest(
        controller_id=1,
        controller_epoch=2,
        broker_epoch=3,
        type=0,
        topic_states=(
            LeaderAndIsrTopicState(
                topic_name="a", topic_id=uuid.UUID(int=5), partition_states=states
            ),
            LeaderAndIsrTopicState(topic_name="b", topic_id=None, partition_states=states[::-1]),
        ),
        live_leaders=(LeaderAndIsrLiveLeader(broker_id=1, host_name="h", port=9092),),
    )
    body = encode_leader_and_isr_v5(request)
    assert body == encode_body(request).body
    assert _decoded(ApiKey.LEADER_AND_ISR, 5, request, body) == request


def _as_named_tuples(request: object, row: type) -> object:
    """`request` with its partition states as the controller builds them (named tuples)."""
    topics = tuple(
        dataclasses.replace(
            topic,
            partition_states=tuple(
                row(*(getattr(p, f) for f in row._fields))  # type: ignore[attr-defined]
                for p in topic.partition_states
            ),
        )
        for topic in request.topic_states  # type: ignore[attr-defined]
    )
    return dataclasses.replace(request, topic_states=topics)  # type: ignore[type-var]


@settings(max_examples=60)
@given(leader_and_isr_requests(), update_metadata_requests())
def test_the_controllers_named_tuples_encode_as_kios_classes(
    leader_and_isr: LeaderAndIsrRequest, update_metadata: UpdateMetadataRequest
) -> None:
    rows = _as_named_tuples(leader_and_isr, LeaderAndIsrPartition)
    assert encode_leader_and_isr_v5(rows) == encode_body(leader_and_isr).body  # type: ignore[arg-type]
    rows = _as_named_tuples(update_metadata, UpdateMetadataPartition)
    assert encode_update_metadata_v7(rows) == encode_body(update_metadata).body  # type: ignore[arg-type]
