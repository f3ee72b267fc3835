"""`zookeeper.set.acl=true`: brokers authenticate to ZooKeeper (digest scheme, credentials from a JAAS
`Client` section) and create every znode so that only that identity may change it; the sensitive
trees (SCRAM credentials under `/config/users`) are not even readable by others (issue 14,
item 5; `odradek.zk.acls`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import make_digest_acl_credential

from odradek.testing import LocalCluster

USER, PASSWORD = "kafka", "kafka-zk-secret"
JAAS = f"""Client {{
    org.apache.zookeeper.server.auth.DigestLoginModule required
    username="{USER}"
    password="{PASSWORD}";
}};
"""


def _kazoo(cluster: LocalCluster, authenticated: bool) -> KazooClient:
    client = KazooClient(
        hosts=cluster.zookeeper_connect,
        auth_data=[("digest", f"{USER}:{PASSWORD}")] if authenticated else None,
    )
    client.start(timeout=15)
    return client


def test_brokers_set_zookeeper_acls_when_asked(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    jaas = tmp_path / "zk-jaas.conf"
    jaas.write_text(JAAS)
    cluster = make_cluster(
        brokers=2,
        shared_zookeeper=True,
        overrides={"zookeeper.set.acl": "true", "java.security.auth.login.config": str(jaas)},
    )
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    for future in admin.create_topics([NewTopic("guarded", 2, 2)]).values():
        future.result(timeout=30)
    upsert = UserScramCredentialUpsertion(
        "alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"alice-secret"
    )
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=30)

    # ZooKeeper masks the digest of an identity to other sessions ("kafka:x"): compare names.
    anonymous = _kazoo(cluster, authenticated=False)
    try:
        for path in ("/brokers/topics/guarded", "/brokers/ids/1", "/controller_epoch"):
            acls, _ = anonymous.get_acls(path)
            assert {(a.id.scheme, a.id.id.split(":")[0], a.perms) for a in acls} == {
                ("digest", USER, 31),
                ("world", "anyone", 1),
            }, path
            anonymous.get(path)  # readable by anyone
            with pytest.raises(NoAuthError):
                anonymous.set(path, b"{}")
        with pytest.raises(NoAuthError):  # not even its ACL
            anonymous.get_acls("/config/users/alice")
        with pytest.raises(NoAuthError):
            anonymous.get("/config/users/alice")
        with pytest.raises(NoAuthError):
            anonymous.delete("/brokers/topics/guarded/partitions/0/state")
    finally:
        anonymous.stop()
        anonymous.close()

    owner = _kazoo(cluster, authenticated=True)
    try:
        acls, _ = owner.get_acls("/config/users/alice")
        assert [a.id.id for a in acls] == [make_digest_acl_credential(USER, PASSWORD)]
        data, _ = owner.get("/config/users/alice")
        assert b"SCRAM-SHA-256" in data
    finally:
        owner.stop()
        owner.close()

    # The brokers themselves work with their own ACLs: a restart re-registers and leads again.
    cluster.restart(2)
    metadata = admin.list_topics("guarded", timeout=30)
    assert all(p.leader >= 0 for p in metadata.topics["guarded"].partitions.values())


def test_zookeeper_set_acl_without_credentials_is_a_one_line_error(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    from odradek.errors import OperatorError

    with pytest.raises(OperatorError, match="no ZooKeeper credentials"):
        make_cluster(brokers=1, shared_zookeeper=True, zookeeper_set_acl=True, timeout=30)
