"""`odradek consumer-groups`, `delete-records` and `log-dirs` checked against what clients see,
on the shared cluster: every number the tools print is compared with what confluent-kafka reads
through its own API (committed offsets, watermarks, member id, client id), and every change they
make is read back by a client (a reset consumer resumes where the tool put it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from odradek.testing import LocalCluster
from tests.integration._clients import create_topic, unique_topic
from tests.integration._groups import (
    CLIENT_TIMEOUT_S,
    committed,
    group_consumer,
    poll_all,
    produce,
    unique_group,
)


def odradek(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "odradek.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def table(stdout: str) -> list[dict[str, str]]:
    """Rows of a Kafka-style table (a header line, then rows, columns split on whitespace)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    header = lines[0].split()
    return [dict(zip(header, line.split(), strict=False)) for line in lines[1:]]


def watermarks(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_group("wm")})
    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=CLIENT_TIMEOUT_S
        )
        return int(low), int(high)
    finally:
        consumer.close()


def test_consumer_groups_cli_matches_what_clients_see(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic, group = unique_topic("cli"), unique_group("cli")
    create_topic(bootstrap, topic, partitions=3)
    produce(bootstrap, topic, {0: 10, 1: 10, 2: 4}, "a")
    cli = ("consumer-groups", "--bootstrap-server", bootstrap)
    consumer = group_consumer(bootstrap, group, topic, **{"client.id": "cli-client"})
    try:
        poll_all((consumer,), 24, {})
        consumer.commit(
            offsets=[TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 6)], asynchronous=False
        )
        # --describe: the committed offsets, ends and lags clients read; the member as it is.
        described = odradek(*cli, "--describe", "--group", group)
        assert described.returncode == 0, described.stderr
        assert described.stdout.startswith("\nGROUP ")
        rows = {int(r["PARTITION"]): r for r in table(described.stdout)}
        seen = committed(bootstrap, group, topic, 3)
        assert seen == {0: 3, 1: 6, 2: -1001}
        for partition, row in rows.items():
            end = watermarks(bootstrap, topic, partition)[1]
            assert row["GROUP"] == group and row["TOPIC"] == topic
            assert row["LOG-END-OFFSET"] == str(end)
            if seen[partition] >= 0:
                assert row["CURRENT-OFFSET"] == str(seen[partition])
                assert row["LAG"] == str(end - seen[partition])
            else:
                assert row["CURRENT-OFFSET"] == row["LAG"] == "-"
            assert row["CONSUMER-ID"] == consumer.memberid()
            assert row["CLIENT-ID"] == "cli-client"
        assert sorted(rows) == [0, 1, 2]
        members = table(
            odradek(*cli, "--describe", "--group", group, "--members", "--verbose").stdout
        )
        assert [(m["CONSUMER-ID"], m["#PARTITIONS"], m["ASSIGNMENT"]) for m in members] == [
            (consumer.memberid(), "3", f"{topic}(0,1,2)")
        ]
        (state,) = table(odradek(*cli, "--describe", "--group", group, "--state").stdout)
        assert (state["STATE"], state["#MEMBERS"]) == ("Stable", "1")
        assert group in odradek(*cli, "--list").stdout.split()
        # A reset of an active group is refused, with one error line and status 1.
        refused = odradek(
            *cli, "--reset-offsets", "--group", group, "--all-topics", "--to-earliest", "--execute"
        )
        assert refused.returncode == 1
        assert refused.stderr.strip().splitlines()[-1].startswith("odradek: error: ")
        assert "inactive" in refused.stderr
    finally:
        consumer.close()
    # Resets: a dry run changes nothing; --execute commits; a consumer resumes there.
    dry = odradek(
        *cli, "--reset-offsets", "--group", group, "--topic", topic, "--to-latest", "--dry-run"
    )
    assert dry.returncode == 0, dry.stderr
    assert [(r["PARTITION"], r["NEW-OFFSET"]) for r in table(dry.stdout)] == [
        ("0", "10"),
        ("1", "10"),
        ("2", "4"),
    ]
    assert committed(bootstrap, group, topic, 3) == {0: 3, 1: 6, 2: -1001}
    done = odradek(
        *cli,
        "--reset-offsets",
        "--group",
        group,
        "--topic",
        f"{topic}:0,2",
        "--to-offset",
        "2",
        "--execute",
    )
    assert done.returncode == 0, done.stderr
    assert committed(bootstrap, group, topic, 3) == {0: 2, 1: 6, 2: 2}
    shifted = odradek(
        *cli, "--reset-offsets", "--group", group, "--all-topics", "--shift-by", "-100", "--execute"
    )
    assert shifted.returncode == 0, shifted.stderr
    assert committed(bootstrap, group, topic, 3) == {0: 0, 1: 0, 2: 0}
    late = odradek(
        *cli,
        "--reset-offsets",
        "--group",
        group,
        "--topic",
        f"{topic}:1",
        "--by-duration",
        "PT0S",
        "--execute",
    )
    assert late.returncode == 0, late.stderr
    assert committed(bootstrap, group, topic, 3)[1] == 10
    resumed: dict[int, list[tuple[int, int]]] = {}
    reader = group_consumer(bootstrap, group, topic)
    try:
        poll_all((reader,), 14, resumed)
    finally:
        reader.close()
    assert sorted(resumed[0]) == [(0, o) for o in range(10)] + [(2, o) for o in range(4)]
    # --delete-offsets, then --delete.
    removed = odradek(*cli, "--delete-offsets", "--group", group, "--topic", f"{topic}:1")
    assert removed.returncode == 0, removed.stderr
    assert "Successful" in removed.stdout
    assert committed(bootstrap, group, topic, 3)[1] == -1001
    deleted = odradek(*cli, "--delete", "--group", group)
    assert deleted.returncode == 0, deleted.stderr
    assert f"'{group}'" in deleted.stdout
    assert group not in odradek(*cli, "--list").stdout.split()
    gone = odradek(*cli, "--describe", "--group", group)
    assert gone.returncode == 1 and "does not exist" in gone.stderr
    assert committed(bootstrap, group, topic, 3) == dict.fromkeys(range(3), -1001)


