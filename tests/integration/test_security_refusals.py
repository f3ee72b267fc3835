"""What the secure cluster refuses, with which code, and that a refusal changes nothing (issue 14,
item 8): wrong passwords and unknown users (SCRAM and PLAIN), untrusted and expired client
certificates, principals without ACLs, requests before authentication, controller and follower
requests from a non-broker principal; and ACL changes reaching every broker within seconds.

Refusals are observed twice where it matters: on the wire (the exact Kafka error code, with the
project's raw connection) and through a real client (what its user would see). "Nothing written"
is checked with the super user's view of the end offsets.
"""

from __future__ import annotations

import datetime
import ssl
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    NewTopic,
    OffsetSpec,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from cryptography import x509
from cryptography.x509.oid import NameOID
from kio.schema.errors import ErrorCode

from odradek.protocol.codec import ApiKey
from odradek.security.certificates import (
    certificate_pem,
    create_ca,
    issue_certificate,
    key_pem,
)
from odradek.security.sasl_plain import plain_client_message
from odradek.security.sasl_scram import ScramClient
from odradek.security.scram import ScramMechanism as OurScram
from tests.fixtures.cluster import wait_until
from tests.fixtures.secure import SecureEnv
from tests.integration._secure_clients import Identity, librdkafka_config
from tests.integration._wire import ConnectionClosed, NoAnswer, WireConnection

SASL_AUTHENTICATE = 36
PROPAGATION_LIMIT_S = 5.0


# -- helpers ------------------------------------------------------------------------------------


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _tls(
    env: SecureEnv, certificate: Path | None = None, key: Path | None = None
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(env.setup.pki.ca_certificate))
    if certificate is not None:
        context.load_cert_chain(str(certificate), str(key))
    return context


def _connect(env: SecureEnv, identity: Identity, address: str | None = None) -> WireConnection:
    context = _tls(env, identity.certificate, identity.key) if identity.tls else None
    return WireConnection.to(address or identity.bootstrap, ssl_context=context)


def _login(connection: WireConnection, identity: Identity) -> tuple[int, str | None]:
    """SaslHandshake v1 + SaslAuthenticate v2: (error code, message) of the last step."""
    handshake = connection.request(
        ApiKey.SASL_HANDSHAKE, 1, {"mechanism": identity.mechanism or ""}
    )
    if handshake.error_code != ErrorCode.none:
        return int(handshake.error_code), None

    def step(token: bytes) -> object:
        return connection.request(SASL_AUTHENTICATE, 2, {"auth_bytes": token})

    username, password = identity.username or "", identity.password or ""
    if identity.mechanism == "PLAIN":
        answer = step(plain_client_message(username, password))
        return int(answer.error_code), answer.error_message
    mechanism = OurScram.from_name(identity.mechanism or "")
    assert mechanism is not None
    client = ScramClient(mechanism, username, password)
    first = step(client.first_message())
    if first.error_code != ErrorCode.none:
        return int(first.error_code), first.error_message
    final = step(client.final_message(bytes(first.auth_bytes)))
    return int(final.error_code), final.error_message


def _metadata_error(connection: WireConnection, topic: str) -> int:
    response = connection.request(
        ApiKey.METADATA, 12, {"topics": [{"name": topic}], "allow_auto_topic_creation": False}
    )
    return int(response.topics[0].error_code)


def _end_offsets(env: SecureEnv, topic: str, partitions: int = 1) -> dict[int, int]:
    admin = env.admin()
    request = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}
    result = admin.list_offsets(request)
    return {tp.partition: future.result(timeout=30).offset for tp, future in result.items()}


def _create(env: SecureEnv, topic: str, partitions: int = 1) -> None:
    admin = env.admin()
    for future in admin.create_topics([NewTopic(topic, partitions, 3)]).values():
        future.result(timeout=30)


