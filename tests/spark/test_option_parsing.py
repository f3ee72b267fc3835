"""The options Spark's Kafka connector has and the `odradek` source gained (timestamps, trigger
limits, Java client settings) and the offsets-behind-latest helper: pure, no Spark, no cluster."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from odradek.errors import DataSourceOptionError
from odradek.spark.client_settings import JAVA_ONLY, librdkafka_params
from odradek.spark.offsets import TopicPartition
from odradek.spark.options import DEFAULT_MAX_TRIGGER_DELAY_MS, SourceOptions
from odradek.spark.progress import offsets_behind_latest

BOOT = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"


def parse(**options: str) -> SourceOptions:
    return SourceOptions.parse({**BOOT, **options})


def test_start_and_end_by_timestamp_in_sparks_order_of_preference() -> None:
    both = parse(startingTimestamp="1000", startingOffsetsByTimestamp='{"t":{"0":5}}')
    assert both.starting_offsets is not None
    assert (both.starting_offsets.kind, both.starting_offsets.timestamp) == ("timestamp", 1000)
    by_ts = parse(startingOffsetsByTimestamp='{"t":{"0":5}}', startingOffsets="earliest")
    assert by_ts.starting_offsets is not None and by_ts.starting_offsets.kind == "by_timestamp"
    assert by_ts.starting_offsets.offsets == {TopicPartition("t", 0): 5}
    ending = parse(endingTimestamp="7").for_batch().ending_offsets
    assert ending is not None and ending.option == "endingTimestamp"
    assert parse().timestamp_strategy == "error"
    assert parse(startingOffsetsByTimestampStrategy="LATEST").timestamp_strategy == "latest"


@pytest.mark.parametrize("option", ["endingTimestamp", "endingOffsetsByTimestamp", "endingOffsets"])
def test_an_end_is_refused_on_a_stream_naming_the_option(option: str) -> None:
    value = '{"t":{"0":1}}' if option != "endingTimestamp" else "1"
    with pytest.raises(DataSourceOptionError, match=f"^{option} is not allowed in a streaming"):
        parse(**{option: value}).for_stream()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"startingTimestamp": "1.5"}, "startingTimestamp: expected a timestamp in milliseconds"),
        ({"endingOffsetsByTimestamp": '{"t":{"0":-1}}'}, "timestamp -1 of t-0 is invalid"),
        ({"startingOffsetsByTimestamp": '{"u":{"0":1}}'}, "timestamps given for u-0, which"),
        ({"startingOffsetsByTimestampStrategy": "x"}, "expected error or latest, got 'x'"),
        ({"maxTriggerDelay": "5 weeks"}, "maxTriggerDelay: expected a duration"),
        ({"minOffsetsPerTrigger": "x"}, "minOffsetsPerTrigger: expected a positive integer"),
    ],
)
def test_bad_values_name_the_option_and_what_it_accepts(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(DataSourceOptionError) as info:
        parse(**options)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "text, ms",
    [("15m", 900_000), ("30s", 30_000), ("250", 250), ("2h", 7_200_000), ("1d", 86_400_000)],
)
def test_max_trigger_delay_takes_sparks_time_strings(text: str, ms: int) -> None:
    assert parse(maxTriggerDelay=text).max_trigger_delay_ms == ms
    assert parse().max_trigger_delay_ms == DEFAULT_MAX_TRIGGER_DELAY_MS


def test_jaas_config_becomes_librdkafka_credentials() -> None:
    params = librdkafka_params(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": f'{SCRAM} required username="alice" password="p\\"w;x";',
        }
    )
    assert params == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": 'p"w;x',
    }
    with pytest.raises(DataSourceOptionError, match=r"login module .*Krb5LoginModule"):
        librdkafka_params(
            {
                "sasl.jaas.config": "com.sun.security.auth.module.Krb5LoginModule "
                "required useKeyTab=true;"
            }
        )
    with pytest.raises(DataSourceOptionError, match="needs password"):
        librdkafka_params({"sasl.jaas.config": f'{SCRAM} required username="a";'})


def _certificate(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return certificate, key


def test_truststores_and_keystores(tmp_path: Path) -> None:
    ca, key = _certificate("ca")
    pem = ca.public_bytes(serialization.Encoding.PEM)
    (tmp_path / "ca.pem").write_bytes(pem)
    # A PEM truststore (type given or recognised from the file) is a CA location.
    for settings in ({"ssl.truststore.type": "PEM"}, {}):
        params = librdkafka_params(
            {"ssl.truststore.location": str(tmp_path / "ca.pem"), **settings}
        )
        assert params == {"ssl.ca.location": str(tmp_path / "ca.pem")}
    # A PKCS12 truststore is read here and travels as PEM text.
    store = pkcs12.serialize_key_and_certificates(
        None, None, None, [ca], serialization.BestAvailableEncryption(b"secret")
    )
    (tmp_path / "trust.p12").write_bytes(store)
    params = librdkafka_params(
        {
            "ssl.truststore.location": str(tmp_path / "trust.p12"),
            "ssl.truststore.type": "PKCS12",
            "ssl.truststore.password": "secret",
        }
    )
    assert params == {"ssl.ca.pem": pem.decode()}
    with pytest.raises(DataSourceOptionError, match=r"kafka.ssl.truststore.location: .*password"):
        librdkafka_params(
            {
                "ssl.truststore.location": str(tmp_path / "trust.p12"),
                "ssl.truststore.password": "no",
            }
        )
    # A PEM keystore file (key and chain) becomes PEM text; PKCS12 passes to librdkafka.
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    (tmp_path / "client.pem").write_text(key_pem + pem.decode())
    params = librdkafka_params(
        {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(tmp_path / "client.pem")}
    )
    assert params == {"ssl.key.pem": key_pem.strip(), "ssl.certificate.pem": pem.decode().strip()}
    params = librdkafka_params(
        {
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": "/k.p12",
            "ssl.keystore.password": "pw",
            "ssl.key.password": "kp",
        }
    )
    assert params == {
        "ssl.keystore.location": "/k.p12",
        "ssl.keystore.password": "pw",
        "ssl.key.password": "kp",
    }
    with pytest.raises(DataSourceOptionError, match=r"JKS is not supported .*keytool"):
        librdkafka_params({"ssl.truststore.location": "/missing.jks"})


def test_java_only_settings_are_dropped_and_renamed_ones_translated() -> None:
    assert "buffer.memory" in JAVA_ONLY and "client.id" not in JAVA_ONLY
    params = librdkafka_params(
        {
            "buffer.memory": "1",
            "client.id": "me",
            "fetch.max.wait.ms": "50",
            "receive.buffer.bytes": "65536",
            "ssl.endpoint.identification.algorithm": "",
        }
    )
    assert params == {
        "client.id": "me",
        "fetch.wait.max.ms": "50",
        "socket.receive.buffer.bytes": "65536",
        "ssl.endpoint.identification.algorithm": "none",
    }


def test_offsets_behind_latest_from_a_progress() -> None:
    source = {
        "endOffset": '{"t":{"0":10,"1":20}}',
        "latestOffset": {"t": {"0": 15, "1": 20}},
    }
    assert offsets_behind_latest(source) == {
        "minOffsetsBehindLatest": "0",
        "avgOffsetsBehindLatest": "2.5",
        "maxOffsetsBehindLatest": "5",
    }
    assert offsets_behind_latest({"endOffset": None, "latestOffset": None}) == {}
