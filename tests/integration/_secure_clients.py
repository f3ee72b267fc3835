"""Real Kafka clients on secured listeners, behind one small interface (the security tests).

`Identity` says how a client connects and who it is: the listener, the security protocol and
either SASL credentials (mechanism, user, password) or TLS material (CA, and a client certificate
for mutual TLS). Each of the five clients — confluent-kafka, kafka-python, aiokafka, kcat (Debian's
librdkafka 2.0.2) and KafkaJS (Node, `tests/js/client.js`) — is configured from it as its users
would configure it, and can:

* `create_topic(client, identity, topic, partitions, rf)` through its admin API (kcat has none:
  it lists the cluster's metadata instead, and the topic is made with confluent-kafka);
* `produce(client, identity, topic, values)` with acks=all, raising `ClientRefused` with the
  client's error text when the broker refuses;
* `consume_group(client, identity, topic, group, count)` in a consumer group from the beginning,
  returning the values read.

Concurrency: synchronous; aiokafka runs on a private event loop; kcat and node are subprocesses.
Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

CLIENTS = ("confluent", "kafka-python", "aiokafka", "kcat", "kafkajs")
KCAT = "/usr/bin/kcat"
NODE_CLIENT = Path(__file__).resolve().parents[1] / "js" / "client.js"
TIMEOUT_S = 60.0


class ClientRefused(AssertionError):
    """The client reported an error from the broker (authentication, authorization, ...)."""


@dataclass(frozen=True, slots=True)
class Identity:
    listener: str
    protocol: str  # SSL | SASL_SSL | SASL_PLAINTEXT
    bootstrap: str
    ca: Path | None = None
    mechanism: str | None = None  # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512
    username: str | None = None
    password: str | None = None
    certificate: Path | None = None  # client certificate chain (mutual TLS)
    key: Path | None = None

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL")

    def replace(self, **changes: Any) -> Identity:
        import dataclasses

        return dataclasses.replace(self, **changes)


# -- configurations ------------------------------------------------------------------------------


def librdkafka_config(identity: Identity) -> dict[str, str]:
    config = {
        "bootstrap.servers": identity.bootstrap,
        "security.protocol": identity.protocol.lower(),
    }
    if identity.tls and identity.ca:
        config["ssl.ca.location"] = str(identity.ca)
        if identity.certificate:
            config["ssl.certificate.location"] = str(identity.certificate)
            config["ssl.key.location"] = str(identity.key)
    if identity.sasl:
        config["sasl.mechanisms"] = identity.mechanism or ""
        config["sasl.username"] = identity.username or ""
        config["sasl.password"] = identity.password or ""
    return config


def kafka_python_config(identity: Identity) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap_servers": identity.bootstrap.split(","),
        "security_protocol": identity.protocol,
    }
    if identity.tls:
        config["ssl_cafile"] = str(identity.ca)
        config["ssl_check_hostname"] = True
        if identity.certificate:
            config["ssl_certfile"] = str(identity.certificate)
            config["ssl_keyfile"] = str(identity.key)
    if identity.sasl:
        config["sasl_mechanism"] = identity.mechanism
        config["sasl_plain_username"] = identity.username
        config["sasl_plain_password"] = identity.password
    return config


def aiokafka_config(identity: Identity) -> dict[str, Any]:
    from aiokafka.helpers import create_ssl_context

    config: dict[str, Any] = {
        "bootstrap_servers": identity.bootstrap,
        "security_protocol": identity.protocol,
    }
    if identity.tls:
        config["ssl_context"] = create_ssl_context(
            cafile=str(identity.ca),
            certfile=str(identity.certificate) if identity.certificate else None,
            keyfile=str(identity.key) if identity.key else None,
        )
    if identity.sasl:
        config["sasl_mechanism"] = identity.mechanism
        config["sasl_plain_username"] = identity.username
        config["sasl_plain_password"] = identity.password
    return config


def kcat_options(identity: Identity) -> list[str]:
    options = ["-b", identity.bootstrap]
    for key, value in librdkafka_config(identity).items():
        if key != "bootstrap.servers":
            options += ["-X", f"{key}={value}"]
    return options


def kafkajs_job(identity: Identity, **job: Any) -> dict[str, Any]:
    ssl = None
    if identity.tls:
        ssl = {"ca": str(identity.ca)}
        if identity.certificate:
            ssl.update(cert=str(identity.certificate), key=str(identity.key))
    sasl = None
    if identity.sasl:
        sasl = {
            "mechanism": (identity.mechanism or "").lower(),
            "username": identity.username,
            "password": identity.password,
        }
    return {"brokers": identity.bootstrap.split(","), "ssl": ssl, "sasl": sasl, **job}


def run_kafkajs(job: dict[str, Any], timeout: float = TIMEOUT_S) -> dict[str, Any]:
    result = subprocess.run(
        ["node", str(NODE_CLIENT)],
        input=json.dumps(job).encode(),
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0 or not result.stdout.strip():
        raise AssertionError(
            f"node exited {result.returncode}: {result.stderr.decode()[-2000:]} (is KafkaJS "
            "installed? ./dev setup runs npm ci in tests/js)"
        )
    return json.loads(result.stdout.decode().strip().splitlines()[-1])


# -- operations ----------------------------------------------------------------------------------


def create_topic(
    client: str, identity: Identity, topic: str, partitions: int = 3, replication: int = 3
) -> None:
    if client == "kafka-python":
        from kafka.admin import KafkaAdminClient
        from kafka.admin import NewTopic as KpNewTopic

        admin = KafkaAdminClient(**kafka_python_config(identity), request_timeout_ms=30000)
        try:
            admin.create_topics([KpNewTopic(topic, partitions, replication)])
        finally:
            admin.close()
    elif client == "aiokafka":

        async def create() -> None:
            from aiokafka.admin import AIOKafkaAdminClient
            from aiokafka.admin import NewTopic as AioNewTopic

            admin = AIOKafkaAdminClient(**aiokafka_config(identity))
            await admin.start()
            try:
                await admin.create_topics([AioNewTopic(topic, partitions, replication)])
            finally:
                await admin.close()

        asyncio.run(create())
    elif client == "kafkajs":
        answer = run_kafkajs(
            kafkajs_job(
                identity,
                topic=topic,
                partitions=partitions,
                replicationFactor=replication,
                steps=["admin"],
            )
        )
        if not answer["ok"]:
            raise ClientRefused(json.dumps(answer))
    else:
        if client == "kcat":  # no admin API: it must at least see the cluster
            listing = subprocess.run(
                [KCAT, "-L", "-J", *kcat_options(identity)],
                capture_output=True,
                timeout=TIMEOUT_S,
                check=False,
            )
            if listing.returncode != 0:
                raise ClientRefused(listing.stderr.decode()[-2000:])
            if not json.loads(listing.stdout)["brokers"]:
                raise ClientRefused("kcat -L listed no brokers")
        admin = AdminClient(librdkafka_config(identity))
        futures = admin.create_topics([NewTopic(topic, partitions, replication)])
        for future in futures.values():
            try:
                future.result(timeout=TIMEOUT_S)
            except KafkaException as e:
                raise ClientRefused(str(e)) from None


def produce(client: str, identity: Identity, topic: str, values: Sequence[str]) -> None:
    if client == "confluent":
        errors: list[Any] = []
        producer = Producer(
            {
                **librdkafka_config(identity),
                "acks": "all",
                "message.timeout.ms": 30000,
                "error_cb": errors.append,
            }
        )
        failed: list[Any] = []
        for value in values:
            producer.produce(
                topic, value.encode(), on_delivery=lambda e, _m: failed.append(e) if e else None
            )
        if producer.flush(TIMEOUT_S):
            raise ClientRefused(f"undelivered records; errors {errors[:3]}")
        if failed:
            raise ClientRefused(str(failed[0]))
    elif client == "kafka-python":
        from kafka import KafkaProducer

        producer = KafkaProducer(
            **kafka_python_config(identity), acks="all", enable_idempotence=False, retries=0
        )
        try:
            for future in [producer.send(topic, value.encode()) for value in values]:
                try:
                    future.get(timeout=TIMEOUT_S)
                except Exception as e:
                    raise ClientRefused(repr(e)) from None
        finally:
            producer.close(timeout=10)
    elif client == "aiokafka":

        async def send() -> None:
            from aiokafka import AIOKafkaProducer

            producer = AIOKafkaProducer(**aiokafka_config(identity), acks="all")
            await producer.start()
            try:
                for value in values:
                    try:
                        await producer.send_and_wait(topic, value.encode())
                    except Exception as e:
                        raise ClientRefused(repr(e)) from None
            finally:
                await producer.stop()

        asyncio.run(send())
    elif client == "kcat":
        result = subprocess.run(
            [KCAT, "-P", "-t", topic, "-X", "acks=all", *kcat_options(identity)],
            input="\n".join(values).encode() + b"\n",
            capture_output=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0 or b"ERROR" in result.stderr:
            raise ClientRefused(result.stderr.decode()[-2000:])
    else:
        answer = run_kafkajs(
            kafkajs_job(identity, topic=topic, values=list(values), steps=["produce"], retries=1)
        )
        if not answer["ok"]:
            raise ClientRefused(json.dumps(answer))


def consume_group(client: str, identity: Identity, topic: str, group: str, count: int) -> list[str]:
    deadline = time.monotonic() + TIMEOUT_S
    if client == "confluent":
        consumer = Consumer(
            {
                **librdkafka_config(identity),
                "group.id": group,
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe([topic])
        got: list[str] = []
        try:
            while len(got) < count and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is None:
                    continue
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise ClientRefused(str(error))
                got.append(message.value().decode())
        finally:
            consumer.close()
        return got
    if client == "kafka-python":
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(
            topic,
            **kafka_python_config(identity),
            group_id=group,
            auto_offset_reset="earliest",
            consumer_timeout_ms=int(TIMEOUT_S * 1000),
        )
        got = []
        try:
            for message in consumer:
                got.append(message.value.decode())
                if len(got) >= count:
                    break
        finally:
            consumer.close()
        return got
    if client == "aiokafka":

        async def read() -> list[str]:
            from aiokafka import AIOKafkaConsumer

            consumer = AIOKafkaConsumer(
                topic, **aiokafka_config(identity), group_id=group, auto_offset_reset="earliest"
            )
            await consumer.start()
            values: list[str] = []
            try:
                async with asyncio.timeout(TIMEOUT_S):
                    async for message in consumer:
                        values.append(message.value.decode())
                        if len(values) >= count:
                            break
            except TimeoutError:
                pass
            finally:
                await consumer.stop()
            return values

        return asyncio.run(read())
    if client == "kcat":
        result = subprocess.run(
            [
                KCAT,
                "-G",
                group,
                "-o",
                "beginning",
                "-c",
                str(count),
                *kcat_options(identity),
                topic,
            ],
            capture_output=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0:
            raise ClientRefused(result.stderr.decode()[-2000:])
        return result.stdout.decode().splitlines()
    answer = run_kafkajs(
        kafkajs_job(
            identity,
            topic=topic,
            group=group,
            count=count,
            steps=["consume"],
            timeoutMs=int(TIMEOUT_S * 1000) - 5000,
        )
    )
    if not answer["ok"]:
        raise ClientRefused(json.dumps(answer))
    return list(answer["consumed"])
