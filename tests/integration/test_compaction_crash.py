"""A broker killed at each step of a segment swap restarts with a consistent compacted log.

The crash is the broker's own: `ODRADEK_CLEANER_CRASH_AT=<step>` in its environment (test-only;
see `odradek.log.segment_swap`) makes the process SIGKILL itself right after that step of a
cleaning, as a power cut or an OOM kill would stop it there. For each step, on one broker:

1. a compacted topic is written (six rounds over 40 keys, then keys written once) while its
   `min.cleanable.dirty.ratio` is 1, so nothing is cleaned yet;
2. the broker is restarted with the crash step in its environment, and the ratio is lowered
   through IncrementalAlterConfigs: the cleaner starts, and the broker dies at the step;
3. the broker is started again without it. Read from the beginning with confluent-kafka, the log
   must be consistent: offsets increase (no record twice), every record is the one the producer
   wrote at that offset, and every key's latest record is there (none lost); then the cleaning,
   started again, ends with exactly the latest record of each key and no `.cleaned` or `.swap`
   file left.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from odradek.log.naming import CLEANER_OFFSET_CHECKPOINT, log_dir_name
from odradek.log.segment_swap import CRASH_POINT_ENV, CRASH_POINTS
from odradek.testing import LocalCluster
from odradek.zk.server import port_is_free
from tests.fixtures.cluster import START_TIMEOUT_S, _bring_down, _used_clusters, wait_until
from tests.integration._clients import create_topic, unique_topic, wait_until_serving
from tests.integration.test_compaction import (
    CLEANING_TIMEOUT_S,
    COMPACTED,
    alter_topic,
    is_exactly,
    latest,
    read_all,
    rounds,
    tail,
    write,
)

BROKER = 1


@pytest.fixture(scope="module")
def crash_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster.up(
        tmp_path_factory.mktemp("compaction-crash"),
        1,
        overrides={
            "log.cleaner.backoff.ms": "200",
            "controlled.shutdown.enable": "false",
            "zookeeper.session.timeout.ms": "6000",
        },
        timeout=START_TIMEOUT_S,
    )
    try:
        wait_until_serving(cluster.bootstrap_servers)
        yield cluster
    finally:
        _bring_down(cluster)


@pytest.fixture(autouse=True)
def _report_logs(crash_cluster: LocalCluster, request: pytest.FixtureRequest) -> None:
    _used_clusters(request.node).append(crash_cluster)


def leftovers(cluster: LocalCluster, topic: str) -> list[str]:
    directory = Path(cluster.broker(BROKER).data_dir) / log_dir_name(topic, 0)
    return sorted(p.name for p in directory.iterdir() if p.suffix in (".cleaned", ".swap"))


def cleaner_checkpoint(cluster: LocalCluster, topic: str) -> int | None:
    """The topic's entry in `cleaner-offset-checkpoint` (None: no cleaning of it finished)."""
    path = Path(cluster.broker(BROKER).data_dir) / CLEANER_OFFSET_CHECKPOINT
    if not path.exists():
        return None
    for line in path.read_text().splitlines()[2:]:
        name, partition, offset = line.split()
        if (name, partition) == (topic, "0"):
            return int(offset)
    return None


@pytest.mark.parametrize("step", CRASH_POINTS)
def test_a_crash_at_each_swap_step_leaves_a_consistent_log(
    crash_cluster: LocalCluster, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = crash_cluster
    topic = unique_topic(f"crash-{step}")
    configs = {**COMPACTED, "min.cleanable.dirty.ratio": "1"}
    create_topic(cluster.bootstrap_servers, topic, replication_factor=1, configs=configs)
    written = write(
        "confluent", cluster.bootstrap_servers, topic, [*rounds(40, 6, "x"), *tail("x")]
    )
    expected = latest(written)

    # 2. restart with the crash armed, then make the topic due for cleaning
    monkeypatch.setenv(CRASH_POINT_ENV, step)
    cluster.terminate(BROKER)
    cluster.start_broker(BROKER, timeout=START_TIMEOUT_S)
    monkeypatch.delenv(CRASH_POINT_ENV)
    wait_until_serving(cluster.bootstrap_servers)
    alter_topic(cluster, topic, {"min.cleanable.dirty.ratio": "0.01"})
    wait_until(
        lambda: not cluster.is_alive(BROKER),
        CLEANING_TIMEOUT_S,
        f"the broker to kill itself after the swap step {step}",
    )

    # 3. start again: recovery finishes or discards the swap
    cluster.kill(BROKER)  # reaps the process, forgets its pid
    broker = cluster.broker(BROKER)
    # The kernel closes a dead process's sockets as it tears it down, a moment after it stops.
    wait_until(lambda: port_is_free(broker.port, broker.host), 30, "the broker's port to be free")
    cluster.start_broker(BROKER, timeout=START_TIMEOUT_S)
    wait_until_serving(cluster.bootstrap_servers)
    got = read_all(cluster.bootstrap_servers, topic)
    offsets = [offset for offset, _key, _value in got]
    assert offsets == sorted(set(offsets)), "an offset is present twice or out of order"
    for offset, key, value in got:
        assert (key, value) == (written[offset].key, written[offset].value), offset
    present = {(offset, key, value) for offset, key, value in got}
    lost = [k for k, (o, v) in expected.items() if (o, k, v) not in present]
    assert lost == [], f"latest records lost: {lost[:5]}"

    wait_until(
        lambda: is_exactly(read_all(cluster.bootstrap_servers, topic), expected),
        CLEANING_TIMEOUT_S,
        f"{topic} to be cleaned after the restart",
        interval=0.5,
    )
    # The log may read right before the restarted cleaning is done (after a crash at the
    # checkpoint step it is all cleaned already): its end is the checkpoint entry it writes.
    # Only then may no .cleaned or .swap file be left.
    wait_until(
        lambda: cleaner_checkpoint(cluster, topic) is not None,
        CLEANING_TIMEOUT_S,
        f"the cleaner to checkpoint {topic}",
    )
    assert leftovers(cluster, topic) == []
