"""The four ZooKeeper-era inter-broker messages that kio no longer carries, in kio's own style.

Kafka 4 removed LeaderAndIsr (api key 4), StopReplica (5), UpdateMetadata (6) and ControlledShutdown
(7) along with ZooKeeper mode, and kio 0.6.5 is generated from Kafka 4's schemas. Odradek's
controller still needs them, so this package defines them from Kafka 3.2's JSON schemas as frozen,
slotted dataclasses carrying the same class variables (``__type__``, ``__version__``,
``__flexible__``, ``__api_key__``, ``__header_schema__``) and field metadata (``kafka_type``, and
``tag`` for tagged fields) as kio's generated classes. kio's serializers therefore work on them
unchanged: ``kio.serial.entity_writer(cls)(buffer, message)`` and
``kio.serial.entity_reader(cls)(data, offset)``, and a codec can treat them like any kio message.

Why by hand: kio's code generator lives only in kio's source repository, not in the package on
PyPI, so it cannot run here. Instead `tests/unit/test_interbroker_schemas.py` holds every class to
Kafka 3.9's JSON schemas (vendored under `tests/unit/kafka_schemas/`): field lists, order and types
per struct, and kio's bytes against an encoder driven by the schema alone.

Layout follows kio: ``<api>/v<N>/request.py`` and ``<api>/v<N>/response.py``, each module
documenting which schema it follows and what every field means to a ZooKeeper-mode controller.

Wire format. Every version defined here is a flexible version, so requests use request header v2
(api key int16, api version int16, correlation id int32, client id as a *legacy* nullable string,
tagged fields) and responses use response header v1 (correlation id int32, tagged fields). In the
body, integers are big-endian; a string is an unsigned varint of its UTF-8 length plus one, then
the bytes (a varint 0 is null); an array is an unsigned varint of its element count plus one, then
the elements; a uuid is 16 raw bytes (kio reads the zero UUID as ``None``); a bool is one byte.
Every struct, the top-level message included, ends with a tagged-field section: an unsigned varint
count, then for each field its tag and byte size as unsigned varints and its bytes. None of these
versions declares a tagged field, so every section is written as the single byte 0x00.

Unknown tagged fields: Kafka expects a reader to skip tags it does not know, but kio 0.6.5's native
reader raises ``KeyError`` on them. Only newer Kafka versions of these messages would send any, and
Odradek talks to Odradek here; a codec that reads these messages from the network should still
translate that ``KeyError`` into the project's own error at its boundary.

Concurrency: instances are immutable and may be shared freely between tasks and threads.
"""

from typing import Final

from kio.static.protocol import Payload

from .controlled_shutdown.v3.request import ControlledShutdownRequest as ControlledShutdownRequestV3
from .controlled_shutdown.v3.response import (
    ControlledShutdownResponse as ControlledShutdownResponseV3,
)
from .describe_transactions import DESCRIBE_TRANSACTIONS
from .leader_and_isr import LeaderAndIsrType
from .leader_and_isr.v5.request import LeaderAndIsrRequest as LeaderAndIsrRequestV5
from .leader_and_isr.v5.response import LeaderAndIsrResponse as LeaderAndIsrResponseV5
from .produce_legacy import PRODUCE_LEGACY
from .stop_replica.v3.request import StopReplicaRequest as StopReplicaRequestV3
from .stop_replica.v3.response import StopReplicaResponse as StopReplicaResponseV3
from .update_metadata.v7.request import UpdateMetadataRequest as UpdateMetadataRequestV7
from .update_metadata.v7.response import UpdateMetadataResponse as UpdateMetadataResponseV7

LEADER_AND_ISR_API_KEY: Final = 4
STOP_REPLICA_API_KEY: Final = 5
UPDATE_METADATA_API_KEY: Final = 6
CONTROLLED_SHUTDOWN_API_KEY: Final = 7

INTERBROKER_MESSAGES: Final[dict[int, dict[int, tuple[type[Payload], type[Payload]]]]] = {
    LEADER_AND_ISR_API_KEY: {
        5: (LeaderAndIsrRequestV5, LeaderAndIsrResponseV5),
    },
    STOP_REPLICA_API_KEY: {
        3: (StopReplicaRequestV3, StopReplicaResponseV3),
    },
    UPDATE_METADATA_API_KEY: {
        7: (UpdateMetadataRequestV7, UpdateMetadataResponseV7),
    },
    CONTROLLED_SHUTDOWN_API_KEY: {
        3: (ControlledShutdownRequestV3, ControlledShutdownResponseV3),
    },
}
"""api key -> api version -> (request class, response class), for every version defined here.

A dispatch table can derive from it which versions of the four api keys exist; treat it as
read-only.
"""

EXTRA_CLIENT_MESSAGES: Final[dict[int, dict[int, tuple[type, type]]]] = {
    0: PRODUCE_LEGACY,
    65: DESCRIBE_TRANSACTIONS,
}
"""Client API versions kio does not carry (Produce v0-v2), or carries in a form that cannot read
Kafka's answers (DescribeTransactions v0: see its module); api key -> version -> classes."""

__all__ = (
    "CONTROLLED_SHUTDOWN_API_KEY",
    "EXTRA_CLIENT_MESSAGES",
    "INTERBROKER_MESSAGES",
    "LEADER_AND_ISR_API_KEY",
    "STOP_REPLICA_API_KEY",
    "UPDATE_METADATA_API_KEY",
    "ControlledShutdownRequestV3",
    "ControlledShutdownResponseV3",
    "LeaderAndIsrRequestV5",
    "LeaderAndIsrResponseV5",
    "LeaderAndIsrType",
    "StopReplicaRequestV3",
    "StopReplicaResponseV3",
    "UpdateMetadataRequestV7",
    "UpdateMetadataResponseV7",
)