def test_delete_records_and_log_dirs_cli(cluster3: LocalCluster, tmp_path: Path) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("cli-records")
    create_topic(bootstrap, topic, partitions=2, replication_factor=3)
    produce(bootstrap, topic, {0: 12, 1: 3}, "r")
    offsets = tmp_path / "offsets.json"
    offsets.write_text(
        json.dumps(
            {
                "version": 1,
                "partitions": [
                    {"topic": topic, "partition": 0, "offset": 5},
                    {"topic": topic, "partition": 1, "offset": 99},
                ],
            }
        )
    )
    result = odradek(
        "delete-records", "--bootstrap-server", bootstrap, "--offset-json-file", str(offsets)
    )
    assert result.returncode == 1  # partition 1 has no offset 99
    assert f"partition: {topic}-0\tlow_watermark: 5" in result.stdout.splitlines()
    assert f"partition: {topic}-1\terror: OFFSET_OUT_OF_RANGE" in result.stdout.splitlines()
    assert watermarks(bootstrap, topic, 0) == (5, 12)
    assert watermarks(bootstrap, topic, 1) == (0, 3)
    described = odradek(
        "log-dirs", "--bootstrap-server", bootstrap, "--describe", "--topic-list", topic
    )
    assert described.returncode == 0, described.stderr
    lines = described.stdout.splitlines()
    assert lines[0] == "Querying brokers for log directories information"
    document: dict[str, Any] = json.loads(lines[2])
    assert sorted(b["broker"] for b in document["brokers"]) == sorted(cluster3.broker_ids)
    for entry in document["brokers"]:
        (log_dir,) = entry["logDirs"]
        assert log_dir["error"] is None
        for partition in log_dir["partitions"]:
            name = partition["partition"]
            on_disk = sum(f.stat().st_size for f in Path(log_dir["logDir"], name).glob("*.log"))
            assert partition["size"] == on_disk and partition["offsetLag"] == 0
        assert sorted(p["partition"] for p in log_dir["partitions"]) == [f"{topic}-0", f"{topic}-1"]
    bad = odradek("log-dirs", "--bootstrap-server", bootstrap, "--describe", "--broker-list", "99")
    assert bad.returncode == 1 and bad.stderr.startswith("odradek: error: ")
