"""A secure local cluster: TLS certificates, SCRAM users, SASL listeners and the ACL authorizer
(`odradek cluster up --secure`, the security tests, the TLS benchmarks).

`SecureSetup.create(directory, broker_ids)` writes, under `DIR/security/`:

* a CA, a certificate per broker (subject `CN=broker-<id>,OU=brokers,O=Odradek`, for 127.0.0.1 and
  localhost) and a client certificate (`CN=client,OU=clients,O=Odradek`), as PEM
  (`odradek.security.certificates`);
* random passwords for the SCRAM users `admin` (a super user; brokers authenticate to each other
  as it) and `client` (an ordinary user with ACLs on every topic and group), and for the PLAIN user
  `bob` of a SASL_PLAINTEXT listener;
* `admin.properties` and `client.properties`: Kafka client properties (SASL_SSL, SCRAM-SHA-512,
  the CA as PEM truststore) for `--command-config` and any Java-style Kafka client, and
  `client-librdkafka.properties`, the same for librdkafka (`kcat -F`, confluent-kafka).

The broker properties (`broker_properties`) are what a Kafka ZooKeeper-mode cluster would be
given: `authorizer.class.name=kafka.security.authorizer.AclAuthorizer`, `super.users`,
`sasl.enabled.mechanisms`, `sasl.mechanism.inter.broker.protocol`,
`listener.name.<l>.<mechanism>.sasl.jaas.config`, `ssl.keystore.*`/`ssl.truststore.*` (PEM).

Listeners (`LISTENERS`, any subset, the first being the clients' bootstrap listener):

| name | protocol | who |
|---|---|---|
| SASL_SSL | SASL_SSL, SCRAM-SHA-512 and SCRAM-SHA-256 | clients |
| INTERNAL | SASL_SSL, SCRAM-SHA-512 | brokers (inter-broker and controller) |
| SSL | SSL, client certificate requested (mutual TLS when sent) | clients |
| SASL_PLAINTEXT | SASL_PLAINTEXT, PLAIN (users in the listener's JAAS config) | clients |
| PLAINTEXT | PLAINTEXT | clients (not in `cluster up --secure`) |

`before_brokers` (for `LocalCluster.up`) stores the SCRAM credentials and the `client` user's ACLs
in ZooKeeper before any broker starts, as `kafka-configs.sh --zookeeper` is used to bootstrap a
SCRAM cluster.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from odradek.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from odradek.security.acl_store import AclStore
from odradek.security.authorizer import AclCache
from odradek.security.certificates import LocalPki, create_local_pki
from odradek.security.credential_store import CredentialCache, CredentialStore
from odradek.security.scram import ScramMechanism, generate_credential
from odradek.testing.cluster_files import HOST, run_sync, write_properties
from odradek.testing.local_cluster import LocalCluster
from odradek.zk.client import ZkClient

SCRAM_MECHANISM = "SCRAM-SHA-512"
ADMIN = "admin"
CLIENT = "client"
PLAIN_USER = "bob"
LISTENERS: dict[str, str] = {
    "SASL_SSL": "SASL_SSL",
    "INTERNAL": "SASL_SSL",
    "SSL": "SSL",
    "SASL_PLAINTEXT": "SASL_PLAINTEXT",
    "PLAINTEXT": "PLAINTEXT",
}
SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN_LOGIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
AUTHORIZER = "kafka.security.authorizer.AclAuthorizer"


def jaas(module: str, **options: str) -> str:
    """A `sasl.jaas.config` value (values quoted: passwords may hold any character)."""
    rendered = " ".join(f'{k}="{v}"' for k, v in options.items())
    return f"{module} required {rendered};"


@dataclass
class SecureSetup:
    directory: Path
    pki: LocalPki
    passwords: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, directory: Path, broker_ids: Iterable[int]) -> SecureSetup:
        directory = Path(directory) / "security"
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        pki = create_local_pki(directory, list(broker_ids))
        passwords = {name: secrets.token_urlsafe(18) for name in (ADMIN, CLIENT, PLAIN_USER)}
        setup = cls(directory, pki, passwords)
        setup.write_client_properties(ADMIN)
        setup.write_client_properties(CLIENT)
        setup.write_librdkafka_properties(CLIENT)
        return setup

    # -- brokers ----------------------------------------------------------------------------

    def broker_properties(self, listeners: Sequence[str]) -> dict[str, str]:
        admin = self.passwords[ADMIN]
        properties = {
            "authorizer.class.name": AUTHORIZER,
            "super.users": f"User:{ADMIN}",
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.pki.ca_certificate),
            "ssl.keystore.type": "PEM",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256",
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
        }
        scram_jaas = jaas(SCRAM_LOGIN, username=ADMIN, password=admin)
        for name in listeners:
            prefix = f"listener.name.{name.lower()}"
            if LISTENERS.get(name) == "SASL_SSL":
                properties[f"{prefix}.scram-sha-512.sasl.jaas.config"] = scram_jaas
                properties[f"{prefix}.scram-sha-256.sasl.jaas.config"] = scram_jaas
        if "INTERNAL" in listeners:
            properties["listener.name.internal.sasl.enabled.mechanisms"] = SCRAM_MECHANISM
        if "SSL" in listeners:
            properties["listener.name.ssl.ssl.client.auth"] = "requested"
        if "SASL_PLAINTEXT" in listeners:
            properties["listener.name.sasl_plaintext.sasl.enabled.mechanisms"] = "PLAIN"
            properties["listener.name.sasl_plaintext.plain.sasl.jaas.config"] = jaas(
                PLAIN_LOGIN,
                username=ADMIN,
                password=admin,
                user_admin=admin,
                **{f"user_{PLAIN_USER}": self.passwords[PLAIN_USER]},
            )
        return properties

    def per_broker_properties(self, broker_ids: Iterable[int]) -> dict[int, dict[str, str]]:
        return {i: {"ssl.keystore.location": str(self.pki.brokers[i].keystore)} for i in broker_ids}

    # -- clients ----------------------------------------------------------------------------

    def client_properties(self, user: str = CLIENT) -> dict[str, str]:
        """Kafka client properties for `user` over SASL_SSL with SCRAM-SHA-512."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": SCRAM_MECHANISM,
            "sasl.jaas.config": jaas(SCRAM_LOGIN, username=user, password=self.passwords[user]),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.pki.ca_certificate),
        }

    def client_properties_file(self, user: str = CLIENT) -> Path:
        return self.directory / f"{user}.properties"

    def write_client_properties(self, user: str) -> Path:
        path = self.client_properties_file(user)
        write_properties(path, self.client_properties(user), f"Kafka client settings for {user}")
        os.chmod(path, 0o600)
        return path

    def librdkafka_properties(self, user: str = CLIENT) -> dict[str, str]:
        """The same settings under librdkafka's names (confluent-kafka, kcat)."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": SCRAM_MECHANISM,
            "sasl.username": user,
            "sasl.password": self.passwords[user],
            "ssl.ca.location": str(self.pki.ca_certificate),
        }

    def librdkafka_properties_file(self, user: str = CLIENT) -> Path:
        return self.directory / f"{user}-librdkafka.properties"

    def write_librdkafka_properties(self, user: str) -> Path:
        path = self.librdkafka_properties_file(user)
        write_properties(path, self.librdkafka_properties(user), f"librdkafka settings for {user}")
        os.chmod(path, 0o600)
        return path

    # -- ZooKeeper --------------------------------------------------------------------------

    def client_acls(self) -> list[AclBinding]:
        """The `client` user may do anything with every topic and group."""
        entry = AccessControlEntry(f"User:{CLIENT}", "*", AclOperation.ALL, AclPermissionType.ALLOW)
        return [
            AclBinding(ResourcePattern(resource_type, "*", PatternType.LITERAL), entry)
            for resource_type in (ResourceType.TOPIC, ResourceType.GROUP)
        ]

    def before_brokers(self, zookeeper_connect: str) -> None:
        """SCRAM credentials of every user, and the `client` user's ACLs."""

        async def write() -> None:
            zk = ZkClient(zookeeper_connect, session_timeout_s=10)
            await zk.start(timeout=30)
            try:
                credentials = CredentialStore(zk, CredentialCache())
                await credentials.start()
                for user in (ADMIN, CLIENT):
                    password = self.passwords[user]
                    upserts = {
                        mechanism: await asyncio.to_thread(
                            generate_credential, mechanism, password, 8192
                        )
                        for mechanism in ScramMechanism
                    }
                    await credentials.alter_credentials(user, upserts)
                credentials.close()
                acls = AclStore(zk, AclCache())
                await acls.start()
                results = await acls.create_acls(self.client_acls())
                await acls.close()
                for result in results:
                    if result is not None:
                        raise result
            finally:
                await zk.close()

        run_sync(write)


