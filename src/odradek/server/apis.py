"""Request dispatch: which APIs and versions this broker implements, and the handler of each.

`SUPPORTED_VERSIONS` is the single source of truth for ApiVersions: the broker advertises exactly the
APIs it has a handler for, in exactly the version ranges those handlers understand (librdkafka picks
features from this list, so advertising anything more would invite requests we cannot answer).

Handlers live in modules by area (`handlers_produce`, `handlers_fetch`, `handlers_metadata`,
`handlers_admin`, `handlers_log_admin`, `handlers_configs`, `handlers_elect_leaders`, `handlers_reassignment`,
`handlers_interbroker`, `handlers_producer_ids`, `handlers_client_quotas`, and the group coordinator's `odradek.coordinator.group.handlers` and
`handlers_offsets`); each is
`handle(services, context, request) -> response | awaitable`, where `context` is the request's
own `RequestContext` (header, client address, principal): per-request state travels with the
request, never on this shared object.
A request for an unknown API or an unsupported version closes the connection (as Kafka does), except
ApiVersions, which is answered with UNSUPPORTED_VERSION and the supported list in a v0 response
(KIP-511), so that a newer client can retry with an older version.

With `request_percentage` quotas configured, every client API but Produce and Fetch (which
account for their own) runs under `odradek.server.quota.throttling.throttle_request`.

Concurrency: called on the broker's event loop thread by the socket server, in request order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode

from odradek.coordinator.group import handlers as handlers_groups
from odradek.coordinator.group import handlers_offsets
from odradek.coordinator.transaction import handlers as handlers_transactions
from odradek.network.request_context import RequestContext
from odradek.protocol.build import build, build_response
from odradek.protocol.codec import (
    ApiKey,
    ProtocolError,
    RequestHeader,
    decode_request_body,
)
from odradek.security.api_acls import (
    ALTER_CLIENT_QUOTAS,
    ALTER_USER_SCRAM_CREDENTIALS,
    CREATE_ACLS,
    DELETE_ACLS,
    DESCRIBE_ACLS,
    DESCRIBE_CLIENT_QUOTAS,
    DESCRIBE_USER_SCRAM_CREDENTIALS,
    SASL_AUTHENTICATE,
)
from odradek.server import (
    handlers_acls,
    handlers_admin,
    handlers_client_quotas,
    handlers_configs,
    handlers_elect_leaders,
    handlers_fetch,
    handlers_interbroker,
    handlers_log_admin,
    handlers_metadata,
    handlers_produce,
    handlers_producer_ids,
    handlers_reassignment,
    handlers_scram,
    handlers_txn,
)
from odradek.server.authorization_groups import authorized_group_handlers
from odradek.server.quota.throttling import request_quota_applies, throttle_request
from odradek.server.services import BrokerServices

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    ApiKey.PRODUCE: (0, 9),
    # Fetch 13+ names topics by id (KIP-516); 15 carries a follower's broker epoch (KIP-903).
    ApiKey.FETCH: (4, 15),
    ApiKey.LIST_OFFSETS: (1, 7),
    ApiKey.METADATA: (1, 12),
    ApiKey.LEADER_AND_ISR: (5, 5),
    ApiKey.STOP_REPLICA: (3, 3),
    ApiKey.UPDATE_METADATA: (7, 7),
    ApiKey.CONTROLLED_SHUTDOWN: (3, 3),
    ApiKey.API_VERSIONS: (0, 3),
    # Idempotent producers (handlers_producer_ids); transactional ids await the coordinator.
    ApiKey.INIT_PRODUCER_ID: (0, 5),
    ApiKey.CREATE_TOPICS: (2, 7),
    ApiKey.DELETE_TOPICS: (1, 6),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (2, 4),
    ApiKey.DESCRIBE_CONFIGS: (1, 4),
    ApiKey.ALTER_CONFIGS: (0, 2),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ApiKey.CREATE_PARTITIONS: (0, 3),
    # KIP-455 reassignment (handlers_reassignment): v0 only (v1 of Alter adds allow_replication_
    # factor_change, which this controller does not implement).
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: (0, 0),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: (0, 0),
    ApiKey.ELECT_LEADERS: (0, 2),
    # Consumer groups (handlers_groups): the ranges of Kafka 3.x in ZooKeeper mode, bounded below
    # by the oldest version kio describes.
    ApiKey.FIND_COORDINATOR: (0, 4),
    ApiKey.JOIN_GROUP: (0, 9),
    ApiKey.SYNC_GROUP: (0, 5),
    ApiKey.HEARTBEAT: (0, 4),
    ApiKey.LEAVE_GROUP: (0, 5),
    ApiKey.OFFSET_COMMIT: (2, 8),
    ApiKey.OFFSET_FETCH: (1, 8),
    ApiKey.LIST_GROUPS: (0, 4),
    ApiKey.DESCRIBE_GROUPS: (0, 5),
    ApiKey.DELETE_GROUPS: (0, 2),
    ApiKey.OFFSET_DELETE: (0, 0),
    # handlers_log_admin: Kafka 3.9's ranges (DescribeLogDirs v0 is not in kio; it equals v1).
    ApiKey.DELETE_RECORDS: (0, 2),
    ApiKey.DESCRIBE_LOG_DIRS: (1, 4),
    ApiKey.DESCRIBE_CLUSTER: (0, 1),
    # Security (issue 14). SASL is answered by the connection's authenticator on SASL listeners
    # and advertised on every listener, as Kafka does; the ACL APIs from v1 (pattern types).
    ApiKey.SASL_HANDSHAKE: (0, 1),
    SASL_AUTHENTICATE: (0, 2),
    DESCRIBE_ACLS: (1, 3),
    CREATE_ACLS: (1, 3),
    DELETE_ACLS: (1, 3),
    DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    # Client quotas (handlers_client_quotas, odradek.server.quota): Kafka 3.9's ranges.
    DESCRIBE_CLIENT_QUOTAS: (0, 1),
    ALTER_CLIENT_QUOTAS: (0, 1),
    # Transactions (issue 18; handlers_txn and odradek.coordinator.transaction.handlers): Kafka
    # 3.9's ranges, except the KIP-890 part 2 versions (AddPartitionsToTxn 5, which clients use
    # only with transaction.version 2, a KRaft feature). WriteTxnMarkers v0 is not in kio; v1 is
    # what every Kafka 2.x+ coordinator sends.
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 4),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 4),
    ApiKey.END_TXN: (0, 4),
    ApiKey.WRITE_TXN_MARKERS: (1, 1),
    ApiKey.TXN_OFFSET_COMMIT: (0, 4),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 1),
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
}

Handler = Callable[[BrokerServices, RequestContext, Any], Any]


class KafkaApis:
    """Dispatches decoded requests to handlers. Event-loop thread only."""

    def __init__(self, services: BrokerServices) -> None:
        self.services = services
        handlers: dict[int, Handler] = {
            ApiKey.API_VERSIONS: handle_api_versions,
            ApiKey.PRODUCE: handlers_produce.handle_produce,
            ApiKey.INIT_PRODUCER_ID: handlers_producer_ids.handle_init_producer_id,
            ApiKey.FETCH: handlers_fetch.handle_fetch,
            ApiKey.LIST_OFFSETS: handlers_fetch.handle_list_offsets,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: handlers_fetch.handle_offset_for_leader_epoch,
            ApiKey.METADATA: handlers_metadata.handle_metadata,
            ApiKey.CREATE_TOPICS: handlers_admin.handle_create_topics,
            ApiKey.DELETE_TOPICS: handlers_admin.handle_delete_topics,
            ApiKey.DESCRIBE_CONFIGS: handlers_configs.handle_describe_configs,
            ApiKey.ALTER_CONFIGS: handlers_configs.handle_alter_configs,
            ApiKey.INCREMENTAL_ALTER_CONFIGS: handlers_configs.handle_incremental_alter_configs,
            ApiKey.CREATE_PARTITIONS: handlers_configs.handle_create_partitions,
            ApiKey.ALTER_PARTITION_REASSIGNMENTS: (
                handlers_reassignment.handle_alter_partition_reassignments
            ),
            ApiKey.LIST_PARTITION_REASSIGNMENTS: (
                handlers_reassignment.handle_list_partition_reassignments
            ),
            ApiKey.ELECT_LEADERS: handlers_elect_leaders.handle_elect_leaders,
            ApiKey.DELETE_RECORDS: handlers_log_admin.handle_delete_records,
            ApiKey.DESCRIBE_LOG_DIRS: handlers_log_admin.handle_describe_log_dirs,
            ApiKey.DESCRIBE_CLUSTER: handlers_log_admin.handle_describe_cluster,
            ApiKey.LEADER_AND_ISR: handlers_interbroker.handle_leader_and_isr,
            ApiKey.UPDATE_METADATA: handlers_interbroker.handle_update_metadata,
            ApiKey.STOP_REPLICA: handlers_interbroker.handle_stop_replica,
            ApiKey.CONTROLLED_SHUTDOWN: handlers_interbroker.handle_controlled_shutdown,
            # Key type 0 (groups) goes on to the group coordinator's handler.
            ApiKey.FIND_COORDINATOR: handlers_transactions.handle_find_coordinator,
            ApiKey.JOIN_GROUP: handlers_groups.handle_join_group,
            ApiKey.SYNC_GROUP: handlers_groups.handle_sync_group,
            ApiKey.HEARTBEAT: handlers_groups.handle_heartbeat,
            ApiKey.LEAVE_GROUP: handlers_groups.handle_leave_group,
            ApiKey.OFFSET_COMMIT: handlers_offsets.handle_offset_commit,
            ApiKey.OFFSET_FETCH: handlers_offsets.handle_offset_fetch,
            ApiKey.OFFSET_DELETE: handlers_offsets.handle_offset_delete,
            ApiKey.LIST_GROUPS: handlers_groups.handle_list_groups,
            ApiKey.DESCRIBE_GROUPS: handlers_groups.handle_describe_groups,
            ApiKey.DELETE_GROUPS: handlers_groups.handle_delete_groups,
            ApiKey.SASL_HANDSHAKE: handlers_scram.handle_sasl_handshake,
            SASL_AUTHENTICATE: handlers_scram.handle_sasl_authenticate,
            DESCRIBE_ACLS: handlers_acls.handle_describe_acls,
            CREATE_ACLS: handlers_acls.handle_create_acls,
            DELETE_ACLS: handlers_acls.handle_delete_acls,
            DESCRIBE_USER_SCRAM_CREDENTIALS: handlers_scram.handle_describe_user_scram_credentials,
            ALTER_USER_SCRAM_CREDENTIALS: handlers_scram.handle_alter_user_scram_credentials,
            DESCRIBE_CLIENT_QUOTAS: handlers_client_quotas.handle_describe_client_quotas,
            ALTER_CLIENT_QUOTAS: handlers_client_quotas.handle_alter_client_quotas,
            ApiKey.ADD_PARTITIONS_TO_TXN: handlers_txn.handle_add_partitions_to_txn,
            ApiKey.ADD_OFFSETS_TO_TXN: handlers_txn.handle_add_offsets_to_txn,
            ApiKey.END_TXN: handlers_txn.handle_end_txn,
            ApiKey.WRITE_TXN_MARKERS: handlers_txn.handle_write_txn_markers,
            ApiKey.TXN_OFFSET_COMMIT: handlers_txn.handle_txn_offset_commit,
            ApiKey.DESCRIBE_TRANSACTIONS: handlers_txn.handle_describe_transactions,
            ApiKey.LIST_TRANSACTIONS: handlers_txn.handle_list_transactions,
            ApiKey.DESCRIBE_PRODUCERS: handlers_txn.handle_describe_producers,
        }
        # The group coordinator knows nothing of ACLs: its handlers are wrapped.
        self.handlers = authorized_group_handlers(handlers)
        missing = set(SUPPORTED_VERSIONS) - set(self.handlers)
        if missing:
            raise RuntimeError(f"advertised APIs without handlers: {sorted(missing)}")

    def dispatch(self, context: RequestContext, frame: bytes) -> Any:
        header = context.header
        versions = SUPPORTED_VERSIONS.get(header.api_key)
        if versions is None:
            raise ProtocolError(f"unsupported api key {header.api_key}")
        low, high = versions
        if not low <= header.api_version <= high:
            if header.api_key == ApiKey.API_VERSIONS:
                return _api_versions_unsupported(header)
            raise ProtocolError(
                f"unsupported version {header.api_version} of api {ApiKey(header.api_key).name}"
            )
        request = decode_request_body(header, frame)
        handler = self.handlers[header.api_key]
        quotas = self.services.quotas.client
        if request_quota_applies(quotas, header.api_key):  # client quotas: request_percentage
            return throttle_request(
                quotas, context, lambda: handler(self.services, context, request)
            )
        return handler(self.services, context, request)


def answer_api_versions(header: RequestHeader, frame: bytes) -> Any:
    """ApiVersions for a connection that has not authenticated yet (SASL listeners)."""
    low, high = SUPPORTED_VERSIONS[ApiKey.API_VERSIONS]
    if not low <= header.api_version <= high:
        return _api_versions_unsupported(header)
    return build_response(
        header, {"error_code": ErrorCode.none, "api_keys": _api_keys(), "throttle_time": 0}
    )


def _api_keys() -> list[dict[str, int]]:
    return [
        {"api_key": key, "min_version": low, "max_version": high}
        for key, (low, high) in sorted(SUPPORTED_VERSIONS.items())
    ]


def handle_api_versions(services: BrokerServices, context: RequestContext, request: Any) -> Any:
    # The v3 response has top-level tagged fields (supported/finalized features); we send none of
    # them: librdkafka 2.0.2 (Debian's kcat) fails to parse some of them.
    return build_response(
        context.header,
        {"error_code": ErrorCode.none, "api_keys": _api_keys(), "throttle_time": 0},
    )


def _api_versions_unsupported(header: RequestHeader) -> Any:
    from kio.schema.api_versions.v0.response import ApiVersionsResponse

    # Answered in v0 whatever version was asked: the client can always read that (KIP-511).
    return build(
        ApiVersionsResponse,
        {"error_code": ErrorCode.unsupported_version, "api_keys": _api_keys()},
    )
