"""Disk faults on a JBOD broker (KIP-112), with real file systems and a real 3-broker cluster.

Broker 1 has four log directories: `full` (a 1 MiB tmpfs), `readonly` (an ext4 image on a loop
device, mounted errors=remount-ro), `eio` (a plain directory whose writes the preloaded EIO shim
fails on demand) and `data`. Brokers 2 and 3 have one each. One topic per fault directory, RF=3
with broker 1 as the preferred leader, is placed there by the log manager's rule (the live
directory with the fewest logs, in `log.dirs` order); `healthy` lands in `data`. The tests run in
order on one cluster (about a minute in all):

1. a directory fills up, 2. one turns read-only, 3. one returns EIO — each while an acks=all
   producer writes to its partition: the directory goes offline, leadership moves to 2 or 3,
   broker 1 leaves the ISR and is listed in `offline_replicas`, DescribeLogDirs reports the
   directory with KAFKA_STORAGE_ERROR, broker 1 keeps leading `healthy` and accepts writes to it,
   and every acknowledged record is readable from the new leader;
4. the last directory fails: broker 1 halts (as Kafka does), leadership of `healthy` moves;
5. the faults are repaired and broker 1 restarts: its replicas recover (a torn tail cut, then
   truncation and catch-up), rejoin every ISR, lead again after the preferred-replica
   rebalance, hold every acknowledged record, and are byte-identical to the other replicas;
6. broker 2 is SIGKILLed and every kind of file in its log directory torn at a random position
   (segments, both indexes, the four directory-level files, each partition's leader-epoch
   checkpoint and partition.metadata; `ODRADEK_TORN_SEED` replays a run): it restarts, catches
   up and ends identical to the others.

Skipped unless run as root with mount, mkfs.ext4, e2fsck and a C compiler.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from odradek.errors import OdradekError
from odradek.log.naming import log_dir_name, parse_segment_file_name
from odradek.protocol.codec import ApiKey
from odradek.protocol.record_batch import iter_batches
from odradek.testing import LocalCluster
from tests.faults.disk.disks import EioShim, Ext4Dir, TmpfsDir, tools_missing
from tests.faults.workload import read_partition_states
from tests.fixtures.cluster import wait_until
from tests.integration._replication import (
    Deliveries,
    StreamingProducer,
    assert_acknowledged_present,
    broker_metadata,
    create_topic,
    read_committed,
    request,
)

_missing = tools_missing()
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting file systems needs root"),
    pytest.mark.skipif(_missing is not None, reason=_missing or ""),
]

FULL_BYTES = 1 << 20
EXT4_BYTES = 32 << 20
FAULT_TIMEOUT_S = 60.0
RECOVERY_TIMEOUT_S = 90.0
RECORD_BYTES = 2000
ASSIGNMENT = [[1, 2, 3]]


@dataclass
class DiskCluster:
    cluster: LocalCluster
    dirs: dict[str, Path]  # broker 1's log directories by name
    full: TmpfsDir
    readonly: Ext4Dir
    shim: EioShim
    acknowledged: dict[str, dict[int, bytes | None]]  # topic -> offset -> value


@pytest.fixture(scope="module")
def disks() -> Iterator[DiskCluster]:
    # Not under pytest's tmp_path root: every pytest session on the machine prunes old
    # pytest-of-<user>/pytest-N directories, and one doing so would walk into our mounts.
    base = Path(tempfile.mkdtemp(prefix="odradek-disk-faults-"))
    directory = base / "cluster"
    broker_dir = directory / "broker-1"
    dirs = {name: broker_dir / name for name in ("full", "readonly", "eio", "data")}
    shim = EioShim(base)
    full = readonly = None
    cluster = None
    try:
        full = TmpfsDir(dirs["full"], FULL_BYTES)
        readonly = Ext4Dir(dirs["readonly"], base / "readonly.img", EXT4_BYTES)
        dirs["eio"].mkdir(parents=True)
        cluster = LocalCluster.up(
            directory,
            3,
            overrides={
                "min.insync.replicas": "2",
                "unclean.leader.election.enable": "false",
                "leader.imbalance.check.interval.seconds": "2",
                "leader.imbalance.per.broker.percentage": "0",
                # Checkpoints soon, so that test 6 finds every file to tear.
                "log.flush.offset.checkpoint.interval.ms": "1000",
                "replica.high.watermark.checkpoint.interval.ms": "500",
            },
            per_broker_overrides={1: {"log.dirs": ",".join(str(d) for d in dirs.values())}},
            broker_env={1: shim.environment()},
            timeout=120,
        )
        # One topic per directory, in log.dirs order: each lands in the emptiest directory.
        for name in ("full", "readonly", "eio", "data"):
            topic = "healthy" if name == "data" else name
            create_topic(cluster, topic, ASSIGNMENT, {"min.insync.replicas": "2"})
            assert (dirs[name] / log_dir_name(topic, 0)).is_dir(), f"{topic} is not in {name}"
        yield DiskCluster(cluster, dirs, full, readonly, shim, {})
    finally:
        shim.repair()
        if cluster is not None:
            cluster.kill_all()
        if readonly is not None:
            readonly.unmount()
        if full is not None:
            full.unmount()
        if not any(os.path.ismount(d) for d in dirs.values()):
            shutil.rmtree(base, ignore_errors=True)


def _state(disks: DiskCluster, topic: str) -> tuple[int, list[int]]:
    state = read_partition_states(disks.cluster.zookeeper_connect, topic, 1)[0]
    return state.leader, sorted(state.isr)


def _log_dir_errors(disks: DiskCluster) -> dict[str, ErrorCode]:
    response = request(disks.cluster.broker(1), ApiKey.DESCRIBE_LOG_DIRS, 4, {"topics": None})
    names = {os.path.abspath(path): name for name, path in disks.dirs.items()}
    return {names[r.log_dir]: r.error_code for r in response.results}


def _wait_offline(disks: DiskCluster, topic: str, name: str) -> None:
    """The fault's consequences: leadership moved, broker 1 out of the ISR and listed offline,
    its directory reported failed, its other directories still served."""

    def moved() -> bool:
        leader, isr = _state(disks, topic)
        return leader in (2, 3) and 1 not in isr

    wait_until(moved, FAULT_TIMEOUT_S, f"leadership of {topic} to leave broker 1")

    def listed_offline() -> bool:
        view = broker_metadata(disks.cluster.broker(2), topic).get(0)
        return view is not None and 1 not in view.isr

    wait_until(listed_offline, FAULT_TIMEOUT_S, f"broker 2's metadata to drop 1 from {topic}")
    metadata = request(
        disks.cluster.broker(2),
        ApiKey.METADATA,
        12,
        {"topics": [{"name": topic, "topic_id": None}], "allow_auto_topic_creation": False},
    )
    assert list(metadata.topics[0].partitions[0].offline_replicas) == [1]
    assert _log_dir_errors(disks)[name] == ErrorCode.kafka_storage_error
    assert _log_dir_errors(disks)["data"] == ErrorCode.none
    assert _state(disks, "healthy")[0] == 1, "broker 1 must keep leading the healthy directory"


def _produce_through(disks: DiskCluster, topic: str, inject: Callable[[], None]) -> Deliveries:
    """Produce to `topic` (acks=all), inject the fault once some records are acknowledged, keep
    producing until the new leader acknowledged more, and return every delivery report."""
    producer = StreamingProducer(
        disks.cluster.bootstrap_servers,
        topic,
        f"{topic}-value",
        partition=0,
        interval=0.001,
        value_bytes=RECORD_BYTES,
        message_timeout_ms=60_000,
        request_timeout_ms=5000,
    ).start()
    try:
        wait_until(lambda: producer.acknowledged_count() >= 50, 30, "the first acknowledgements")
        inject()
        _wait_offline(disks, topic, topic)
        after = producer.acknowledged_count()
        wait_until(
            lambda: producer.acknowledged_count() >= after + 50, 30, "writes to the new leader"
        )
    except BaseException:
        producer.abandon()
        raise
    return producer.stop()


def _check_acknowledged(disks: DiskCluster, topic: str, deliveries: Deliveries) -> None:
    acknowledged = deliveries.acknowledged_by_partition().get(0, {})
    assert acknowledged, "nothing was acknowledged"
    disks.acknowledged.setdefault(topic, {}).update(acknowledged)
    leader, _ = _state(disks, topic)
    read = read_committed(disks.cluster.broker(leader), topic, 0)
    assert read.error == ErrorCode.none
    assert_acknowledged_present(acknowledged, read.records, f"{topic} on broker {leader}")


def _healthy_still_writable(disks: DiskCluster) -> None:
    producer = StreamingProducer(disks.cluster.bootstrap_servers, "healthy", "h", partition=0)
    producer.start()
    try:
        wait_until(lambda: producer.acknowledged_count() >= 20, 30, "writes to healthy")
    except BaseException:
        producer.abandon()
        raise
    _check_acknowledged(disks, "healthy", producer.stop())


def test_a_full_log_dir_goes_offline_and_leadership_moves(disks: DiskCluster):
    deliveries = _produce_through(disks, "full", lambda: None)  # 1 MiB fills up by itself
    _check_acknowledged(disks, "full", deliveries)
    _healthy_still_writable(disks)


def test_a_log_dir_remounted_read_only_goes_offline(disks: DiskCluster):
    def fail() -> None:
        disks.readonly.fail()
        wait_until(disks.readonly.is_read_only, 10, "ext4 to remount itself read-only")

    deliveries = _produce_through(disks, "readonly", fail)
    _check_acknowledged(disks, "readonly", deliveries)
    _healthy_still_writable(disks)


def test_a_log_dir_returning_io_errors_goes_offline(disks: DiskCluster):
    deliveries = _produce_through(disks, "eio", lambda: disks.shim.fail(disks.dirs["eio"]))
    _check_acknowledged(disks, "eio", deliveries)
    _healthy_still_writable(disks)


def test_the_broker_halts_when_its_last_log_dir_fails(disks: DiskCluster):
    cluster = disks.cluster
    producer = StreamingProducer(
        cluster.bootstrap_servers, "healthy", "last", partition=0, message_timeout_ms=60_000
    ).start()
    try:
        wait_until(lambda: producer.acknowledged_count() >= 20, 30, "writes to healthy")
        disks.shim.fail(disks.dirs["data"])
        wait_until(lambda: not cluster.is_alive(1), FAULT_TIMEOUT_S, "broker 1 to halt")

        def moved() -> bool:
            leader, isr = _state(disks, "healthy")
            return leader in (2, 3) and 1 not in isr

        wait_until(moved, FAULT_TIMEOUT_S, "leadership of healthy to leave broker 1")
        after = producer.acknowledged_count()
        wait_until(lambda: producer.acknowledged_count() >= after + 20, 30, "writes after it")
    except BaseException:
        producer.abandon()
        raise
    _check_acknowledged(disks, "healthy", producer.stop())
    assert (
        "halting the broker: all log directories have failed" in cluster.broker(1).log.read_text()
    )


def _replica_batches(directory: Path) -> list[bytes]:
    batches = []
    for entry in sorted(directory.iterdir()):
        parsed = parse_segment_file_name(entry.name)
        if parsed is None or parsed[1] != ".log":
            continue
        data = entry.read_bytes()
        batches += [bytes(data[h.position : h.position + h.size]) for h in iter_batches(data)]
    return batches


def test_replicas_recover_after_the_disks_are_repaired_and_the_broker_restarts(
    disks: DiskCluster,
):
    cluster = disks.cluster
    assert not cluster.is_alive(1)
    disks.shim.repair()
    disks.full.grow(64 << 20)
    disks.readonly.repair()
    cluster.start_broker(1, timeout=RECOVERY_TIMEOUT_S)
    topics = {"full": "full", "readonly": "readonly", "eio": "eio", "healthy": "data"}
    for topic in topics:

        def recovered(topic: str = topic) -> bool:
            leader, isr = _state(disks, topic)
            return leader == 1 and isr == [1, 2, 3]

        wait_until(recovered, RECOVERY_TIMEOUT_S, f"broker 1 to rejoin and lead {topic}")
    assert all(code == ErrorCode.none for code in _log_dir_errors(disks).values())
    for topic, name in topics.items():
        read = read_committed(cluster.broker(1), topic, 0)
        assert read.error == ErrorCode.none
        assert_acknowledged_present(disks.acknowledged[topic], read.records, f"{topic} on 1")

        def identical(topic: str = topic, name: str = name) -> bool:
            try:
                copies = [
                    _replica_batches(disks.dirs[name] / log_dir_name(topic, 0)),
                    _replica_batches(cluster.broker(2).data_dir / log_dir_name(topic, 0)),
                    _replica_batches(cluster.broker(3).data_dir / log_dir_name(topic, 0)),
                ]
            except (OSError, OdradekError):
                return False
            return copies[0] == copies[1] == copies[2] and len(copies[0]) > 0

        wait_until(identical, RECOVERY_TIMEOUT_S, f"the three replicas of {topic} to match")


def _tear(path: Path, rng: random.Random, how: str) -> str:
    if not path.exists():  # e.g. no leader-epoch-checkpoint yet on a follower
        return f"{path.name}: absent"
    data = path.read_bytes()
    position = rng.randrange(0, len(data) + 1) if data else 0
    if how == "truncate":
        path.write_bytes(data[:position])
    elif how == "zeros":
        path.write_bytes(data[:position] + bytes(len(data) - position))
    else:
        junk = rng.randbytes(8)
        path.write_bytes(data[:position] + junk + data[position + len(junk) :])
    return f"{path.name}: {how} at {position} of {len(data)}"


def test_a_broker_restarts_after_torn_writes_in_every_file_type(
    disks: DiskCluster, request: pytest.FixtureRequest
):
    """SIGKILL broker 2, damage every kind of file in its log directory at random positions
    (seed printed on failure), restart it: it starts, truncates, catches up, and its replicas
    end byte-identical to the others, with every acknowledged record."""
    cluster = disks.cluster
    seed = int(os.environ.get("ODRADEK_TORN_SEED", str(random.randrange(2**32))))
    rng = random.Random(seed)
    data = cluster.broker(2).data_dir
    directory_files = (
        "replication-offset-checkpoint",
        "recovery-point-offset-checkpoint",
        "log-start-offset-checkpoint",
        "meta.properties",
    )
    wait_until(
        lambda: all((data / name).exists() for name in directory_files),
        30,
        "broker 2's checkpoints to be written",
    )
    cluster.kill(2)
    damage = []
    for name in (
        "replication-offset-checkpoint",
        "recovery-point-offset-checkpoint",
        "log-start-offset-checkpoint",
        "meta.properties",
    ):
        damage.append(_tear(data / name, rng, "truncate"))
    for topic in ("full", "readonly", "eio", "healthy"):
        directory = data / log_dir_name(topic, 0)
        active = max(directory.glob("*.log"))
        damage.append(_tear(active, rng, "truncate"))
        for suffix, how in ((".index", "zeros"), (".timeindex", "junk")):
            index = active.with_suffix(suffix)
            if index.exists():
                damage.append(_tear(index, rng, how))
        damage.append(_tear(directory / "leader-epoch-checkpoint", rng, "truncate"))
        damage.append(_tear(directory / "partition.metadata", rng, "truncate"))
    request.node.add_report_section("call", "torn files", f"seed {seed}\n" + "\n".join(damage))
    cluster.start_broker(2, timeout=RECOVERY_TIMEOUT_S)
    for topic in ("full", "readonly", "eio", "healthy"):

        def rejoined(topic: str = topic) -> bool:
            return _state(disks, topic)[1] == [1, 2, 3]

        wait_until(
            rejoined, RECOVERY_TIMEOUT_S, f"broker 2 to rejoin the ISR of {topic} (seed {seed})"
        )
        leader, _ = _state(disks, topic)
        read = read_committed(cluster.broker(leader), topic, 0)
        assert_acknowledged_present(
            disks.acknowledged[topic], read.records, f"{topic}, seed {seed}"
        )

        def identical(topic: str = topic) -> bool:
            first = disks.dirs["data" if topic == "healthy" else topic]
            copies = [
                _replica_batches(first / log_dir_name(topic, 0)),
                _replica_batches(cluster.broker(2).data_dir / log_dir_name(topic, 0)),
                _replica_batches(cluster.broker(3).data_dir / log_dir_name(topic, 0)),
            ]
            return copies[0] == copies[1] == copies[2]

        wait_until(identical, RECOVERY_TIMEOUT_S, f"the replicas of {topic} to match (seed {seed})")
