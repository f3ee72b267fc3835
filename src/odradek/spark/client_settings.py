"""`kafka.*` settings written for Spark's Kafka connector (the Java client), as librdkafka's.

Spark's connector hands every `kafka.*` option to the Java client; the `odradek` source's clients
are librdkafka's (confluent-kafka). The two share most names (`security.protocol`,
`sasl.mechanism`, `client.id`, `fetch.min.bytes`...), so most settings pass unchanged. The rest,
so that a pipeline's options move between `format("kafka")` and `format("odradek")` unchanged:

* `sasl.jaas.config` with Kafka's PLAIN or SCRAM login module becomes `sasl.username` and
  `sasl.password` (other login modules -- Kerberos, OAUTHBEARER -- are refused: say how to log in
  with librdkafka's own settings instead);
* `ssl.truststore.*`: a PEM truststore file becomes `ssl.ca.location`; a PKCS12 one (Java's
  default type is JKS, which nothing but Java reads: refused with the keytool command that
  converts it) is read here, on the driver, and its certificates travel as `ssl.ca.pem`;
  `ssl.truststore.certificates` (PEM text) becomes `ssl.ca.pem`;
* `ssl.keystore.*`: a PKCS12 keystore passes as librdkafka's `ssl.keystore.location` /
  `ssl.keystore.password`; a PEM one (file, or `ssl.keystore.key` +
  `ssl.keystore.certificate.chain` text) becomes `ssl.key.pem` + `ssl.certificate.pem`, with
  `ssl.key.password`;
* `ssl.endpoint.identification.algorithm=` (empty: no host name check) becomes `none`;
  `fetch.max.wait.ms`, `send.buffer.bytes` and `receive.buffer.bytes` take librdkafka's names
  (`fetch.wait.max.ms`, `socket.send.buffer.bytes`, `socket.receive.buffer.bytes`);
* Java client settings librdkafka has no equivalent of (`JAVA_ONLY`: buffer sizes, metrics
  reporters, login refresh tuning...) are dropped with a warning, as the Java client itself
  warns about and ignores settings it does not know.

Anything else passes to librdkafka as given; a name neither knows fails the client's creation
with librdkafka's message (a DataSourceOptionError, see `spark.clients.translate`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path

from odradek.errors import DataSourceOptionError

__all__ = ["JAVA_ONLY", "librdkafka_params"]

log = logging.getLogger(__name__)

# The Java client's consumer, producer and admin settings (kafka-clients 3.9) that librdkafka
# does not know, found by giving each to confluent-kafka. Serializers, interceptors and the
# settings translated below are handled separately.
JAVA_ONLY = frozenset(
    [
        "auto.include.jmx.reporter",
        "bootstrap.controllers",
        "buffer.memory",
        "compression.gzip.level",
        "compression.lz4.level",
        "compression.zstd.level",
        "default.api.timeout.ms",
        "exclude.internal.topics",
        "fetch.max.wait.ms",
        "internal.leave.group.on.close",
        "internal.throw.on.fetch.stable.offset.unsupported",
        "max.block.ms",
        "max.request.size",
        "metadata.max.idle.ms",
        "metric.reporters",
        "metrics.num.samples",
        "metrics.recording.level",
        "metrics.sample.window.ms",
        "partitioner.adaptive.partitioning.enable",
        "partitioner.availability.timeout.ms",
        "partitioner.class",
        "partitioner.ignore.keys",
        "receive.buffer.bytes",
        "sasl.client.callback.handler.class",
        "sasl.kerberos.ticket.renew.jitter",
        "sasl.kerberos.ticket.renew.window.factor",
        "sasl.login.callback.handler.class",
        "sasl.login.class",
        "sasl.login.connect.timeout.ms",
        "sasl.login.read.timeout.ms",
        "sasl.login.refresh.buffer.seconds",
        "sasl.login.refresh.min.period.seconds",
        "sasl.login.refresh.window.factor",
        "sasl.login.refresh.window.jitter",
        "sasl.login.retry.backoff.max.ms",
        "sasl.login.retry.backoff.ms",
        "sasl.oauthbearer.clock.skew.seconds",
        "sasl.oauthbearer.expected.audience",
        "sasl.oauthbearer.expected.issuer",
        "sasl.oauthbearer.header.urlencode",
        "sasl.oauthbearer.jwks.endpoint.refresh.ms",
        "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms",
        "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms",
        "sasl.oauthbearer.jwks.endpoint.url",
        "sasl.oauthbearer.scope.claim.name",
        "security.providers",
        "send.buffer.bytes",
        "socket.connection.setup.timeout.max.ms",
        "ssl.enabled.protocols",
        "ssl.engine.factory.class",
        "ssl.keymanager.algorithm",
        "ssl.protocol",
        "ssl.provider",
        "ssl.secure.random.implementation",
        "ssl.trustmanager.algorithm",
    ]
)

_RENAMED = {
    "fetch.max.wait.ms": "fetch.wait.max.ms",
    "send.buffer.bytes": "socket.send.buffer.bytes",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
}
_LOGIN_MODULES = {
    "org.apache.kafka.common.security.plain.PlainLoginModule": "PLAIN",
    "org.apache.kafka.common.security.scram.ScramLoginModule": "SCRAM",
}
_JAAS = re.compile(r"^\s*(?P<module>[\w.$]+)\s+(?P<flag>\w+)(?P<options>.*?);?\s*$", re.DOTALL)
_JAAS_OPTION = re.compile(r'\s*([\w.\-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s";]+))')
_TRUSTSTORE_KEYS = ("ssl.truststore.location", "ssl.truststore.type", "ssl.truststore.password")
_KEYSTORE_KEYS = (
    "ssl.keystore.location",
    "ssl.keystore.type",
    "ssl.keystore.password",
    "ssl.keystore.key",
    "ssl.keystore.certificate.chain",
)


def librdkafka_params(params: Mapping[str, str]) -> dict[str, str]:
    """`params` (Java client names, prefix removed) as librdkafka settings (module docstring)."""
    java = dict(params)
    result: dict[str, str] = {}
    if "sasl.jaas.config" in java:
        result.update(_jaas(java.pop("sasl.jaas.config")))
    result.update(_truststore(java))
    result.update(_keystore(java))
    if java.get("ssl.endpoint.identification.algorithm") == "":
        java["ssl.endpoint.identification.algorithm"] = "none"
    for name, librdkafka_name in _RENAMED.items():
        if name in java:
            result[librdkafka_name] = java.pop(name)
    dropped = sorted(name for name in java if name in JAVA_ONLY)
    if dropped:
        log.warning(
            "kafka.%s: Java client settings librdkafka has no equivalent of; ignored",
            ", kafka.".join(dropped),
        )
    result.update({k: v for k, v in java.items() if k not in JAVA_ONLY})
    return result


def _jaas(config: str) -> dict[str, str]:
    match = _JAAS.match(config)
    if match is None:
        raise DataSourceOptionError(
            'kafka.sasl.jaas.config: expected "<LoginModule> required username=\\"...\\" '
            f'password=\\"...\\";", got {config!r}'
        )
    module = match.group("module")
    if module not in _LOGIN_MODULES:
        raise DataSourceOptionError(
            f"kafka.sasl.jaas.config: login module {module} is not supported (accepted: "
            f"{', '.join(sorted(_LOGIN_MODULES))}); set librdkafka's own sasl.* settings instead"
        )
    options = {
        name: (quoted.replace('\\"', '"').replace("\\\\", "\\") if quoted is not None else bare)
        for name, quoted, bare in _JAAS_OPTION.findall(match.group("options"))
    }
    missing = [name for name in ("username", "password") if name not in options]
    if missing:
        raise DataSourceOptionError(
            f"kafka.sasl.jaas.config: {module} needs {' and '.join(missing)}"
        )
    return {"sasl.username": options["username"], "sasl.password": options["password"]}


def _store_type(java: dict[str, str], kind: str, location: str | None) -> str:
    """The store's type: as given, else guessed from the file (PEM text or not)."""
    given = java.get(f"ssl.{kind}.type")
    if given:
        return given.strip().upper()
    if location is None:
        return "PEM"
    try:
        head = Path(location).read_bytes()[:64]
    except OSError:
        return "JKS"  # Java's default; refused below with what to do
    return "PEM" if head.lstrip().startswith(b"-----BEGIN") else "PKCS12"


