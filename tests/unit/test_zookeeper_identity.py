"""The broker's ZooKeeper identity (`zookeeper.set.acl`) and the ACLs it sets (`odradek.zk.acls`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from odradek.errors import ConfigError
from odradek.server.broker_security import environment_zookeeper_identity, zookeeper_identity
from odradek.server.config import KafkaConfig
from odradek.zk.acls import ZkCredentials, is_sensitive

BASE = {"broker.id": "1", "zookeeper.connect": "z:2181", "log.dirs": "/tmp/x"}
JAAS = """KafkaServer { org.apache.kafka.common.security.plain.PlainLoginModule required
  username="admin" password="x" user_admin="x"; };
Client { org.apache.zookeeper.server.auth.DigestLoginModule required
  username="kafka" password="zk-secret"; };
"""


def test_credentials_from_the_jaas_client_section(tmp_path: Path) -> None:
    jaas = tmp_path / "jaas.conf"
    jaas.write_text(JAAS)
    config = KafkaConfig({**BASE, "zookeeper.set.acl": "true"})
    found = zookeeper_identity(
        config, {"KAFKA_OPTS": f"-Xmx1g -Djava.security.auth.login.config={jaas}"}
    )
    assert found == ZkCredentials("kafka", "zk-secret")
    assert environment_zookeeper_identity(
        {"KAFKA_OPTS": f"-Djava.security.auth.login.config={jaas}"}
    ) == ZkCredentials("kafka", "zk-secret")
    by_property = KafkaConfig({**BASE, "java.security.auth.login.config": str(jaas)})
    assert zookeeper_identity(by_property, {}) == ZkCredentials("kafka", "zk-secret")
    with pytest.raises(ConfigError, match="no ZooKeeper credentials"):
        zookeeper_identity(config, {})


def test_acls_creator_all_world_read_except_sensitive_trees() -> None:
    credentials = ZkCredentials("kafka", "zk-secret")
    assert credentials.auth_data == [("digest", "kafka:zk-secret")]
    public = credentials.acls("/brokers/topics/t")
    assert [(a.id.scheme, a.perms) for a in public] == [("digest", 31), ("world", 1)]
    secret = credentials.acls("/config/users/alice")
    assert [(a.id.scheme, a.perms) for a in secret] == [("digest", 31)]
    assert is_sensitive("/config/users") and not is_sensitive("/config/usersx")
