"""UpdateMetadata response, version 7 (api key 6): whether the broker applied the update.

Follows ``UpdateMetadataResponse.json`` of Apache Kafka 3.2 (valid versions 0-7, flexible from 6),
unchanged in later 3.x releases. Flexible: response header v1 and an (always empty) tagged-field
section after the body.

The one field, for a ZooKeeper-mode controller:

``error_code``
    NONE when the broker applied the update to its metadata cache; STALE_CONTROLLER_EPOCH when the
    request came from a deposed controller; STALE_BROKER_EPOCH when it was meant for an earlier
    registration of this broker. The controller only logs errors: the next UpdateMetadata carries
    the state again.
"""

from dataclasses import dataclass, field
from typing import ClassVar

from kio.schema.errors import ErrorCode
from kio.schema.response_header.v1.header import ResponseHeader
from kio.static.constants import EntityType
from kio.static.primitive import i16


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateMetadataResponse:
    """UpdateMetadata v7 response: sent by a broker back to the controller."""

    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(7)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(6)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    """The error, or NONE."""
