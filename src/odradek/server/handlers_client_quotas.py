"""DescribeClientQuotas (48) and AlterClientQuotas (49), KIP-546: client quotas in ZooKeeper
(`odradek.server.quota.store`), with Kafka 3.9's ZooKeeper-mode validation
(`odradek.server.quota.admin`).

* Describe needs DESCRIBE_CONFIGS on the cluster (else CLUSTER_AUTHORIZATION_FAILED for the
  request); a bad filter is answered with its error code and message, no entries.
* Alter needs ALTER_CONFIGS on the cluster (else CLUSTER_AUTHORIZATION_FAILED for every entry).
  Each entry is validated and written on its own (a read-modify-write of its znode that keeps the
  user's SCRAM credentials), announced under `/config/changes`, and applied on this broker at once;
  the other brokers follow the notification. `validate_only` writes nothing.

Any broker answers both (as Kafka in ZooKeeper mode without forwarding).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.errors import KafkaError
from odradek.protocol.build import build_response
from odradek.server.authorization import (
    ALTER_CONFIGS,
    CLUSTER_AUTHORIZATION_FAILED,
    DESCRIBE_CONFIGS,
)
from odradek.server.quota import admin
from odradek.zk.errors import ZkError

if TYPE_CHECKING:
    from odradek.network.request_context import RequestContext
    from odradek.server.services import BrokerServices

log = logging.getLogger(__name__)


def handle_describe_client_quotas(
    broker: BrokerServices, context: RequestContext, request: Any
) -> Any:
    header = context.header
    if not broker.authorizer.cluster(context, DESCRIBE_CONFIGS):
        return build_response(
            header,
            {
                "error_code": CLUSTER_AUTHORIZATION_FAILED,
                "error_message": "Cluster authorization failed.",
                "entries": None,
            },
        )
    components = [
        admin.Component(c.entity_type, int(c.match_type), c.match) for c in request.components
    ]

    async def describe() -> Any:
        try:
            found = admin.describe(
                await broker.quotas.store.all_configs(), components, bool(request.strict)
            )
        except KafkaError as e:
            return build_response(
                header, {"error_code": e.code, "error_message": str(e), "entries": None}
            )
        except ZkError as e:
            log.warning("DescribeClientQuotas: %s", e)
            return build_response(
                header,
                {
                    "error_code": ErrorCode.unknown_server_error,
                    "error_message": f"cannot read the quotas from ZooKeeper: {e}",
                    "entries": None,
                },
            )
        entries = [
            {
                "entity": [
                    {"entity_type": t, "entity_name": name} for t, name in admin.wire_entity(e)
                ],
                "values": [{"key": k, "value": v} for k, v in sorted(values.items())],
            }
            for e, values in found
        ]
        return build_response(
            header, {"error_code": ErrorCode.none, "error_message": None, "entries": entries}
        )

    return describe()


def handle_alter_client_quotas(
    broker: BrokerServices, context: RequestContext, request: Any
) -> Any:
    header = context.header
    authorized = broker.authorizer.cluster(context, ALTER_CONFIGS)
    validate_only = bool(request.validate_only)

    async def alter_one(entry: Any) -> tuple[ErrorCode, str | None]:
        if not authorized:
            return CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed."
        try:
            entity = admin.parse_entity((e.entity_type, e.entity_name) for e in entry.entity)
            ops = [(op.key, float(op.value), bool(op.remove)) for op in entry.ops]
            admin.apply_ops({}, ops)  # validates every op before anything is written
            if not validate_only:
                await broker.quotas.store.alter_config(
                    entity, lambda config: admin.apply_ops(config, ops)
                )
        except KafkaError as e:
            return e.code, str(e)
        except ZkError as e:
            log.warning("AlterClientQuotas: %s", e)
            return ErrorCode.unknown_server_error, f"cannot write the quotas to ZooKeeper: {e}"
        return ErrorCode.none, None

    async def alter() -> Any:
        entries = []
        for entry in request.entries:
            code, message = await alter_one(entry)
            entries.append(
                {
                    "error_code": code,
                    "error_message": message,
                    "entity": [
                        {"entity_type": e.entity_type, "entity_name": e.entity_name}
                        for e in entry.entity
                    ],
                }
            )
        return build_response(header, {"entries": entries})

    return alter()
