"""A listener's SASL settings from broker properties."""

from __future__ import annotations

import pytest

from odradek.security.credential_store import CredentialCache
from odradek.security.errors import SecurityConfigError
from odradek.security.jaas import parse_jaas_file
from odradek.security.sasl_config import enabled_mechanisms, listener_sasl
from odradek.security.sasl_plain import plain_client_message
from odradek.security.sasl_scram import ScramClient
from odradek.security.scram import ScramMechanism, generate_credential

PROPERTIES = {
    "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
    "listener.name.sasl_ssl.plain.sasl.jaas.config": (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="admin" password="admin-secret" user_admin="admin-secret";'
    ),
    "connections.max.reauth.ms": "3600000",
    "listener.name.sasl_ssl.scram-sha-512.connections.max.reauth.ms": "60000",
}


def test_mechanisms_users_and_reauth() -> None:
    cache = CredentialCache()
    sasl = listener_sasl(PROPERTIES, "SASL_SSL", cache)
    assert list(sasl.mechanisms) == ["PLAIN", "SCRAM-SHA-512"]
    assert sasl.reauth_ms("PLAIN") == 3_600_000 and sasl.reauth_ms("SCRAM-SHA-512") == 60_000
    plain = sasl.mechanisms["PLAIN"]()
    plain.evaluate(plain_client_message("admin", "admin-secret"))
    assert plain.complete
    # SCRAM reads the credential cache at authentication time: a user added later works
    cache.update_user(
        "bob",
        {"SCRAM-SHA-512": generate_credential(ScramMechanism.SCRAM_SHA_512, "pw").to_string()},
    )
    server = sasl.mechanisms["SCRAM-SHA-512"]()
    client = ScramClient(ScramMechanism.SCRAM_SHA_512, "bob", "pw")
    client.verify_server_final(
        server.evaluate(client.final_message(server.evaluate(client.first_message())))
    )


def test_jaas_file_fallback_and_errors() -> None:
    jaas = parse_jaas_file(
        'KafkaServer { org.apache.kafka.common.security.plain.PlainLoginModule required user_a="b"; };'
    )
    sasl = listener_sasl(
        {"sasl.enabled.mechanisms": "PLAIN"}, "SASL_PLAINTEXT", CredentialCache(), jaas
    )
    assert sasl.max_receive_size == 524288
    with pytest.raises(
        SecurityConfigError, match=r"no listener\.name\.x\.plain\.sasl\.jaas\.config"
    ):
        listener_sasl({"sasl.enabled.mechanisms": "PLAIN"}, "X", CredentialCache())
    with pytest.raises(SecurityConfigError, match="GSSAPI"):
        enabled_mechanisms({}, "SASL_SSL")  # Kafka's default mechanism is GSSAPI
    assert enabled_mechanisms(
        {"listener.name.a.sasl.enabled.mechanisms": "SCRAM-SHA-256"}, "A"
    ) == ["SCRAM-SHA-256"]
