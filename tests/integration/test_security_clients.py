"""Real clients over every secured listener of the shared secure cluster (issue 14, item 8).

Each of confluent-kafka, kafka-python, aiokafka, kcat and KafkaJS, over SASL_SSL with
SCRAM-SHA-512, SASL_PLAINTEXT with PLAIN, SSL without a client certificate (User:ANONYMOUS) and
mutual TLS (the certificate's DN as principal): creates a replicated topic through its admin API,
produces with acks=all and reads everything back in a consumer group. The cluster has no PLAINTEXT
listener: every replica copies its leader over the INTERNAL SASL_SSL listener, and every principal
here is an ordinary one, allowed only what the fixture's ACLs allow.
"""

from __future__ import annotations

import uuid

import pytest

from tests.fixtures.secure import SecureEnv
from tests.integration._secure_clients import CLIENTS, consume_group, create_topic, produce

KINDS = ("sasl_ssl", "sasl_plain", "ssl", "mtls")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("client", CLIENTS)
def test_produce_consume_in_group_and_admin(
    secure_cluster: SecureEnv, client: str, kind: str
) -> None:
    identity = secure_cluster.identity(kind)
    name = f"sec-{client}-{kind}-{uuid.uuid4().hex[:8]}"
    create_topic(client, identity, name, partitions=3, replication=3)
    values = [f"{client}-{kind}-{i}" for i in range(30)]
    produce(client, identity, name, values)
    got = consume_group(client, identity, name, f"sec-group-{name}", len(values))
    assert sorted(got) == sorted(values)
