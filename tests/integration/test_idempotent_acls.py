"""InitProducerId on the secure cluster: Kafka's ACL rules (KIP-679).

Without a transactional id a principal needs IDEMPOTENT_WRITE on the cluster or WRITE on some
topic, else CLUSTER_AUTHORIZATION_FAILED; with one, WRITE on that transactional id, else
TRANSACTIONAL_ID_AUTHORIZATION_FAILED (checked before the transaction coordinator is asked).
"""

from __future__ import annotations

from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)
from kio.schema.errors import ErrorCode

from odradek.protocol.codec import ApiKey
from tests.fixtures.cluster import wait_until
from tests.fixtures.secure import SecureEnv
from tests.integration.test_security_refusals import _add_user, _connect, _login, _name, _user


def _init_producer_id(
    env: SecureEnv, identity: object, transactional_id: str | None = None
) -> ErrorCode:
    with _connect(env, identity) as connection:  # type: ignore[arg-type]
        assert _login(connection, identity)[0] == ErrorCode.none  # type: ignore[arg-type]
        response = connection.request(
            ApiKey.INIT_PRODUCER_ID,
            4,
            {
                "transactional_id": transactional_id,
                "transaction_timeout": 60_000,
                "producer_id": -1,
                "producer_epoch": -1,
            },
        )
    return ErrorCode(response.error_code)


def test_init_producer_id_needs_idempotent_write_or_write_on_a_topic(
    secure_cluster: SecureEnv,
) -> None:
    user, password = _name("ivan"), "ivan-password"
    _add_user(secure_cluster, user, password)
    ivan = _user(secure_cluster, user, password)
    assert _init_producer_id(secure_cluster, ivan) == ErrorCode.cluster_authorization_failed
    assert (
        _init_producer_id(secure_cluster, ivan, "tx-ivan")
        == ErrorCode.transactional_id_authorization_failed
    )
    # WRITE on any one topic is enough for an idempotent producer (KIP-679).
    binding = AclBinding(
        ResourceType.TOPIC,
        _name("ivan-topic"),
        ResourcePatternType.LITERAL,
        f"User:{user}",
        "*",
        AclOperation.WRITE,
        AclPermissionType.ALLOW,
    )
    admin = secure_cluster.admin()  # held: the futures die with their client
    for future in admin.create_acls([binding]).values():
        future.result(timeout=30)
    wait_until(
        lambda: _init_producer_id(secure_cluster, ivan) == ErrorCode.none,
        15,
        "InitProducerId to be allowed once ivan may write a topic",
    )
    # The ordinary client user of the secure cluster may write every topic.
    assert _init_producer_id(secure_cluster, secure_cluster.identity("sasl_ssl")) == ErrorCode.none
