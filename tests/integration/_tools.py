"""Helpers of the tools' integration tests: run `odradek <tool>` as an operator would (a separate
process, bounded), and read a topic back with confluent-kafka to compare."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

TOOL_TIMEOUT_S = 120.0


def odradek(*args: str, stdin: str | bytes | None = None) -> subprocess.CompletedProcess[str]:
    """`odradek ARGS`, text in and out; killed after TOOL_TIMEOUT_S."""
    data = stdin.decode() if isinstance(stdin, bytes) else stdin
    return subprocess.run(
        [sys.executable, "-m", "odradek.cli.main", *args],
        input=data,
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT_S,
    )


def odradek_in_process(capsys: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """`odradek ARGS` run by `odradek.cli.main.main` in this process (no interpreter start-up:
    seconds each on a loaded machine), with its exit status and output as a process's."""
    from odradek.cli.main import main

    capsys.readouterr()
    try:
        status = main(list(args))
    except SystemExit as e:  # argparse: --help, usage mistakes
        status = int(e.code or 0)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), status, out, err)


def assert_one_line_error(result: subprocess.CompletedProcess[str], fragment: str) -> None:
    """Exit status 1, and standard error is one `odradek: error:` line containing `fragment`
    (no traceback)."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("odradek: error: "), result.stderr
    assert fragment in lines[0], lines[0]


def read_partition(
    bootstrap: str, topic: str, partition: int, count: int, timeout: float = 60.0
) -> list[Any]:
    """The first `count` records of a partition, as confluent-kafka's consumer sees them."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "tools-reader", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, partition, 0)])
    records: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(records) < count:
            assert time.monotonic() < deadline, f"only {len(records)} of {count} records"
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                records.append(message)
    finally:
        consumer.close()
    return records


def list_offsets(bootstrap: str, topic: str, partitions: int, spec: Any) -> dict[int, int]:
    """ListOffsets through confluent-kafka's admin client."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.list_offsets(
        {TopicPartition(topic, p): spec for p in range(partitions)}, request_timeout=30
    )
    return {tp.partition: f.result().offset for tp, f in futures.items()}


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    return list_offsets(bootstrap, topic, partitions, OffsetSpec.latest())