def _produce(identity: Identity, topic: str, values: list[bytes]) -> list[KafkaError]:
    """Produce with confluent-kafka; the per-record and client errors seen."""
    errors: list[KafkaError] = []
    producer = Producer(
        {
            **librdkafka_config(identity),
            "acks": "all",
            "message.timeout.ms": 8000,
            "error_cb": errors.append,
        }
    )
    for value in values:
        producer.produce(topic, value, on_delivery=lambda e, _m: errors.append(e) if e else None)
    producer.flush(15)
    return errors


def _add_user(env: SecureEnv, user: str, password: str) -> None:
    admin = env.admin()
    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password.encode()
    )
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=30)
    described = admin.describe_user_scram_credentials([user])
    infos = described[user].result(timeout=30).scram_credential_infos
    assert [(i.mechanism, i.iterations) for i in infos] == [(ScramMechanism.SCRAM_SHA_512, 8192)]
    # Like Kafka's, a credential reaches the other brokers through a ZooKeeper change
    # notification: wait (bounded) until every broker takes the new login.
    identity = _user(env, user, password)

    def logs_in(connection: WireConnection) -> bool:
        return _login(connection, identity)[0] == ErrorCode.none

    _on_every_broker(env, identity, logs_in, f"{user} logging in")


def _on_every_broker(
    env: SecureEnv, identity: Identity, check: Callable[[WireConnection], bool], what: str
) -> float:
    """Seconds until `check` holds on a new SASL_SSL connection (not yet logged in as
    `identity`) to each broker in turn; bounded at 15 s per broker."""
    start = time.monotonic()
    for broker in env.cluster.brokers:
        address = broker.address("SASL_SSL")

        def holds(address: str = address) -> bool:
            with _connect(env, identity, address) as connection:
                return check(connection)

        wait_until(holds, 15, f"{what} on {address}", interval=0.1)
    return time.monotonic() - start


def _user(env: SecureEnv, user: str, password: str) -> Identity:
    return env.identity("sasl_ssl").replace(username=user, password=password)


# -- authentication -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, change",
    [
        ("sasl_ssl", {"password": "not-the-password"}),
        ("sasl_ssl", {"username": "mallory", "password": "whatever"}),
        ("sasl_ssl", {"mechanism": "SCRAM-SHA-256", "password": "not-the-password"}),
        ("sasl_plain", {"password": "not-the-password"}),
        ("sasl_plain", {"username": "mallory"}),
    ],
    ids=[
        "scram512-wrong-password",
        "scram-unknown-user",
        "scram256-wrong-password",
        "plain-wrong-password",
        "plain-unknown-user",
    ],
)
def test_wrong_password_or_unknown_user_is_refused_and_nothing_is_written(
    secure_cluster: SecureEnv, kind: str, change: dict[str, str]
) -> None:
    topic = _name("sec-auth")
    _create(secure_cluster, topic)
    good = secure_cluster.identity(kind)
    assert not _produce(good, topic, [b"written"])
    bad = good.replace(**change)

    with _connect(secure_cluster, bad) as connection:
        code, message = _login(connection, bad)
        assert code == ErrorCode.sasl_authentication_failed, (code, message)
        assert "mallory" not in (message or "")  # the answer never says whether a user exists
        assert connection.wait_closed(10) == []  # closed, nothing else processed

    errors = _produce(bad, topic, [b"must-not-be-written"])
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    assert _end_offsets(secure_cluster, topic) == {0: 1}


def _certificate(
    directory: Path,
    name: str,
    issuer: tuple[x509.Certificate, object],
    not_before: datetime.datetime | None = None,
    valid_days: int = 30,
) -> tuple[Path, Path]:
    ca_certificate, ca_key = issuer
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    certificate, key = issue_certificate(
        ca_certificate,
        ca_key,  # type: ignore[arg-type]
        subject,
        server=False,
        not_before=not_before,
        valid_days=valid_days,
    )
    chain = directory / f"{name}.pem"
    chain.write_bytes(certificate_pem(certificate, ca_certificate))
    key_path = directory / f"{name}-key.pem"
    key_path.write_bytes(key_pem(key))  # type: ignore[arg-type]
    return chain, key_path