def _read(path: str, option: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise DataSourceOptionError(f"{option}: cannot read {path!r}: {e.strerror}") from None


def _truststore(java: dict[str, str]) -> dict[str, str]:
    inline = java.pop("ssl.truststore.certificates", None)
    location, _, password = (java.get(k) for k in _TRUSTSTORE_KEYS)
    kind = _store_type(java, "truststore", location)
    for key in _TRUSTSTORE_KEYS:
        java.pop(key, None)
    if inline is not None:
        return {"ssl.ca.pem": inline}
    if location is None:
        return {}
    if kind == "PEM":
        return {"ssl.ca.location": location}
    if kind == "PKCS12":
        from cryptography.hazmat.primitives.serialization import Encoding, pkcs12

        data = _read(location, "kafka.ssl.truststore.location")
        try:
            store = pkcs12.load_pkcs12(data, password.encode() if password else None)
        except ValueError as e:
            raise DataSourceOptionError(
                f"kafka.ssl.truststore.location: {location!r} is not a PKCS12 store this "
                f"password opens: {e}"
            ) from None
        certificates = [c.certificate for c in store.additional_certs]
        if store.cert is not None:
            certificates.append(store.cert.certificate)
        if not certificates:
            raise DataSourceOptionError(
                f"kafka.ssl.truststore.location: no certificate in {location!r}"
            )
        return {"ssl.ca.pem": b"".join(c.public_bytes(Encoding.PEM) for c in certificates).decode()}
    raise DataSourceOptionError(
        f"kafka.ssl.truststore.type: {kind} is not supported (accepted: PEM, PKCS12); convert "
        "it with keytool -importkeystore -srckeystore STORE -destkeystore STORE.p12 "
        "-deststoretype PKCS12"
    )


def _keystore(java: dict[str, str]) -> dict[str, str]:
    location, _, password, key, chain = (java.get(k) for k in _KEYSTORE_KEYS)
    kind = _store_type(java, "keystore", location)
    for name in _KEYSTORE_KEYS:
        java.pop(name, None)
    key_password = java.pop("ssl.key.password", None)
    result: dict[str, str] = {}
    if key is not None or chain is not None:
        if key is None or chain is None:
            raise DataSourceOptionError(
                "kafka.ssl.keystore.key and kafka.ssl.keystore.certificate.chain go together"
            )
        result = {"ssl.key.pem": key, "ssl.certificate.pem": chain}
    elif location is not None and kind == "PKCS12":
        if not password:
            raise DataSourceOptionError(
                "kafka.ssl.keystore.password is required with a PKCS12 kafka.ssl.keystore.location"
            )
        result = {"ssl.keystore.location": location, "ssl.keystore.password": password}
    elif location is not None and kind == "PEM":
        text = _read(location, "kafka.ssl.keystore.location").decode()
        whole = re.findall(r"(-----BEGIN ([A-Z ]+)-----.*?-----END \2-----)", text, re.DOTALL)
        keys = [block for block, label in whole if "PRIVATE KEY" in label]
        certificates = [block for block, label in whole if label == "CERTIFICATE"]
        if not keys or not certificates:
            raise DataSourceOptionError(
                f"kafka.ssl.keystore.location: {location!r} must hold a private key and its "
                "certificate chain (PEM)"
            )
        result = {"ssl.key.pem": keys[0], "ssl.certificate.pem": "\n".join(certificates)}
    elif location is not None:
        raise DataSourceOptionError(
            f"kafka.ssl.keystore.type: {kind} is not supported (accepted: PEM, PKCS12); convert "
            "it with keytool -importkeystore -deststoretype PKCS12"
        )
    if key_password:
        result["ssl.key.password"] = key_password
    return result
