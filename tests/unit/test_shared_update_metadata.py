"""UpdateMetadata encoded once for every recipient (`controller.channel_manager`): each broker's
bytes are exactly what encoding its own request would give, its broker epoch included."""

from __future__ import annotations

import dataclasses
import uuid

from hypothesis import given
from hypothesis import strategies as st

from odradek.controller.channel_manager import UPDATE_METADATA_VERSION, with_broker_epoch
from odradek.protocol.build import build
from odradek.protocol.codec import (
    ApiKey,
    EncodedRequest,
    decode_request_body,
    encode_body,
    encode_request,
    parse_request_header,
)
from odradek.protocol.controller_requests import UpdateMetadataPartition
from odradek.protocol.messages import UpdateMetadataRequestV7
from odradek.protocol.messages.update_metadata.v7.request import (
    UpdateMetadataPartitionState,
    UpdateMetadataTopicState,
)
from tests.unit.test_state_machines import TOPIC, Harness

int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def _request(controller_id: int, controller_epoch: int, broker_epoch: int, partitions: int):  # type: ignore[no-untyped-def]
    states = [
        UpdateMetadataPartitionState(
            partition_index=p,
            controller_epoch=controller_epoch,
            leader=1,
            leader_epoch=p,
            isr=(1, 2),
            zk_version=p,
            replicas=(1, 2),
            offline_replicas=(),
        )
        for p in range(partitions)
    ]
    topic = build(
        UpdateMetadataTopicState,
        {"topic_name": "t", "topic_id": uuid.UUID(int=7), "partition_states": states},
    )
    return build(
        UpdateMetadataRequestV7,
        {
            "controller_id": controller_id,
            "controller_epoch": controller_epoch,
            "broker_epoch": broker_epoch,
            "topic_states": (topic,),
            "live_brokers": [
                {
                    "id": 1,
                    "endpoints": [
                        {
                            "port": 9092,
                            "host": "127.0.0.1",
                            "listener": "PLAINTEXT",
                            "security_protocol": 0,
                        }
                    ],
                    "rack": None,
                }
            ],
        },
    )


@given(int32, int32, int64, int64, st.integers(min_value=0, max_value=5))
def test_a_shared_body_with_the_epoch_changed_is_the_recipients_own_encoding(
    controller_id: int, controller_epoch: int, first: int, other: int, partitions: int
) -> None:
    shared = encode_body(_request(controller_id, controller_epoch, first, partitions)).body
    own = _request(controller_id, controller_epoch, other, partitions)
    frame = encode_request(
        ApiKey.UPDATE_METADATA,
        UPDATE_METADATA_VERSION,
        5,
        "controller-1",
        EncodedRequest(own, with_broker_epoch(shared, other)),
    )
    assert frame == encode_request(
        ApiKey.UPDATE_METADATA, UPDATE_METADATA_VERSION, 5, "controller-1", own
    )


def test_each_broker_is_sent_the_shared_body_with_its_own_epoch() -> None:
    h = Harness(live=(1, 2, 3))
    h.add_topic(TOPIC, {0: [1, 2, 3]})
    h.seed_partition((TOPIC, 0), leader=1, isr=[1, 2, 3])
    epochs = {b: 1000 + 17 * b for b in (1, 2, 3)}
    for broker_id, epoch in epochs.items():
        info = h.context.live_brokers[broker_id]
        h.context.live_brokers[broker_id] = dataclasses.replace(info, broker_epoch=epoch)
    h.batch.new_batch()
    h.batch.add_update_metadata_request_for_brokers([1, 2, 3], [(TOPIC, 0)])
    h.send()
    sent = h.channel.requests(ApiKey.UPDATE_METADATA)
    assert sorted(r.broker_id for r in sent) == [1, 2, 3]
    for item in sent:
        assert isinstance(item.request, EncodedRequest)
        frame = encode_request(
            ApiKey.UPDATE_METADATA, UPDATE_METADATA_VERSION, 9, "c", item.request
        )
        header = parse_request_header(frame[4:])
        decoded = decode_request_body(header, frame[4:])
        sent_entity = item.request.entity
        # The controller builds partition states as named tuples (`UpdateMetadataPartition`);
        # the broker decodes kio's classes: the same fields, the same values.
        fields = UpdateMetadataPartition._fields
        assert [
            (
                t.topic_name,
                t.topic_id,
                [tuple(getattr(p, f) for f in fields) for p in t.partition_states],
            )
            for t in decoded.topic_states
        ] == [
            (t.topic_name, t.topic_id, [tuple(p) for p in t.partition_states])
            for t in sent_entity.topic_states
        ]
        assert decoded.live_brokers == sent_entity.live_brokers
        assert decoded.controller_id == sent_entity.controller_id
        assert decoded.controller_epoch == sent_entity.controller_epoch
        assert decoded.broker_epoch == epochs[item.broker_id]
        # what the recording channel and the tests read goes through to the entity
        assert item.request.topic_states[0].partition_states[0].leader == 1
