"""Client-side security from Kafka client properties (`odradek.security.client_config`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from odradek.network.client import PLAINTEXT_CLIENT
from odradek.security.certificates import create_local_pki
from odradek.security.client_config import (
    SaslClientAuthenticator,
    client_security,
    inter_broker_client,
)
from odradek.security.errors import SecurityConfigError

SCRAM = (
    'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p";'
)


def test_plaintext_by_default() -> None:
    assert client_security({}) is PLAINTEXT_CLIENT


def test_sasl_ssl_with_scram(tmp_path: Path) -> None:
    pki = create_local_pki(tmp_path, [1])
    security = client_security(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": SCRAM,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(pki.ca_certificate),
        }
    )
    assert security.ssl_context is not None
    assert security.authenticate == SaslClientAuthenticator("SCRAM-SHA-512", "u", "p")


def test_inter_broker_credentials_come_from_the_listener_jaas_config() -> None:
    security = inter_broker_client(
        {
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-256",
            "listener.name.internal.scram-sha-256.sasl.jaas.config": SCRAM,
        },
        "INTERNAL",
        "SASL_PLAINTEXT",
    )
    assert security.ssl_context is None
    assert security.authenticate == SaslClientAuthenticator("SCRAM-SHA-256", "u", "p")


@pytest.mark.parametrize(
    "properties, problem",
    [
        ({"security.protocol": "TLS"}, "invalid security.protocol"),
        ({"security.protocol": "SASL_PLAINTEXT"}, "GSSAPI is not supported"),
        (
            {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"},
            "needs sasl.jaas.config",
        ),
    ],
)
def test_mistakes_are_one_line_errors(properties: dict[str, str], problem: str) -> None:
    with pytest.raises(SecurityConfigError, match=problem):
        client_security(properties)