def start_secure_cluster(
    directory: Path,
    brokers: int,
    listeners: Sequence[str] = ("SASL_SSL", "INTERNAL"),
    overrides: Mapping[str, str] | None = None,
    timeout: float = 120,
    base_port: int | None = None,
) -> tuple[LocalCluster, SecureSetup]:
    """A cluster of `brokers` brokers with the given listeners (the first for clients, INTERNAL
    between brokers), the ACL authorizer and SCRAM users (module docstring)."""
    names = list(listeners)
    if not names or names[0] != "SASL_SSL":
        raise ValueError("the first listener (the harness's and the clients') must be SASL_SSL")
    directory = Path(directory).resolve()
    setup = SecureSetup.create(directory, range(1, brokers + 1))
    cluster = LocalCluster.up(
        directory,
        brokers,
        base_port=base_port,
        overrides={**setup.broker_properties(names), **(overrides or {})},
        per_broker_overrides=setup.per_broker_properties(range(1, brokers + 1)),
        timeout=timeout,
        listeners={name: LISTENERS[name] for name in names},
        inter_broker_listener="INTERNAL" if "INTERNAL" in names else names[0],
        client_config=setup.client_properties_file(ADMIN),
        before_brokers=setup.before_brokers,
    )
    return cluster, setup


def bootstrap(cluster: LocalCluster, listener: str) -> str:
    """The bootstrap string of one listener of every broker."""
    return ",".join(f"{HOST}:{b.listeners[listener]}" for b in cluster.brokers)
