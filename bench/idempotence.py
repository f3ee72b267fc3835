"""What idempotence costs a producer, and how long a broker takes to rebuild producer state.
Prints one JSON object per measurement, then a summary:

    ./dev bench idempotence                                   # both, default sizes
    ./dev bench idempotence --only throughput --records 1000000 --rounds 3
    ./dev bench idempotence --only rebuild --producers 10000
    ./dev bench idempotence --only append --appends 20000

* `throughput`: one broker, three topics of 6 partitions; confluent-kafka producers (100-byte
  records, linger 5 ms, acks=all) with enable.idempotence=true and false write the same records,
  and a control without idempotence but with librdkafka's in-flight limit of an idempotent
  producer (5 requests per connection; `MODES`), taking turns round by round so that all see
  the same machine load. Reports each round's records/s and the broker's CPU seconds, and the
  ratios of the medians: on vs off (the cost of idempotence as a client sees it) and on vs the
  control (what the broker's producer state costs).
* `append`: in process, no network: `Log.append_as_leader` of `--appends` one-record batches
  (100 bytes) with and without a producer id (5 producers taking turns), alternating rounds;
  reports microseconds per append and the difference -- the leader's own cost per batch.
* `rebuild`: `--producers` distinct producer ids each write one batch (of 2 records) to one
  partition; the broker is SIGKILLed and started again (no snapshot covers those batches, so it
  replays them all from the log), then stopped cleanly and started once more (now it loads the
  snapshot written at shutdown). Reports the broker's own timing of each load (its "producer
  state ... loaded" log line) and the time from start until the partition answers again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from odradek.network.client import BrokerConnection
from odradek.protocol.build import build
from odradek.protocol.codec import ApiKey, request_class
from odradek.protocol.record_batch import build_batch
from odradek.testing import LocalCluster

PARTITIONS = 6
PRODUCE_VERSION = 9


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def create_topic(
    bootstrap: str, topic: str, partitions: int, config: dict[str, str] | None = None
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(
        [NewTopic(topic, partitions, 1, config=config or {})]
    ).values():
        future.result(60)


# -- throughput -----------------------------------------------------------------------------------


MODES = {"on": (True, None), "off": (False, None), "off-5": (False, 5)}
"""mode -> (enable.idempotence, max.in.flight.requests.per.connection or librdkafka's default).
`off-5` is the control: idempotence off but librdkafka's in-flight limit as idempotence imposes it
(at most 5 requests per connection), so that on vs off-5 is what the broker's producer state
costs and off-5 vs off what the client's pipelining limit costs."""


def produce(
    bootstrap: str, topic: str, records: int, idempotent: bool, in_flight: int | None = None
) -> float:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            **({"max.in.flight.requests.per.connection": in_flight} if in_flight else {}),
            "acks": "all",
            "enable.idempotence": idempotent,
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_000_000,
        }
    )
    value = b"x" * 100
    failures = 0

    def report(error: Any, _message: Any) -> None:
        nonlocal failures
        if error is not None:
            failures += 1

    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=i % PARTITIONS, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(300) or failures:
        raise RuntimeError(f"{failures} records failed")
    return records / (time.perf_counter() - started)


