"""InitProducerId (api key 22, versions 0-5): a producer id and epoch for a producer.

As Kafka 3.9's `KafkaApis.handleInitProducerIdRequest` and `TransactionCoordinator`:

1. Authorization. With a transactional id: WRITE on that TRANSACTIONAL_ID, else
   TRANSACTIONAL_ID_AUTHORIZATION_FAILED. Without one: IDEMPOTENT_WRITE on the cluster, or WRITE
   on any topic (KIP-679: a producer allowed to write somewhere may be idempotent), else
   CLUSTER_AUTHORIZATION_FAILED.
2. v3+ may carry the producer's current id and epoch (KIP-360): both -1, or both set; one
   without the other is INVALID_REQUEST.
3. Without a transactional id the request is accepted blindly: a fresh producer id from the
   `ProducerIdManager` (blocks reserved in ZooKeeper) with epoch 0, whatever id and epoch the
   producer sent -- Kafka does the same; an idempotent producer that must reset its sequences
   bumps its epoch itself and the partition leaders accept the new epoch at sequence 0.
4. With a transactional id the transaction coordinator answers (`init_transactional_producer_id`,
   `odradek.coordinator.transaction.coordinator`: epoch bumps, fencing, KIP-360).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.errors import KafkaError
from odradek.protocol.build import build_response
from odradek.security.acl import AclOperation, ResourceType
from odradek.server.authorization import CLUSTER_AUTHORIZATION_FAILED, TOPIC, WRITE

if TYPE_CHECKING:
    from odradek.network.request_context import RequestContext
    from odradek.server.services import BrokerServices

log = logging.getLogger(__name__)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1


def _answer(
    context: RequestContext, error: ErrorCode, producer_id: int = -1, epoch: int = -1
) -> Any:
    return build_response(
        context.header,
        {
            "throttle_time": 0,
            "error_code": error,
            "producer_id": producer_id,
            "producer_epoch": epoch,
        },
    )


def handle_init_producer_id(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    transactional_id = request.transactional_id
    authorizer = broker.authorizer
    if transactional_id is not None:
        if not authorizer.allowed(
            context, WRITE, ResourceType.TRANSACTIONAL_ID, str(transactional_id)
        ):
            return _answer(context, ErrorCode.transactional_id_authorization_failed)
    elif not authorizer.cluster(
        context, AclOperation.IDEMPOTENT_WRITE, log_if_denied=False
    ) and not authorizer.any_of_type(context, WRITE, TOPIC):
        return _answer(context, CLUSTER_AUTHORIZATION_FAILED)
    producer_id = int(getattr(request, "producer_id", NO_PRODUCER_ID))
    producer_epoch = int(getattr(request, "producer_epoch", NO_PRODUCER_EPOCH))
    if (producer_id == NO_PRODUCER_ID) != (producer_epoch == NO_PRODUCER_EPOCH):
        return _answer(context, ErrorCode.invalid_request)
    if transactional_id is not None:
        return init_transactional_producer_id(broker, context, request)

    async def fresh_producer_id() -> Any:
        try:
            new_id = await broker.producer_id_manager.generate_producer_id()
        except KafkaError as e:
            log.warning("InitProducerId: no producer id: %s", e)
            return _answer(context, e.code)
        return _answer(context, ErrorCode.none, new_id, 0)

    return fresh_producer_id()


def init_transactional_producer_id(
    broker: BrokerServices, context: RequestContext, request: Any
) -> Any:
    """InitProducerId with a transactional id: the transaction coordinator's answer."""
    from odradek.coordinator.transaction.handlers import init_transactional_producer

    return init_transactional_producer(broker, context, request)