def _cluster_ca(env: SecureEnv) -> tuple[x509.Certificate, object]:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    pki = env.setup.pki
    certificate = x509.load_pem_x509_certificate(pki.ca_certificate.read_bytes())
    key = load_pem_private_key(pki.ca_key.read_bytes(), None)
    return certificate, key


def test_untrusted_and_expired_client_certificates_are_refused(
    secure_cluster: SecureEnv, tmp_path: Path
) -> None:
    topic = _name("sec-tls")
    _create(secure_cluster, topic)
    untrusted = _certificate(tmp_path, "untrusted", create_ca("Some other CA"))
    expired = _certificate(
        tmp_path,
        "expired",
        _cluster_ca(secure_cluster),
        not_before=datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=10),
        valid_days=2,
    )
    trusted = secure_cluster.identity("mtls")
    with _connect(secure_cluster, trusted) as connection:  # the real certificate works
        assert connection.request(ApiKey.API_VERSIONS, 3, {}).error_code == ErrorCode.none

    for certificate, key in (untrusted, expired):
        identity = trusted.replace(certificate=certificate, key=key)
        try:
            # TLS 1.3: the server's verdict on our certificate arrives after the handshake.
            with (
                _connect(secure_cluster, identity) as connection,
                pytest.raises((ConnectionClosed, NoAnswer)),
            ):
                connection.request(ApiKey.API_VERSIONS, 3, {}, timeout=10)
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
            pass  # refused during the handshake itself
        errors = _produce(identity, topic, [b"must-not-be-written"])
        assert errors, "a producer with a refused certificate reported nothing"
    assert _end_offsets(secure_cluster, topic) == {0: 0}


# -- authorization --------------------------------------------------------------------------------