def profile_idempotent_produce(cluster: LocalCluster, records: int, out: Path) -> dict[str, Any]:
    """py-spy samples the broker (200 Hz, raw collapsed stacks to `out`) while an idempotent
    producer writes `records`; the share of samples in the producer state's modules."""
    topic = f"bench-idem-profile-{uuid.uuid4().hex[:6]}"
    create_topic(cluster.bootstrap_servers, topic, PARTITIONS)
    produce(cluster.bootstrap_servers, topic, 20_000, True)
    spy = Path(sys.executable).parent / "py-spy"
    command = [str(spy), "record", "-p", str(cluster.brokers[0].pid), "-r", "200"]
    command += ["-f", "raw", "-o", str(out), "--nonblocking"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(3)  # py-spy attaches
        rate = produce(cluster.bootstrap_servers, topic, records, True)
    finally:
        process.send_signal(2)
        process.wait(60)
    total = state = append = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        total += int(count)
        state += int(count) if "producer_state" in stack or "producer_entry" in stack else 0
        append += int(count) if "append_as_leader" in stack else 0
    return {
        "measure": "profile",
        "records_per_s": round(rate),
        "samples": total,
        "producer_state_share": round(state / total, 4) if total else None,
        "leader_append_share": round(append / total, 4) if total else None,
        "stacks": str(out),
    }


def bench_throughput(
    systems: dict[str, tuple[str, int]], records: int, rounds: int
) -> list[dict[str, Any]]:
    """`systems`: name -> (bootstrap, broker pid); every system gets the same rounds, in turn."""
    topics = {
        (name, mode): f"bench-idem-{mode}-{uuid.uuid4().hex[:6]}"
        for name in systems
        for mode in MODES
    }
    for (name, _mode), topic in topics.items():
        create_topic(systems[name][0], topic, PARTITIONS)
    for (name, mode), topic in topics.items():  # warm-up: connections, metadata, producer id
        produce(systems[name][0], topic, 20_000, *MODES[mode])
    rates: dict[tuple[str, str], list[float]] = {key: [] for key in topics}
    cpu: dict[tuple[str, str], list[float]] = {key: [] for key in topics}
    order = list(MODES)
    for round_index in range(rounds):
        for name, (bootstrap, pid) in systems.items():
            # Each mode goes first, second and last in turn, so that all see the same load.
            for mode in order[round_index % 3 :] + order[: round_index % 3]:
                before = cpu_seconds(pid)
                rate = produce(bootstrap, topics[name, mode], records, *MODES[mode])
                used = cpu_seconds(pid) - before
                rates[name, mode].append(rate)
                cpu[name, mode].append(used)
                emit(
                    {
                        "measure": "produce",
                        "system": name,
                        "idempotence": mode,
                        "round": round_index,
                        "records_per_s": round(rate),
                        "broker_cpu_s": round(used, 2),
                    }
                )
    summaries = []
    for name in systems:
        on, off = statistics.median(rates[name, "on"]), statistics.median(rates[name, "off"])
        off_5 = statistics.median(rates[name, "off-5"])
        cpu_on, cpu_off = statistics.median(cpu[name, "on"]), statistics.median(cpu[name, "off"])
        summaries.append(
            {
                "measure": "produce_summary",
                "system": name,
                "records": records,
                "rounds": rounds,
                "idempotent_records_per_s": round(on),
                "plain_records_per_s": round(off),
                "plain_5_in_flight_records_per_s": round(off_5),
                "throughput_cost": round(1 - on / off, 3),
                "throughput_cost_same_in_flight": round(1 - on / off_5, 3),
                "idempotent_broker_cpu_s": round(cpu_on, 2),
                "plain_broker_cpu_s": round(cpu_off, 2),
                "broker_cpu_cost": round(cpu_on / cpu_off - 1, 3) if cpu_off else None,
            }
        )
    return summaries


JAVA_PRODUCER_TOTAL = re.compile(r"^(\d+) records sent, ([\d.]+) records/sec")


def produce_java(bootstrap: str, topic: str, records: int, idempotent: bool) -> float:
    """Kafka 3.9.1's ProducerPerformance (the Java client in a fresh JVM; its rate counts from
    its first send, so the JVM's start-up is not in it): 100-byte records, acks=all, linger 5 ms,
    and `enable.idempotence` on or off -- the Java client's default is on."""
    libs = kafka_libs()
    argv = [
        "java", "-cp", f"{libs}/*:{libs.parent / 'tools'}/*",
        "org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
        "--num-records", str(records), "--record-size", "100", "--throughput", "-1",
        "--producer-props", f"bootstrap.servers={bootstrap}", "acks=all", "linger.ms=5",
        f"enable.idempotence={'true' if idempotent else 'false'}",
    ]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    last = (result.stdout.strip().splitlines() or [""])[-1]
    match = JAVA_PRODUCER_TOTAL.match(last)
    if result.returncode != 0 or match is None or int(match.group(1)) != records:
        raise RuntimeError(f"ProducerPerformance failed: {(result.stderr or last)[-300:]}")
    return float(match.group(2))


def bench_java_throughput(
    systems: dict[str, tuple[str, int]], records: int, rounds: int
) -> list[dict[str, Any]]:
    """As `bench_throughput` with the Java client: idempotence on (its default) vs off."""
    modes = ("on", "off")
    topics = {
        (name, mode): f"bench-idem-java-{mode}-{uuid.uuid4().hex[:6]}"
        for name in systems
        for mode in modes
    }
    for (name, _mode), topic in topics.items():
        create_topic(systems[name][0], topic, PARTITIONS)
    rates: dict[tuple[str, str], list[float]] = {key: [] for key in topics}
    cpu: dict[tuple[str, str], list[float]] = {key: [] for key in topics}
    for round_index in range(rounds):
        for name, (bootstrap, pid) in systems.items():
            for mode in modes if round_index % 2 == 0 else modes[::-1]:
                before = cpu_seconds(pid)
                rate = produce_java(bootstrap, topics[name, mode], records, mode == "on")
                used = cpu_seconds(pid) - before
                rates[name, mode].append(rate)
                cpu[name, mode].append(used)
                emit(
                    {
                        "measure": "produce_java",
                        "system": name,
                        "idempotence": mode,
                        "round": round_index,
                        "records_per_s": round(rate),
                        "broker_cpu_s": round(used, 2),
                    }
                )
    summaries = []
    for name in systems:
        on, off = statistics.median(rates[name, "on"]), statistics.median(rates[name, "off"])
        summaries.append(
            {
                "measure": "produce_java_summary",
                "system": name,
                "records": records,
                "rounds": rounds,
                "idempotent_records_per_s": round(on),
                "plain_records_per_s": round(off),
                "throughput_cost": round(1 - on / off, 3),
                "idempotent_broker_cpu_s": round(statistics.median(cpu[name, "on"]), 2),
                "plain_broker_cpu_s": round(statistics.median(cpu[name, "off"]), 2),
            }
        )
    return summaries


def kafka_libs() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return Path(os.environ.get("ODRADEK_KAFKA_LIBS", cache / "odradek/kafka-3.9.1/libs"))


def start_kafka(work: Path) -> Any:
    """A one-broker Kafka 3.9.1 with its own ZooKeeper, as `bench/peers.py` runs it."""
    spec = importlib.util.spec_from_file_location("peers", Path(__file__).with_name("peers.py"))
    assert spec is not None and spec.loader is not None
    peers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peers)
    kafka = peers.Kafka(work, argparse.Namespace())
    try:
        kafka.start()
    except BaseException:
        kafka.stop()
        raise
    return kafka


