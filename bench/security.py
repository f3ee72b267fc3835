"""Throughput over TLS and SASL_SSL against PLAINTEXT in the same run, and TLS handshakes per second.

Starts one local cluster whose brokers have a PLAINTEXT, an SSL and a SASL_SSL (SCRAM-SHA-512)
listener (brokers replicate over their INTERNAL SASL_SSL listener), then, for each record size,
runs the same confluent-kafka produce and consume load (`bench/throughput.py`) through each
listener — an untimed warm-up through each, then `--rounds` timed rounds in alternating order — and
prints one JSON object per size with each listener's median round, every round's MB/s, and the
ratios of the medians to PLAINTEXT. Then it measures connection set-up: TLS handshakes per second
on the SSL listener, and SCRAM-SHA-512 logins per second (TLS handshake, SaslHandshake, two
SaslAuthenticate round trips) on the SASL_SSL listener, from `--connectors` client threads, each
connection then sending ApiVersions.

The authorizer is off here (no `authorizer.class.name`): the figures are the cost of encryption and
authentication; an ACL check is a dictionary lookup per request.

With `--kafka`, a Kafka 3.9.1 broker (the jars of `./dev kafka`, Kafka's defaults) with a PLAINTEXT
and an SSL listener (the same PEM certificate and CA) takes the same load in the same run after
Odradek's (started after Odradek's rounds of each size and stopped after its own), and its
SSL/PLAINTEXT ratios are printed beside Odradek's: the cost of TLS to a broker on the JVM, on the
same machine and with the same client.

    ./dev bench security --records 300000 --sizes 100,1024
    ./dev bench security --records 300000 --sizes 1024 --kafka
    ./dev bench security --brokers 3 --replication-factor 3 --acks all --records 200000
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # bench/peers.py: the Kafka 3.9.1 broker
import throughput  # bench/throughput.py: the same load for every listener
from scratch import temporary_directory

LISTENERS = ("SASL_SSL", "INTERNAL", "PLAINTEXT", "SSL")
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_SSL")


def client_settings(setup, protocol: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    if protocol == "PLAINTEXT":
        return {}
    settings = {"security.protocol": protocol, "ssl.ca.location": str(setup.pki.ca_certificate)}
    if protocol == "SASL_SSL":
        settings.update(setup.librdkafka_properties("admin"))
    return settings


class TlsKafka(peers.Kafka):
    """Kafka 3.9.1 with a PLAINTEXT and an SSL listener (PEM keystore and truststore)."""

    def __init__(self, work: Path, keystore: Path, ca_certificate: Path) -> None:
        super().__init__(work, argparse.Namespace())
        self.keystore = keystore
        self.ca_certificate = ca_certificate
        self.ssl_bootstrap = ""

    def extra_properties(self, port: int) -> dict[str, str]:
        ssl_port = peers.free_port()
        self.ssl_bootstrap = f"127.0.0.1:{ssl_port}"
        return {
            "listeners": f"PLAINTEXT://127.0.0.1:{port},SSL://{self.ssl_bootstrap}",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_certificate),
        }


def measure(
    servers: str, settings: dict[str, str], label: str, size: int, args: argparse.Namespace
) -> dict[str, dict[str, float]]:
    """The same produce-then-consume load as every other listener of this bench."""
    throughput.CLIENT_SETTINGS = settings
    topic = f"bench-{label}-{size}-{uuid.uuid4().hex[:6]}"
    throughput.create_topic(servers, topic, args.partitions, args.replication_factor, {})
    produced = throughput.produce(servers, topic, args.records, size, args.acks, args.linger_ms)
    consumed = throughput.consume(servers, topic, args.partitions, args.records, size)
    throughput.delete_topic(servers, topic)
    return {
        "produce": {k: round(v, 2) for k, v in produced.items()},
        "consume": {k: round(v, 2) for k, v in consumed.items()},
    }


Rounds = dict[str, list[dict[str, dict[str, float]]]]


def compare(
    targets: dict[str, tuple[str, dict[str, str]]], prefix: str, size: int, args: argparse.Namespace
) -> tuple[dict[str, dict[str, dict[str, float]]], Rounds]:
    """The load through each (bootstrap, client settings) target: an untimed warm-up through each
    (a broker's first produce and consume after start-up run slower, which would count against
    whichever went first), then `args.rounds` timed rounds in alternating order; each target's
    median round and every round."""
    warm_up = argparse.Namespace(**{**vars(args), "records": max(args.records // 10, 1)})
    names = list(targets)
    for name in names:
        measure(*targets[name], f"{prefix}warm-{name.lower()}", size, warm_up)
    rounds: Rounds = {name: [] for name in names}
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            rounds[name].append(measure(*targets[name], f"{prefix}{name.lower()}", size, args))
    return {name: median_result(rounds[name]) for name in names}, rounds


def rounds_mb_per_s(rounds: Rounds) -> dict[str, dict[str, list[float]]]:
    return {
        name: {step: [r[step]["mb_per_s"] for r in results] for step in ("produce", "consume")}
        for name, results in rounds.items()
    }


def median_result(rounds: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each step's round with the median rate (the upper one of an even count)."""
    return {
        step: sorted((r[step] for r in rounds), key=lambda m: m["records_per_s"])[len(rounds) // 2]
        for step in ("produce", "consume")
    }


def ratios(results: dict[str, Any], protocols: tuple[str, ...]) -> dict[str, dict[str, float]]:
    plain = results["PLAINTEXT"]
    return {
        protocol: {
            step: round(results[protocol][step]["records_per_s"] / plain[step]["records_per_s"], 2)
            for step in ("produce", "consume")
        }
        for protocol in protocols
    }


def connect_rate(
    address: tuple[str, int], context: ssl.SSLContext, login, connectors: int, seconds: float
) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Connections per second: TLS handshake (+ `login(sock)`), then one ApiVersions."""
    from odradek.protocol.build import build
    from odradek.protocol.codec import ApiKey, encode_request, request_class

    api_versions = encode_request(
        ApiKey.API_VERSIONS, 3, 1, "bench", build(request_class(ApiKey.API_VERSIONS, 3), {})
    )
    counts = [0] * connectors
    failures = [0] * connectors
    stop = time.monotonic() + seconds

    def work(index: int) -> None:
        while time.monotonic() < stop:
            try:
                raw = socket.create_connection(address, timeout=10)
                with context.wrap_socket(raw, server_hostname=address[0]) as sock:
                    if login is not None:
                        login(sock)
                    sock.sendall(api_versions)
                    size = int.from_bytes(_read(sock, 4), "big")
                    _read(sock, size)
                counts[index] += 1
            except OSError:
                failures[index] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(connectors)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    return {
        "per_s": sum(counts) / elapsed,
        "connections": sum(counts),
        "failed": sum(failures),
        "connectors": connectors,
    }


def _read(sock: ssl.SSLSocket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return bytes(data)


def scram_login(user: str, password: str):  # type: ignore[no-untyped-def]
    from odradek.protocol.build import build
    from odradek.protocol.codec import ApiKey, decode_response, encode_request, request_class
    from odradek.security.sasl_scram import ScramClient
    from odradek.security.scram import ScramMechanism

    def exchange(sock: ssl.SSLSocket, api_key: int, version: int, values: dict) -> object:  # type: ignore[type-arg]
        request = build(request_class(api_key, version), values)
        sock.sendall(encode_request(api_key, version, 1, "bench", request))
        size = int.from_bytes(_read(sock, 4), "big")
        return decode_response(api_key, version, _read(sock, size))[1]

    def login(sock: ssl.SSLSocket) -> None:
        client = ScramClient(ScramMechanism.SCRAM_SHA_512, user, password)
        exchange(sock, ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-512"})
        first = exchange(sock, 36, 2, {"auth_bytes": client.first_message()})
        final = client.final_message(bytes(first.auth_bytes))  # type: ignore[attr-defined]
        answer = exchange(sock, 36, 2, {"auth_bytes": final})
        if answer.error_code != 0:  # type: ignore[attr-defined]
            raise OSError(f"login failed: {answer.error_message}")  # type: ignore[attr-defined]

    return login


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--sizes", default="100,1024")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--replication-factor", type=int, default=1)
    parser.add_argument("--acks", default="1")
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument(
        "--rounds", type=int, default=3, help="timed rounds per listener, alternating their order"
    )
    parser.add_argument("--connectors", type=int, default=4, help="threads opening connections")
    parser.add_argument("--connect-seconds", type=float, default=10.0)
    parser.add_argument(
        "--kafka",
        action="store_true",
        help="also run the load against a Kafka 3.9.1 broker's PLAINTEXT and SSL listeners",
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    from odradek.testing.secure import bootstrap, start_secure_cluster

    directory = temporary_directory("odradek-bench-security-")
    cluster, setup = start_secure_cluster(
        directory, args.brokers, listeners=LISTENERS, overrides={"authorizer.class.name": ""}
    )
    kafka: TlsKafka | None = None
    try:
        for size in [int(s) for s in args.sizes.split(",")]:
            results, rounds = compare(
                {p: (bootstrap(cluster, p), client_settings(setup, p)) for p in PROTOCOLS},
                "",
                size,
                args,
            )
            report: dict[str, Any] = {
                "bench": "security_throughput",
                "brokers": args.brokers,
                "record_bytes": size,
                "records": args.records,
                "partitions": args.partitions,
                "replication_factor": args.replication_factor,
                "acks": args.acks,
                "rounds": args.rounds,
                "results": results,
                "rounds_mb_per_s": rounds_mb_per_s(rounds),
                "ratio_to_plaintext": ratios(results, ("SSL", "SASL_SSL")),
            }
            if args.kafka:
                # Started after Odradek's rounds and stopped after its own: a JVM that has just
                # started compiles and collects in the background, on the same two cores.
                kafka_work = directory / f"kafka-{size}"
                kafka_work.mkdir()
                kafka = TlsKafka(
                    kafka_work, setup.pki.brokers[1].keystore, setup.pki.ca_certificate
                )
                kafka.start()
                peers.wait_port(int(kafka.ssl_bootstrap.rsplit(":", 1)[1]), kafka.process, 120)
                ca = {"security.protocol": "SSL", "ssl.ca.location": str(setup.pki.ca_certificate)}
                kafka_results, kafka_rounds = compare(
                    {"PLAINTEXT": (kafka.bootstrap, {}), "SSL": (kafka.ssl_bootstrap, ca)},
                    "kafka-",
                    size,
                    args,
                )
                report["kafka_results"] = kafka_results
                report["kafka_rounds_mb_per_s"] = rounds_mb_per_s(kafka_rounds)
                report["kafka_ratio_to_plaintext"] = ratios(kafka_results, ("SSL",))
                kafka.stop()
                kafka = None
            print(json.dumps(report), flush=True)
        first = cluster.brokers[0]
        context = ssl.create_default_context(cafile=str(setup.pki.ca_certificate))
        tls = connect_rate(
            (first.host, first.listeners["SSL"]),
            context,
            None,
            args.connectors,
            args.connect_seconds,
        )
        logins = connect_rate(
            (first.host, first.listeners["SASL_SSL"]),
            context,
            scram_login("admin", setup.passwords["admin"]),
            args.connectors,
            args.connect_seconds,
        )
        print(
            json.dumps(
                {
                    "bench": "security_connections",
                    "tls_handshakes": {k: round(v, 1) for k, v in tls.items()},
                    "sasl_ssl_scram_sha_512_logins": {k: round(v, 1) for k, v in logins.items()},
                    "tls": ssl.OPENSSL_VERSION,
                }
            ),
            flush=True,
        )
    finally:
        if kafka is not None:
            kafka.stop()
        cluster.down()


if __name__ == "__main__":
    main()