def test_unauthorized_principal_is_refused_with_the_resource_codes_and_nothing_changes(
    secure_cluster: SecureEnv,
) -> None:
    topic = _name("private")  # not under the test principals' sec- prefix
    _create(secure_cluster, topic)
    owner = secure_cluster.identity("sasl_ssl")
    assert not _produce(owner, topic, [b"one", b"two"])
    user, password = _name("eve"), "eve-password"
    _add_user(secure_cluster, user, password)
    eve = _user(secure_cluster, user, password)

    # Produce: TOPIC_AUTHORIZATION_FAILED, nothing written.
    errors = _produce(eve, topic, [b"forbidden"])
    assert any(e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED for e in errors), errors
    assert _end_offsets(secure_cluster, topic) == {0: 2}

    # Consume in a group: GROUP_AUTHORIZATION_FAILED.
    consumer = Consumer({**librdkafka_config(eve), "group.id": _name("eve-group")})
    consumer.subscribe([topic])
    seen = []
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is not None:
                seen.append(message.error().code())
                if KafkaError.GROUP_AUTHORIZATION_FAILED in seen:
                    break
            assert message is None or message.error() is not None, "eve read a record"
    finally:
        consumer.close()
    assert KafkaError.GROUP_AUTHORIZATION_FAILED in seen, seen

    with _connect(secure_cluster, eve) as connection:
        assert _login(connection, eve)[0] == ErrorCode.none
        # Metadata: all topics silently without it; by name TOPIC_AUTHORIZATION_FAILED.
        everything = connection.request(ApiKey.METADATA, 12, {"topics": None})
        assert topic not in {t.name for t in everything.topics}
        assert _metadata_error(connection, topic) == ErrorCode.topic_authorization_failed
        assert _metadata_error(connection, _name("absent")) == (
            ErrorCode.topic_authorization_failed  # existence is not revealed
        )
        # Admin: delete and create refused per topic, ACLs and users per cluster.
        deleted = connection.request(
            ApiKey.DELETE_TOPICS, 6, {"topics": [{"name": topic}], "timeout": 5000}
        )
        assert deleted.responses[0].error_code == ErrorCode.topic_authorization_failed
        created = connection.request(
            ApiKey.CREATE_TOPICS,
            7,
            {
                "topics": [
                    {"name": _name("eve-topic"), "num_partitions": 1, "replication_factor": 1}
                ],
                "timeout": 5000,
            },
        )
        assert created.topics[0].error_code == ErrorCode.topic_authorization_failed
        acls = connection.request(
            29,
            3,
            {
                "resource_type_filter": 1,
                "resource_name_filter": None,
                "pattern_type_filter": 1,
                "principal_filter": None,
                "host_filter": None,
                "operation": 1,
                "permission_type": 1,
            },
        )
        assert acls.error_code == ErrorCode.cluster_authorization_failed
        users = connection.request(50, 0, {"users": None})
        assert users.error_code == ErrorCode.cluster_authorization_failed
        # DeleteRecords: DELETE on the topic; OffsetDelete: DELETE on the group; DescribeLogDirs:
        # DESCRIBE on the cluster; DescribeCluster: allowed, on this listener, with no operations.
        deleted_records = connection.request(
            ApiKey.DELETE_RECORDS,
            2,
            {
                "topics": [{"name": topic, "partitions": [{"partition_index": 0, "offset": -1}]}],
                "timeout": 5000,
            },
        )
        refused = deleted_records.topics[0].partitions[0]
        assert refused.error_code == ErrorCode.topic_authorization_failed
        offsets_deleted = connection.request(
            ApiKey.OFFSET_DELETE,
            0,
            {
                "group_id": _name("eve-group"),
                "topics": [{"name": topic, "partitions": [{"partition_index": 0}]}],
            },
        )
        assert offsets_deleted.error_code == ErrorCode.group_authorization_failed
        log_dirs = connection.request(ApiKey.DESCRIBE_LOG_DIRS, 4, {"topics": None})
        assert log_dirs.error_code == ErrorCode.cluster_authorization_failed
        assert not log_dirs.results
        cluster = connection.request(
            ApiKey.DESCRIBE_CLUSTER,
            1,
            {"include_cluster_authorized_operations": True, "endpoint_type": 1},
        )
        assert cluster.error_code == ErrorCode.none
        assert cluster.cluster_authorized_operations == 0
        bootstrap_port = int(eve.bootstrap.rsplit(":", 1)[1])
        assert bootstrap_port in {b.port for b in cluster.brokers}
        assert len(cluster.brokers) == 3
    assert _end_offsets(secure_cluster, topic) == {0: 2}  # the topic is still there
    admin = secure_cluster.admin()
    start = admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.earliest()})
    assert [f.result(timeout=30).offset for f in start.values()] == [0]  # no record deleted


def test_controller_and_follower_requests_need_cluster_action(secure_cluster: SecureEnv) -> None:
    """The `client` user may do anything with topics, yet is no broker: LeaderAndIsr,
    StopReplica, UpdateMetadata and a follower Fetch are refused before any epoch is looked at."""
    topic = _name("sec-cluster-action")
    _create(secure_cluster, topic)
    client = secure_cluster.identity("sasl_ssl")
    with _connect(secure_cluster, client) as connection:
        assert _login(connection, client)[0] == ErrorCode.none
        stop = connection.request(
            ApiKey.STOP_REPLICA,
            3,
            {
                "controller_id": 1,
                "controller_epoch": 1,
                "broker_epoch": -1,
                "topic_states": [
                    {
                        "topic_name": topic,
                        "partition_states": [{"partition_index": 0, "delete_partition": True}],
                    }
                ],
            },
        )
        assert stop.error_code == ErrorCode.cluster_authorization_failed
        update = connection.request(
            ApiKey.UPDATE_METADATA,
            7,
            {"controller_id": 1, "controller_epoch": 1, "broker_epoch": -1},
        )
        assert update.error_code == ErrorCode.cluster_authorization_failed
        metadata = connection.request(
            ApiKey.METADATA, 12, {"topics": [{"name": topic}], "allow_auto_topic_creation": False}
        )
        fetch = connection.request(
            ApiKey.FETCH,
            15,
            {
                "replica_state": {"replica_id": 2, "replica_epoch": -1},
                "max_wait": 0,
                "min_bytes": 0,
                "topics": [
                    {
                        "topic_id": metadata.topics[0].topic_id,
                        "partitions": [
                            {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1024}
                        ],
                    }
                ],
                "forgotten_topics_data": [],
            },
        )
        code = fetch.responses[0].partitions[0].error_code
        assert code == ErrorCode.topic_authorization_failed


