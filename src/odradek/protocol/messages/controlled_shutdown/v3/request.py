"""ControlledShutdown request, version 3 (api key 7): a broker asks the controller to move its leaders.

Follows ``ControlledShutdownRequest.json`` of Apache Kafka 3.2 (valid versions 0-3, flexible from
3), unchanged in later 3.x releases. Flexible: request header v2 (only version 0 used a header
without client id) and an (always empty) tagged-field section after the body.

A broker shutting down cleanly sends this to the active controller, which moves leadership of every
partition the broker leads to another ISR member, shrinks the broker out of ISRs and sends it
StopReplica for the partitions it follows. Fields, in wire order:

``broker_id``
    The broker that is shutting down.
``broker_epoch``
    That broker's epoch (czxid of its ``/brokers/ids/<id>`` registration). The controller refuses
    with STALE_BROKER_EPOCH when it is older than the registration it knows, so that a delayed
    request from a previous incarnation cannot shut down the current one. -1 means "do not check".
"""

from dataclasses import dataclass, field
from typing import ClassVar

from kio.schema.request_header.v2.header import RequestHeader
from kio.schema.types import BrokerId
from kio.static.constants import EntityType
from kio.static.primitive import i16, i64


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlledShutdownRequest:
    """ControlledShutdown v3: sent by a broker to the active controller."""

    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(3)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(7)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    broker_id: BrokerId = field(metadata={"kafka_type": "int32"})
    """The broker that is shutting down."""
    broker_epoch: i64 = field(metadata={"kafka_type": "int64"}, default=i64(-1))
    """The shutting-down broker's epoch, or -1."""
