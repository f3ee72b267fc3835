"""Which ACL operation on which resource each API needs, as data (Kafka 3.x `KafkaApis` and
`AclApis`, ZooKeeper mode, checked against 3.6.2).

Handlers ask `AclAuthorizer.authorize` exactly the questions listed here, before doing anything,
and answer a refusal with the AUTHORIZATION_FAILED code of the resource type
(`odradek.security.acl.authorization_error`), changing nothing. `Check.scope` says how a refusal
affects the request:

* `REQUEST`: the whole request is refused with that code (ClusterAction APIs, JoinGroup, ...);
* `PER_RESOURCE`: only the entries naming that resource get the code (the topics of a Produce);
* `FILTER`: unauthorized resources are silently left out (Metadata of all topics, ListGroups);
* `ALTERNATIVE`: the check is an alternative to the one before it in the tuple (CreateTopics:
  CREATE on the cluster, or else CREATE on each topic; Fetch from a follower: CLUSTER_ACTION
  replaces the topic READ checks).

Notes that are not expressible as a single check are in `note`. The table covers the APIs Odradek
serves today plus the ones issue 14 adds (ACL and SCRAM admin APIs, SASL); APIs not listed need no
authorization (ApiVersions, SaslHandshake, SaslAuthenticate) or are not implemented.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from odradek.protocol.codec import ApiKey
from odradek.security.acl import AclOperation, ResourceType

# API keys the project's ApiKey enum does not name yet (the SASL and ACL APIs issue 14 adds).
SASL_HANDSHAKE = 17
DESCRIBE_ACLS = 29
CREATE_ACLS = 30
DELETE_ACLS = 31
SASL_AUTHENTICATE = 36
OFFSET_DELETE = 47
DESCRIBE_CLIENT_QUOTAS = ApiKey.DESCRIBE_CLIENT_QUOTAS
ALTER_CLIENT_QUOTAS = ApiKey.ALTER_CLIENT_QUOTAS
DESCRIBE_USER_SCRAM_CREDENTIALS = 50
ALTER_USER_SCRAM_CREDENTIALS = 51


class Scope(enum.Enum):
    REQUEST = "request"
    PER_RESOURCE = "per resource"
    FILTER = "filter"
    ALTERNATIVE = "alternative"


@dataclass(frozen=True, slots=True)
class Check:
    operation: AclOperation
    resource_type: ResourceType
    resource: str  # which field of the request names the resource ("kafka-cluster" for CLUSTER)
    scope: Scope
    when: str = ""  # a condition; empty = always

    def __str__(self) -> str:
        condition = f" when {self.when}" if self.when else ""
        return (
            f"{self.operation.pascal_name} on {self.resource_type.pascal_name}:{self.resource} "
            f"({self.scope.value}){condition}"
        )


@dataclass(frozen=True, slots=True)
class ApiAuthorization:
    checks: tuple[Check, ...]
    note: str = ""


_CLUSTER = "kafka-cluster"
Op, R = AclOperation, ResourceType
S = Scope


def _cluster(operation: AclOperation, scope: Scope = S.REQUEST, when: str = "") -> Check:
    return Check(operation, R.CLUSTER, _CLUSTER, scope, when)


CLUSTER_ACTION_ONLY = ApiAuthorization(
    (_cluster(Op.CLUSTER_ACTION),),
    "controller-to-broker and broker-to-controller: brokers are super users by principal; the "
    "request must also pass odradek.security.controller_requests (forged-controller defence)",
)

API_AUTHORIZATION: dict[int, ApiAuthorization] = {
    ApiKey.PRODUCE: ApiAuthorization(
        (
            Check(
                Op.WRITE,
                R.TRANSACTIONAL_ID,
                "transactional_id",
                S.REQUEST,
                "batches are transactional",
            ),
            Check(Op.WRITE, R.TOPIC, "topic_data[].name", S.PER_RESOURCE),
        ),
        "idempotence is authorized once, at InitProducerId (KIP-679), not per produce",
    ),
    ApiKey.INIT_PRODUCER_ID: ApiAuthorization(
        (
            Check(
                Op.WRITE,
                R.TRANSACTIONAL_ID,
                "transactional_id",
                S.REQUEST,
                "transactional_id is set",
            ),
            _cluster(Op.IDEMPOTENT_WRITE, S.REQUEST, "transactional_id is null"),
        ),
        "without a transactional id: IDEMPOTENT_WRITE on the cluster, or else "
        "authorize_by_resource_type(WRITE, TOPIC) (KIP-679); refusal is CLUSTER_AUTHORIZATION_FAILED",
    ),
    ApiKey.FETCH: ApiAuthorization(
        (
            Check(Op.READ, R.TOPIC, "topics[].topic", S.PER_RESOURCE, "replica_id < 0 (consumer)"),
            _cluster(Op.CLUSTER_ACTION, S.ALTERNATIVE, "replica_id >= 0 (follower)"),
        ),
        "a follower fetch without CLUSTER_ACTION gets TOPIC_AUTHORIZATION_FAILED on every "
        "partition; it must also pass controller_requests.validate_follower_fetch (KIP-903)",
    ),
    ApiKey.LIST_OFFSETS: ApiAuthorization(
        (Check(Op.DESCRIBE, R.TOPIC, "topics[].name", S.PER_RESOURCE),)
    ),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: ApiAuthorization(
        (
            _cluster(Op.CLUSTER_ACTION, S.REQUEST),
            Check(Op.DESCRIBE, R.TOPIC, "topics[].topic", S.ALTERNATIVE),
        ),
        "CLUSTER_ACTION (followers) allows every topic; otherwise DESCRIBE per topic (KIP-320)",
    ),
    ApiKey.METADATA: ApiAuthorization(
        (
            Check(Op.DESCRIBE, R.TOPIC, "topics[].name", S.FILTER),
            _cluster(Op.CREATE, S.REQUEST, "auto-creating missing topics"),
            Check(
                Op.CREATE, R.TOPIC, "missing topic", S.ALTERNATIVE, "auto-creating missing topics"
            ),
        ),
        "all-topics requests silently omit undescribable topics; named topics get "
        "TOPIC_AUTHORIZATION_FAILED without revealing whether they exist",
    ),
    ApiKey.OFFSET_COMMIT: ApiAuthorization(
        (
            Check(Op.READ, R.GROUP, "group_id", S.REQUEST),
            Check(Op.READ, R.TOPIC, "topics[].name", S.PER_RESOURCE),
        )
    ),
    ApiKey.OFFSET_FETCH: ApiAuthorization(
        (
            Check(Op.DESCRIBE, R.GROUP, "group_id / groups[].group_id", S.REQUEST),
            Check(Op.DESCRIBE, R.TOPIC, "topics[].name", S.PER_RESOURCE),
        ),
        "when all partitions are asked for, undescribable topics are filtered out",
    ),
    ApiKey.FIND_COORDINATOR: ApiAuthorization(
        (
            Check(Op.DESCRIBE, R.GROUP, "key / coordinator_keys[]", S.PER_RESOURCE, "key_type = 0"),
            Check(
                Op.DESCRIBE,
                R.TRANSACTIONAL_ID,
                "key / coordinator_keys[]",
                S.PER_RESOURCE,
                "key_type = 1",
            ),
        )
    ),
    ApiKey.JOIN_GROUP: ApiAuthorization((Check(Op.READ, R.GROUP, "group_id", S.REQUEST),)),
    ApiKey.SYNC_GROUP: ApiAuthorization((Check(Op.READ, R.GROUP, "group_id", S.REQUEST),)),
    ApiKey.HEARTBEAT: ApiAuthorization((Check(Op.READ, R.GROUP, "group_id", S.REQUEST),)),
    ApiKey.LEAVE_GROUP: ApiAuthorization((Check(Op.READ, R.GROUP, "group_id", S.REQUEST),)),
    ApiKey.DESCRIBE_GROUPS: ApiAuthorization(
        (Check(Op.DESCRIBE, R.GROUP, "groups[]", S.PER_RESOURCE),)
    ),
    ApiKey.LIST_GROUPS: ApiAuthorization(
        (
            _cluster(Op.DESCRIBE, S.REQUEST),
            Check(Op.DESCRIBE, R.GROUP, "each listed group", S.FILTER),
        ),
        "with DESCRIBE on the cluster every group is listed; otherwise only describable groups",
    ),
    ApiKey.DELETE_GROUPS: ApiAuthorization(
        (Check(Op.DELETE, R.GROUP, "groups_names[]", S.PER_RESOURCE),)
    ),
    OFFSET_DELETE: ApiAuthorization(
        (
            Check(Op.DELETE, R.GROUP, "group_id", S.REQUEST),
            Check(Op.READ, R.TOPIC, "topics[].name", S.PER_RESOURCE),
        )
    ),
    ApiKey.CREATE_TOPICS: ApiAuthorization(
        (
            _cluster(Op.CREATE, S.REQUEST),
            Check(Op.CREATE, R.TOPIC, "topics[].name", S.ALTERNATIVE),
            Check(
                Op.DESCRIBE_CONFIGS, R.TOPIC, "topics[].name", S.PER_RESOURCE, "returning configs"
            ),
        ),
        "without DESCRIBE_CONFIGS the created topic's configs are replaced by "
        "topic_config_error_code = TOPIC_AUTHORIZATION_FAILED",
    ),
    ApiKey.DELETE_TOPICS: ApiAuthorization(
        (
            Check(Op.DESCRIBE, R.TOPIC, "topics[].name", S.PER_RESOURCE, "named by topic id"),
            Check(Op.DELETE, R.TOPIC, "topics[].name / topic_names[]", S.PER_RESOURCE),
        )
    ),
    ApiKey.CREATE_PARTITIONS: ApiAuthorization(
        (Check(Op.ALTER, R.TOPIC, "topics[].name", S.PER_RESOURCE),)
    ),
    ApiKey.DESCRIBE_CONFIGS: ApiAuthorization(
        (
            _cluster(Op.DESCRIBE_CONFIGS, S.PER_RESOURCE, "resource type BROKER / BROKER_LOGGER"),
            Check(
                Op.DESCRIBE_CONFIGS, R.TOPIC, "resources[].resource_name", S.PER_RESOURCE, "TOPIC"
            ),
        )
    ),
    ApiKey.ALTER_CONFIGS: ApiAuthorization(
        (
            _cluster(Op.ALTER_CONFIGS, S.PER_RESOURCE, "resource type BROKER / BROKER_LOGGER"),
            Check(Op.ALTER_CONFIGS, R.TOPIC, "resources[].resource_name", S.PER_RESOURCE, "TOPIC"),
        )
    ),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: ApiAuthorization(
        (
            _cluster(Op.ALTER_CONFIGS, S.PER_RESOURCE, "resource type BROKER / BROKER_LOGGER"),
            Check(Op.ALTER_CONFIGS, R.TOPIC, "resources[].resource_name", S.PER_RESOURCE, "TOPIC"),
        )
    ),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: ApiAuthorization((_cluster(Op.ALTER),)),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: ApiAuthorization((_cluster(Op.DESCRIBE),)),
    ApiKey.ELECT_LEADERS: ApiAuthorization((_cluster(Op.ALTER),)),
    ApiKey.DESCRIBE_LOG_DIRS: ApiAuthorization((_cluster(Op.DESCRIBE),)),
    ApiKey.DELETE_RECORDS: ApiAuthorization(
        (Check(Op.DELETE, R.TOPIC, "topics[].name", S.PER_RESOURCE),)
    ),
    ApiKey.DESCRIBE_CLUSTER: ApiAuthorization(
        (), "no check; cluster_authorized_operations is filled only with DESCRIBE on the cluster"
    ),
    # Transactions (issue 18): as Kafka 3.9's KafkaApis.
    ApiKey.ADD_PARTITIONS_TO_TXN: ApiAuthorization(
        (
            Check(Op.WRITE, R.TRANSACTIONAL_ID, "transactional_id", S.REQUEST),
            Check(Op.WRITE, R.TOPIC, "topics[].name", S.PER_RESOURCE),
        ),
        "v4+ (broker-to-broker batches) needs CLUSTER_ACTION instead; refused topics get "
        "TOPIC_AUTHORIZATION_FAILED and the others OPERATION_NOT_ATTEMPTED",
    ),
    ApiKey.ADD_OFFSETS_TO_TXN: ApiAuthorization(
        (
            Check(Op.WRITE, R.TRANSACTIONAL_ID, "transactional_id", S.REQUEST),
            Check(Op.READ, R.GROUP, "group_id", S.REQUEST),
        )
    ),
    ApiKey.END_TXN: ApiAuthorization(
        (Check(Op.WRITE, R.TRANSACTIONAL_ID, "transactional_id", S.REQUEST),)
    ),
    ApiKey.WRITE_TXN_MARKERS: ApiAuthorization(
        (_cluster(Op.CLUSTER_ACTION),), "sent by transaction coordinators to partition leaders"
    ),
    ApiKey.TXN_OFFSET_COMMIT: ApiAuthorization(
        (
            Check(Op.WRITE, R.TRANSACTIONAL_ID, "transactional_id", S.REQUEST),
            Check(Op.READ, R.GROUP, "group_id", S.REQUEST),
            Check(Op.READ, R.TOPIC, "topics[].name", S.PER_RESOURCE),
        )
    ),
    ApiKey.DESCRIBE_TRANSACTIONS: ApiAuthorization(
        (
            Check(Op.DESCRIBE, R.TRANSACTIONAL_ID, "transactional_ids[]", S.PER_RESOURCE),
            Check(Op.DESCRIBE, R.TOPIC, "each topic of a described transaction", S.FILTER),
        ),
        "topics the principal may not describe are left out of a described transaction",
    ),
    ApiKey.LIST_TRANSACTIONS: ApiAuthorization(
        (Check(Op.DESCRIBE, R.TRANSACTIONAL_ID, "each listed transactional id", S.FILTER),)
    ),
    ApiKey.DESCRIBE_PRODUCERS: ApiAuthorization(
        (Check(Op.READ, R.TOPIC, "topics[].name", S.PER_RESOURCE),)
    ),
    DESCRIBE_ACLS: ApiAuthorization((_cluster(Op.DESCRIBE),)),
    CREATE_ACLS: ApiAuthorization((_cluster(Op.ALTER),)),
    DELETE_ACLS: ApiAuthorization((_cluster(Op.ALTER),)),
    DESCRIBE_CLIENT_QUOTAS: ApiAuthorization((_cluster(Op.DESCRIBE_CONFIGS),)),
    ALTER_CLIENT_QUOTAS: ApiAuthorization(
        (_cluster(Op.ALTER_CONFIGS),), "a refusal fails every entry of the request"
    ),
    DESCRIBE_USER_SCRAM_CREDENTIALS: ApiAuthorization((_cluster(Op.DESCRIBE),)),
    ALTER_USER_SCRAM_CREDENTIALS: ApiAuthorization(
        (_cluster(Op.ALTER),),
        "Kafka also refuses, with an error per user, a change to the credentials of a user "
        "authenticated by delegation token",
    ),
    ApiKey.LEADER_AND_ISR: CLUSTER_ACTION_ONLY,
    ApiKey.STOP_REPLICA: CLUSTER_ACTION_ONLY,
    ApiKey.UPDATE_METADATA: CLUSTER_ACTION_ONLY,
    ApiKey.CONTROLLED_SHUTDOWN: CLUSTER_ACTION_ONLY,
    ApiKey.API_VERSIONS: ApiAuthorization((), "always allowed, also before authentication"),
    SASL_HANDSHAKE: ApiAuthorization((), "handled by the authenticator, never by handlers"),
    SASL_AUTHENTICATE: ApiAuthorization((), "handled by the authenticator, never by handlers"),
}


def checks_for(api_key: int) -> ApiAuthorization:
    """The authorization an API needs; KeyError for an API the table does not cover (a handler
    added without deciding its ACLs is a bug: a test asserts every served API is covered)."""
    return API_AUTHORIZATION[api_key]