# -- append (in process) -------------------------------------------------------------------------


def bench_append(appends: int, rounds: int) -> dict[str, Any]:
    from odradek.log.config import LogConfig
    from odradek.log.log import Log

    now = int(time.time() * 1000)
    plain = [build_batch([(None, b"x" * 100, [], now)]) for _ in range(appends)]
    idempotent = [
        build_batch(
            [(None, b"x" * 100, [], now)],
            producer_id=i % 5,
            producer_epoch=0,
            base_sequence=i // 5,
        )
        for i in range(appends)
    ]
    timings: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="odradek-bench-append-") as directory:
        for round_index in range(rounds):
            for mode in ("on", "off") if round_index % 2 == 0 else ("off", "on"):
                log = Log.open(
                    Path(directory) / f"{mode}{round_index}-0",
                    LogConfig(),
                    recovery_point=0,
                    log_start_offset=0,
                    clean_shutdown=True,
                    now_ms=now,
                )
                batches = idempotent if mode == "on" else plain
                started = time.perf_counter()
                for batch in batches:
                    log.append_as_leader(batch, 0, now)
                elapsed = time.perf_counter() - started
                log.close()
                timings[mode].append(elapsed / appends * 1e6)
                emit(
                    {
                        "measure": "append",
                        "idempotence": mode,
                        "round": round_index,
                        "us_per_append": round(timings[mode][-1], 2),
                    }
                )
    on, off = statistics.median(timings["on"]), statistics.median(timings["off"])
    return {
        "measure": "append_summary",
        "appends": appends,
        "idempotent_us_per_append": round(on, 2),
        "plain_us_per_append": round(off, 2),
        "producer_state_us_per_batch": round(on - off, 2),
    }


# -- rebuild --------------------------------------------------------------------------------------


async def write_producers(
    host: str, port: int, topic: str, producers: int, window: int = 64
) -> None:
    connection = await BrokerConnection.connect(host, port, timeout=30, client_id="bench-idem")
    now = int(time.time() * 1000)
    request_type = request_class(ApiKey.PRODUCE, PRODUCE_VERSION)
    semaphore = asyncio.Semaphore(window)

    async def one(producer_id: int) -> None:
        batch = build_batch(
            [(None, b"v" * 50, [], now), (None, b"w" * 50, [], now)],
            producer_id=producer_id,
            producer_epoch=0,
            base_sequence=0,
        )
        message = build(
            request_type,
            {
                "transactional_id": None,
                "acks": 1,
                "timeout": 30_000,
                "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}],
            },
        )
        async with semaphore:
            response = await connection.send(ApiKey.PRODUCE, PRODUCE_VERSION, message, timeout=60)
        code = response.responses[0].partition_responses[0].error_code
        if code != ErrorCode.none:
            raise RuntimeError(f"producer {producer_id}: {ErrorCode(code)!r}")

    try:
        await asyncio.gather(*(one(1_000_000 + i) for i in range(producers)))
    finally:
        connection.close()


LOADED = re.compile(
    r"(?P<where>\S+): producer state of (?P<producers>\d+) producers loaded from offset "
    r"(?P<snapshot>\d+) in (?P<load_ms>[\d.]+) ms, then (?P<replayed>\d+) batches replayed up to "
    r"offset (?P<end>\d+) in (?P<replay_ms>[\d.]+) ms"
)


