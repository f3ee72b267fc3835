"""An operator's mistake gets one line and a non-zero exit, never a traceback or a hang.

`odradek server` is run as an operator runs it, in a subprocess with a properties file, and each
mistake must end the process within a deadline with exactly one line starting
"odradek: error:" on stderr (the broker's own log lines may precede it; it is the last line) and
no "Traceback" anywhere. Mistakes caught before connecting anywhere (bad values, unknown listener
protocols, a missing file) need no ZooKeeper; those found later (a port in use, a log directory
that belongs to another broker) use a chroot of the session's ZooKeeper, and must leave no
broker registration behind.

The `odradek cluster` and `odradek topics` cases here complement
tests/integration/test_cluster_cli.py, which covers their argument parsing: these are the
mistakes only a running system can reveal (an unreachable external ZooKeeper, a topic that
already exists or does not, a config the broker refuses).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from odradek.cli.main import main
from odradek.testing import LocalCluster
from tests.fixtures.zookeeper import free_port
from tests.integration._clients import create_topic, unique_topic

EXIT_DEADLINE_S = 30.0
ERROR_PREFIX = "odradek: error:"


def odradek(
    *argv: str, timeout: float = EXIT_DEADLINE_S
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the `odradek` command line; the finished process and how long it took."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "odradek.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return result, time.monotonic() - started


def assert_one_line_error(result: subprocess.CompletedProcess[str], fragment: str) -> str:
    """Exit code 1, exactly one "odradek: error:" line, last on stderr, naming `fragment`."""
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    assert result.returncode == 1, output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(ERROR_PREFIX)]
    assert len(errors) == 1, output
    assert lines[-1] == errors[0], output
    assert fragment.lower() in errors[0].lower(), output
    return errors[0]


def server_properties(directory: Path, **properties: str | None) -> Path:
    """A server.properties with sane defaults for what the test does not set (None: omit)."""
    values: dict[str, str | None] = {
        "broker.id": "7",
        "listeners": f"PLAINTEXT://127.0.0.1:{free_port()}",
        "log.dirs": str(directory / "data"),
        "zookeeper.connect": "127.0.0.1:1",
        "zookeeper.connection.timeout.ms": "2000",
    }
    values.update({key.replace("_", "."): value for key, value in properties.items()})
    path = directory / "server.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items() if v is not None))
    return path


# ---------------------------------------------------------------------------------------------
# Configuration mistakes: found before connecting anywhere


@pytest.mark.parametrize(
    ("properties", "fragment"),
    [
        ({"broker.id": "abc"}, "broker.id"),
        ({"broker.id": None}, "broker.id"),
        ({"broker.id": "-5"}, "broker.id"),
        ({"listeners": "FOO://127.0.0.1:9092"}, "FOO://127.0.0.1:9092"),
        # An SSL listener alone leaves no PLAINTEXT listener for the inter-broker default.
        ({"listeners": "SSL://127.0.0.1:9093"}, "inter-broker listener PLAINTEXT"),
        ({"listeners": "PLAINTEXT://127.0.0.1:99999"}, "port out of range"),
        ({"listeners": "127.0.0.1:9092"}, "listeners"),
        ({"zookeeper.connect": None}, "zookeeper.connect"),
        ({"num.partitions": "0"}, "num.partitions"),
        ({"log.segment.bytes": "a lot"}, "log.segment.bytes"),
        ({"unclean.leader.election.enable": "maybe"}, "unclean.leader.election.enable"),
        ({"message.max.bytes": "200000000"}, "message.max.bytes"),
    ],
    ids=lambda value: str(value) if isinstance(value, str) else "-".join(value),
)
def test_bad_config_value(tmp_path: Path, properties: dict[str, str | None], fragment: str):
    config = server_properties(tmp_path, **{k.replace(".", "_"): v for k, v in properties.items()})
    result, elapsed = odradek("server", str(config))
    assert elapsed < EXIT_DEADLINE_S
    assert_one_line_error(result, fragment)


def test_properties_file_that_does_not_exist(tmp_path: Path):
    result, _ = odradek("server", str(tmp_path / "nowhere.properties"))
    assert_one_line_error(result, "nowhere.properties")


def test_override_without_a_value(tmp_path: Path):
    result, _ = odradek("server", str(server_properties(tmp_path)), "--override", "num.partitions")
    assert_one_line_error(result, "invalid override")
    result, _ = odradek("server", str(server_properties(tmp_path)), "--override", "broker.id=seven")
    assert_one_line_error(result, "broker.id")


def test_log_dir_that_is_a_file(tmp_path: Path):
    not_a_directory = tmp_path / "a-file"
    not_a_directory.write_text("not a directory")
    config = server_properties(tmp_path, log_dirs=str(not_a_directory))
    result, _ = odradek("server", str(config))
    assert_one_line_error(result, str(not_a_directory))


# ---------------------------------------------------------------------------------------------
# Mistakes found while starting: ZooKeeper, ports, log directories


def test_unreachable_zookeeper(tmp_path: Path):
    closed = free_port()  # nothing listens there
    config = server_properties(
        tmp_path, zookeeper_connect=f"127.0.0.1:{closed}", zookeeper_connection_timeout_ms="2000"
    )
    result, elapsed = odradek("server", str(config))
    assert elapsed < EXIT_DEADLINE_S
    assert_one_line_error(result, f"127.0.0.1:{closed}")


def registered(zk_chroot: str) -> list[str]:
    client = KazooClient(hosts=zk_chroot, timeout=10)
    client.start(timeout=30)
    try:
        return client.get_children("/brokers/ids") if client.exists("/brokers/ids") else []
    finally:
        client.stop()
        client.close()


def test_listener_port_in_use(tmp_path: Path, zk_chroot: str):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = server_properties(
            tmp_path, listeners=f"PLAINTEXT://127.0.0.1:{port}", zookeeper_connect=zk_chroot
        )
        result, elapsed = odradek("server", str(config))
    assert elapsed < EXIT_DEADLINE_S
    assert_one_line_error(result, f"127.0.0.1:{port}")
    assert registered(zk_chroot) == []  # it never got as far as registering


def test_log_dir_of_another_broker(tmp_path: Path, zk_chroot: str):
    data = tmp_path / "data"
    data.mkdir()
    (data / "meta.properties").write_text("version=0\nbroker.id=3\n")
    config = server_properties(tmp_path, log_dirs=str(data), zookeeper_connect=zk_chroot)
    result, elapsed = odradek("server", str(config))
    assert elapsed < EXIT_DEADLINE_S
    assert_one_line_error(result, "broker.id=3")
    assert registered(zk_chroot) == []


def test_log_dir_in_use_by_a_running_broker(tmp_path: Path, make_cluster: Any):
    cluster = make_cluster(1)
    data = Path(cluster.broker(1).data_dir)
    config = server_properties(
        tmp_path, log_dirs=str(data), zookeeper_connect=cluster.zookeeper_connect
    )
    result, elapsed = odradek("server", str(config))
    assert elapsed < EXIT_DEADLINE_S
    assert_one_line_error(result, "in use")
    # A running broker never has the clean-shutdown marker: only a clean exit writes it.
    assert not (data / ".kafka_cleanshutdown").exists()


# ---------------------------------------------------------------------------------------------
# odradek cluster / odradek topics against real processes


def test_cluster_up_with_an_unreachable_external_zookeeper(tmp_path: Path):
    closed = free_port()
    result, elapsed = odradek(
        "cluster",
        "up",
        "--brokers",
        "1",
        "--dir",
        str(tmp_path / "cluster"),
        "--zookeeper",
        f"127.0.0.1:{closed}",
        "--override",
        "zookeeper.connection.timeout.ms=1000",
        "--timeout",
        "10",
        timeout=60,
    )
    assert elapsed < 30
    # Whoever notices first reports it: the launcher's own ZooKeeper session or the broker.
    assert_one_line_error(result, f"127.0.0.1:{closed}")
    # Nothing of it is left running.
    cluster = LocalCluster.load(tmp_path / "cluster")
    assert not cluster.is_alive(1)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--base-port", "65534", "--brokers", "3"], "out of range"),
        (["--override", "no-value"], "invalid --override"),
    ],
    ids=["base-port", "override"],
)
def test_cluster_up_argument_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
):
    code = main(["cluster", "up", "--dir", str(tmp_path / "cluster"), *argv])
    err = capsys.readouterr().err
    assert code == 1
    assert err.strip().startswith(ERROR_PREFIX) and len(err.strip().splitlines()) == 1, err
    assert fragment in err


def topics(capsys: pytest.CaptureFixture[str], bootstrap: str, *argv: str) -> tuple[int, str, str]:
    """Run `odradek topics` in-process: (exit code, stdout, stderr stripped)."""
    code = main(["topics", "--bootstrap-server", bootstrap, "--timeout", "20", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def test_topics_errors_from_a_live_cluster(
    cluster3: LocalCluster, capsys: pytest.CaptureFixture[str]
):
    bootstrap = cluster3.bootstrap_servers
    existing = unique_topic("cli-exists")
    create_topic(bootstrap, existing)
    missing = unique_topic("cli-missing")
    cases: list[tuple[list[str], str]] = [
        (["--create", "--topic", existing], "already exists"),
        (["--create", "--topic", "bad name!"], "illegal"),
        (["--create", "--topic", missing, "--replication-factor", "5"], "replication factor"),
        (["--create", "--topic", missing, "--config", "retention.ms=soon"], "retention.ms"),
        (["--create", "--topic", missing, "--config", "no.such.config=1"], "no.such.config"),
        (["--describe", "--topic", missing], missing),
        (["--delete", "--topic", missing], missing),
    ]
    for argv, fragment in cases:
        code, _, err = topics(capsys, bootstrap, *argv)
        assert code == 1, (argv, err)
        assert err.startswith(ERROR_PREFIX) and len(err.splitlines()) == 1, (argv, err)
        assert fragment in err, (argv, err)
    # The --if-exists / --if-not-exists forms of the same mistakes are not errors.
    assert topics(capsys, bootstrap, "--delete", "--topic", missing, "--if-exists") == (0, "", "")
    assert topics(capsys, bootstrap, "--create", "--topic", existing, "--if-not-exists") == (
        0,
        "",
        "",
    )
    # None of the refused creations happened.
    code, listed, _ = topics(capsys, bootstrap, "--list")
    assert code == 0 and existing in listed.splitlines() and missing not in listed