def test_sasl_listener_allows_only_handshake_and_versions_before_authentication(
    secure_cluster: SecureEnv,
) -> None:
    plain = secure_cluster.identity("sasl_plain")
    with _connect(secure_cluster, plain) as connection:
        connection.send_bytes(connection.encode(ApiKey.METADATA, 12, {"topics": None})[1])
        assert connection.wait_closed(10) == []
    with _connect(secure_cluster, plain) as connection:
        assert connection.request(ApiKey.API_VERSIONS, 3, {}).error_code == ErrorCode.none
        # A size beyond sasl.server.max.receive.size closes before its bytes are read.
        connection.send_bytes((1_000_000).to_bytes(4, "big") + b"x" * 100)
        assert connection.wait_closed(10) == []
    with _connect(secure_cluster, plain) as connection:
        handshake = connection.request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "GSSAPI"})
        assert handshake.error_code == ErrorCode.unsupported_sasl_mechanism
        assert list(handshake.mechanisms) == ["PLAIN"]
        assert connection.wait_closed(10) == []


# -- ACL changes reach every broker ---------------------------------------------------------------


def _visible_on_every_broker(
    env: SecureEnv, identity: Identity, topic: str, expected: int
) -> float:
    """Seconds until every broker answers `expected` for the topic's metadata."""

    def answers(connection: WireConnection) -> bool:
        assert _login(connection, identity)[0] == ErrorCode.none
        return _metadata_error(connection, topic) == expected

    return _on_every_broker(env, identity, answers, f"{topic} answering {expected}")


def test_acl_changes_take_effect_on_every_broker_within_seconds(
    secure_cluster: SecureEnv,
) -> None:
    topic = _name("acl-propagation")
    _create(secure_cluster, topic)
    user, password = _name("dave"), "dave-password"
    _add_user(secure_cluster, user, password)
    dave = _user(secure_cluster, user, password)
    refused, allowed = ErrorCode.topic_authorization_failed, ErrorCode.none
    assert _visible_on_every_broker(secure_cluster, dave, topic, refused) < 15

    # Granted through broker 1 only: every broker learns it from the change notification.
    brokers = secure_cluster.cluster.brokers
    first = {**secure_cluster.admin_config(), "bootstrap.servers": brokers[0].address("SASL_SSL")}
    binding = AclBinding(
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.LITERAL,
        f"User:{user}",
        "*",
        AclOperation.DESCRIBE,
        AclPermissionType.ALLOW,
    )
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(first)
    for future in admin.create_acls([binding]).values():
        future.result(timeout=30)
    granted_after = _visible_on_every_broker(secure_cluster, dave, topic, allowed)
    print(f"ACL granted through broker 1: effective on all brokers after {granted_after:.2f}s")
    assert granted_after < PROPAGATION_LIMIT_S, granted_after

    # Revoked through broker 3.
    last = {**secure_cluster.admin_config(), "bootstrap.servers": brokers[-1].address("SASL_SSL")}
    admin = AdminClient(last)
    deleted = admin.delete_acls(
        [
            AclBindingFilter(
                ResourceType.TOPIC,
                topic,
                ResourcePatternType.LITERAL,
                f"User:{user}",
                None,
                AclOperation.ANY,
                AclPermissionType.ANY,
            )
        ]
    )
    for future in deleted.values():
        assert len(future.result(timeout=30)) == 1
    revoked_after = _visible_on_every_broker(secure_cluster, dave, topic, refused)
    print(f"ACL revoked through broker 3: effective on all brokers after {revoked_after:.2f}s")
    assert revoked_after < PROPAGATION_LIMIT_S, revoked_after