def loaded_line(log: Path, where: str, since: int) -> dict[str, Any] | None:
    with open(log, errors="replace") as file:
        file.seek(since)
        for line in file:
            match = LOADED.search(line)
            if match and match["where"] == where:
                return {
                    "producers": int(match["producers"]),
                    "snapshot_offset": int(match["snapshot"]),
                    "snapshot_load_ms": float(match["load_ms"]),
                    "batches_replayed": int(match["replayed"]),
                    "replay_ms": float(match["replay_ms"]),
                }
    return None


def answers(host: str, port: int, topic: str) -> bool:
    async def ask() -> bool:
        connection = await BrokerConnection.connect(host, port, timeout=5, client_id="bench-idem")
        try:
            message = build(
                request_class(ApiKey.LIST_OFFSETS, 6),
                {
                    "replica_id": -1,
                    "isolation_level": 0,
                    "topics": [
                        {
                            "name": topic,
                            "partitions": [
                                {"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1}
                            ],
                        }
                    ],
                },
            )
            response = await connection.send(ApiKey.LIST_OFFSETS, 6, message, timeout=5)
            return response.topics[0].partitions[0].error_code == ErrorCode.none
        finally:
            connection.close()

    try:
        return asyncio.run(ask())
    except Exception:
        return False


def restart_and_time(cluster: LocalCluster, topic: str, clean: bool) -> dict[str, Any]:
    broker = cluster.brokers[0]
    if clean:
        cluster.terminate(broker.id)
    else:
        cluster.kill(broker.id)
    since = broker.log.stat().st_size
    started = time.monotonic()
    cluster.start_broker(broker.id, timeout=300)
    while not answers(broker.host, broker.port, topic):
        if time.monotonic() - started > 300:
            raise RuntimeError("the partition did not come back")
        time.sleep(0.05)
    serving = time.monotonic() - started
    line = loaded_line(broker.log, f"{topic}-0", since)
    return {
        "measure": "rebuild",
        "restart": "clean (snapshot)" if clean else "unclean (replay)",
        "start_to_serving_s": round(serving, 2),
        **(line or {"error": "no producer state line in the broker log"}),
    }


def bench_rebuild(cluster: LocalCluster, producers: int) -> list[dict[str, Any]]:
    broker = cluster.brokers[0]
    topic = f"bench-idem-rebuild-{uuid.uuid4().hex[:6]}"
    create_topic(cluster.bootstrap_servers, topic, 1)
    started = time.monotonic()
    asyncio.run(write_producers(broker.host, broker.port, topic, producers))
    emit(
        {
            "measure": "rebuild_setup",
            "producers": producers,
            "write_s": round(time.monotonic() - started, 2),
        }
    )
    return [
        restart_and_time(cluster, topic, clean=False),
        restart_and_time(cluster, topic, clean=True),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=["throughput", "java", "append", "rebuild"])
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="FILE",
        help="also profile the broker under an idempotent producer with py-spy (stacks to FILE)",
    )
    parser.add_argument(
        "--kafka",
        action="store_true",
        help="also measure a Kafka 3.9.1 broker (the jars of ./dev kafka) in the same rounds",
    )
    parser.add_argument(
        "--java",
        action="store_true",
        help="also measure Kafka 3.9.1's Java client (ProducerPerformance), idempotence on vs off",
    )
    parser.add_argument("--appends", type=int, default=20_000)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--producers", type=int, default=10_000)
    args = parser.parse_args()
    summary: list[dict[str, Any]] = []
    if args.only in (None, "append"):
        result = bench_append(args.appends, args.rounds)
        emit(result)
        summary.append(result)
    if args.only == "append":
        emit({"summary": summary})
        return
    with tempfile.TemporaryDirectory(prefix="odradek-bench-idem-") as directory:
        cluster = LocalCluster.up(Path(directory), 1, timeout=120)
        stack = contextlib.ExitStack()
        try:
            if args.only in (None, "throughput", "java"):
                systems = {"odradek": (cluster.bootstrap_servers, cluster.brokers[0].pid or 0)}
                if args.kafka:
                    kafka = start_kafka(Path(directory))
                    stack.callback(kafka.stop)
                    systems["kafka"] = (kafka.bootstrap, kafka.pid)
                if args.only != "java":
                    for result in bench_throughput(systems, args.records, args.rounds):
                        emit(result)
                        summary.append(result)
                if args.java or args.only == "java":
                    for result in bench_java_throughput(systems, args.records, args.rounds):
                        emit(result)
                        summary.append(result)
            if args.py_spy is not None:
                result = profile_idempotent_produce(cluster, 4 * args.records, args.py_spy)
                emit(result)
                summary.append(result)
            if args.only in (None, "rebuild"):
                for result in bench_rebuild(cluster, args.producers):
                    emit(result)
                    summary.append(result)
        finally:
            stack.close()
            cluster.down(timeout=60)
            cluster.kill_all()
    emit({"summary": summary})


if __name__ == "__main__":
    main()
