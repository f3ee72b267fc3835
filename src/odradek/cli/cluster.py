"""`odradek cluster`: a local cluster for development, demos and fault drills.

  odradek cluster up --brokers N --dir DIR [--base-port P] [--override k=v ...] [--spark-workers N]
  odradek cluster status --dir DIR [--json]
  odradek cluster down --dir DIR
  odradek cluster kill|stop|cont|terminate|restart BROKER_ID --dir DIR

`up` starts a private ZooKeeper and N brokers in the background, prints the bootstrap string on
stdout and returns; the processes keep running (see `odradek.testing.local_cluster` for the directory
layout and cluster.json). The per-broker commands are fault drills: `kill` is SIGKILL (a crash),
`stop` and `cont` are SIGSTOP and SIGCONT (a frozen process: a GC pause, a hung disk),
`terminate` is SIGTERM (the broker's controlled shutdown), and `restart` is a controlled shutdown
followed by a start with the same config and ports. `status` reads ZooKeeper directly, so it
works whatever state the brokers are in.

`up --spark-workers N` also starts a Spark standalone master and N workers beside the brokers
(`odradek.testing.spark_standalone`) and prints the master's URL on stderr; `status` shows them
and `down` stops them first, executors included.

Operator mistakes (a directory with a running cluster, a port in use, no java, an unknown broker
id) print one `odradek: error: ...` line and exit 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from odradek.errors import OperatorError
from odradek.testing import LocalCluster
from odradek.testing.spark_standalone import (
    SparkStandalone,
    check_worker_settings,
    set_cluster_record,
)

# Lists of partitions in the human-readable status stop here; --json has them all.
MAX_LISTED_PARTITIONS = 50


def _fail(message: str) -> int:
    print(f"odradek: error: {message}", file=sys.stderr)
    return 1


def _quiet_kazoo() -> None:
    # kazoo logs connection retries as warnings; a one-shot command reports failures itself.
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)


def _parse_overrides(items: list[str] | None) -> dict[str, str]:
    overrides = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise OperatorError(f"invalid --override {item!r}: expected key=value")
        overrides[key.strip()] = value.strip()
    return overrides


# ---------------------------------------------------------------------------------------------
# status as a table


def _yes_no(value: bool | None) -> str:
    return "?" if value is None else ("yes" if value else "no")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]


def _partition_list(title: str, partitions: list[dict[str, Any]]) -> list[str]:
    if not partitions:
        return []
    lines = [f"{title} ({len(partitions)}):"]
    for p in partitions[:MAX_LISTED_PARTITIONS]:
        leader = p["leader"] if p["leader"] >= 0 else "none"
        replicas = ",".join(map(str, p["replicas"]))
        isr = ",".join(map(str, p["isr"]))
        lines.append(
            f"  {p['topic']}-{p['partition']}  leader {leader}  replicas {replicas}  isr {isr}"
        )
    if len(partitions) > MAX_LISTED_PARTITIONS:
        lines.append(f"  ... and {len(partitions) - MAX_LISTED_PARTITIONS} more (see --json)")
    return lines


def format_status(status: dict[str, Any]) -> str:
    """The human-readable `cluster status`: ZooKeeper, controller, brokers, partition health."""
    zk = status["zookeeper"]
    if zk.get("external"):
        zk_state = "external"
    else:
        zk_state = f"pid {zk['pid']}" if zk.get("process_alive") else "not running"
    reachable = "reachable" if zk.get("reachable") else "UNREACHABLE"
    lines = [f"ZooKeeper   {zk['connect']} ({zk_state}, {reachable})"]
    controller = status.get("controller")
    if controller:
        lines.append(f"Controller  broker {controller['id']} (epoch {controller['epoch']})")
    else:
        lines.append("Controller  none")
    lines.append(f"Bootstrap   {status['bootstrap']}")
    lines.append("")
    rows = [
        [
            str(b["id"]),
            _yes_no(b["registered"]),
            b["process"] or "-",
            str(b["pid"]) if b["pid"] else "-",
            b["endpoint"] or "-",
        ]
        for b in status["brokers"]
    ]
    lines += _table(["BROKER", "REGISTERED", "PROCESS", "PID", "ENDPOINT"], rows)
    lines.append("")
    topics = status["topics"]
    totals = status["totals"]
    rows = [
        [
            name + (" (deleting)" if t.get("marked_for_deletion") else ""),
            str(t["partitions"]),
            str(t["online"]),
            str(t["offline"]),
            str(t["under_replicated"]),
        ]
        for name, t in sorted(topics.items())
    ]
    rows.append(
        [
            f"total ({len(topics)} topics)",
            str(totals["partitions"]),
            str(totals["online"]),
            str(totals["offline"]),
            str(totals["under_replicated"]),
        ]
    )
    lines += _table(["TOPIC", "PARTITIONS", "ONLINE", "OFFLINE", "UNDER-REPLICATED"], rows)
    if status.get("spark"):
        lines += ["", *format_spark_status(status["spark"])]
    offline = [p for t in topics.values() for p in t["offline_partitions"]]
    under = [p for t in topics.values() for p in t["under_replicated_partitions"]]
    for title, partitions in (
        ("Offline partitions", offline),
        ("Under-replicated partitions", under),
    ):
        listed = _partition_list(title, partitions)
        if listed:
            lines += ["", *listed]
    return "\n".join(lines)


def _cores(count: int) -> str:
    return f"{count} core" if count == 1 else f"{count} cores"


def format_spark_status(spark: dict[str, Any]) -> list[str]:
    """The Spark standalone cluster's lines of `cluster status`."""
    master = spark["master"]
    if master["process"] == "running":
        state = f"pid {master['pid']}" + ("" if master["answering"] else ", NOT ANSWERING")
    else:
        state = "not running"
    lines = [f"Spark       {spark['master_url']} ({state}), web UI {spark['web_ui']}"]
    if spark["alive_workers"] is not None:
        apps = ", ".join(spark["applications"]) or "none"
        lines.append(f"            {spark['alive_workers']} workers alive; applications: {apps}")
    rows = [
        [
            str(w["id"]),
            w["process"],
            str(w["pid"]) if w["pid"] else "-",
            w["state"] or "-",
            f"{_cores(w['cores'])}, {w['memory']}",
            ",".join(map(str, w["executors"])) or "-",
            f"http://127.0.0.1:{w['web_ui_port']}",
        ]
        for w in spark["workers"]
    ]
    header = ["WORKER", "PROCESS", "PID", "STATE", "OFFERS", "EXECUTOR PIDS", "WEB UI"]
    return [*lines, "", *_table(header, rows)]


# ---------------------------------------------------------------------------------------------
# commands


def cmd_up(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    spark = SparkStandalone.load(directory) if (directory / "cluster.json").exists() else None
    if spark is not None and spark.running():
        raise OperatorError(
            f"a Spark cluster is already running in {directory}: "
            f"run 'odradek cluster down --dir {directory}' first"
        )
    if args.spark_workers != 0:  # refused before anything starts
        check_worker_settings(args.spark_workers, args.spark_worker_cores, args.spark_worker_memory)
    if args.secure:
        return _up_secure(args)
    cluster = LocalCluster.up(
        Path(args.dir),
        args.brokers,
        base_port=args.base_port,
        overrides=_parse_overrides(args.override),
        timeout=args.timeout,
        zookeeper=args.zookeeper,
        zookeepers=args.zookeepers,
    )
    _start_spark(cluster, args)
    print(cluster.bootstrap_servers)
    return 0


def _start_spark(cluster: LocalCluster, args: argparse.Namespace) -> None:
    """The Spark standalone cluster of `--spark-workers` (a stale record of an earlier one is
    dropped without it); on failure the brokers are killed again, as for any failed `up`."""
    if not args.spark_workers:
        set_cluster_record(cluster.directory, None)
        return
    try:
        spark = SparkStandalone.start(
            cluster.directory,
            args.spark_workers,
            cores=args.spark_worker_cores,
            memory=args.spark_worker_memory,
            timeout=args.timeout,
        )
    except BaseException:
        cluster.kill_all()
        raise
    print(
        f"Spark standalone master {spark.master_url} (web UI {spark.master.web_ui}), "
        f"{len(spark.workers)} workers ({_cores(args.spark_worker_cores)}, "
        f"{args.spark_worker_memory} each); their Python: {spark.python}",
        file=sys.stderr,
    )


def _up_secure(args: argparse.Namespace) -> int:
    from odradek.testing.secure import ADMIN, CLIENT, start_secure_cluster

    if args.zookeeper:
        raise OperatorError("--secure starts its own ZooKeeper: drop --zookeeper")
    if args.zookeepers != 1:
        raise OperatorError("--secure starts a single ZooKeeper server: drop --zookeepers")
    cluster, setup = start_secure_cluster(
        Path(args.dir),
        args.brokers,
        overrides=_parse_overrides(args.override),
        timeout=args.timeout,
        base_port=args.base_port,
    )
    _start_spark(cluster, args)
    client = setup.client_properties_file(CLIENT)
    admin = setup.client_properties_file(ADMIN)
    print(cluster.bootstrap_servers)
    print(
        f"\nSASL_SSL with SCRAM-SHA-512 on {cluster.bootstrap_servers} (brokers talk to each other"
        " on their INTERNAL SASL_SSL listener; no PLAINTEXT listener).\n"
        f"Client settings for user '{CLIENT}' (allowed everything on every topic and group), "
        f"written to {client}:\n",
        file=sys.stderr,
    )
    for key, value in setup.client_properties(CLIENT).items():
        print(f"  {key}={value}", file=sys.stderr)
    print(
        f"\nThe super user '{ADMIN}' (ACLs, SCRAM users): {admin}\n"
        f"  odradek acls --bootstrap-server {cluster.brokers[0].bootstrap} "
        f"--command-config {admin} --list\n"
        f"  kcat -b {cluster.brokers[0].bootstrap} -F "
        f"{setup.librdkafka_properties_file(CLIENT)} -L   (librdkafka's key names)",
        file=sys.stderr,
    )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    status = LocalCluster.load(Path(args.dir)).status()
    spark = SparkStandalone.load(Path(args.dir))
    if spark is not None:
        status["spark"] = spark.status()
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    cluster = LocalCluster.load(Path(args.dir))
    spark = SparkStandalone.load(Path(args.dir))
    if spark is not None:  # first: its executors may be running a job against the brokers
        spark.stop(timeout=args.timeout)
    cluster.down(timeout=args.timeout)
    return 0


def _broker_command(action: Callable[[LocalCluster, argparse.Namespace], str | None]) -> Any:
    def run(args: argparse.Namespace) -> int:
        cluster = LocalCluster.load(Path(args.dir))
        cluster.broker(args.broker_id)  # an unknown id is an error for every action
        note = action(cluster, args)
        if note:
            print(note, file=sys.stderr)
        return 0

    return run


def _kill(cluster: LocalCluster, args: argparse.Namespace) -> str | None:
    return None if cluster.kill(args.broker_id) else f"broker {args.broker_id} was not running"


def _stop(cluster: LocalCluster, args: argparse.Namespace) -> str | None:
    cluster.stop(args.broker_id)
    return None


def _cont(cluster: LocalCluster, args: argparse.Namespace) -> str | None:
    cluster.cont(args.broker_id)
    return None


def _terminate(cluster: LocalCluster, args: argparse.Namespace) -> str | None:
    if not cluster.is_alive(args.broker_id):
        return f"broker {args.broker_id} was not running"
    if not cluster.terminate(args.broker_id, args.timeout):
        return f"broker {args.broker_id} did not shut down within {args.timeout:g}s: killed"
    return None


def _restart(cluster: LocalCluster, args: argparse.Namespace) -> str | None:
    cluster.restart(args.broker_id, args.timeout)
    return None


_BROKER_ACTIONS: dict[str, tuple[Callable[[LocalCluster, argparse.Namespace], str | None], str]] = {
    "kill": (_kill, "SIGKILL one broker (a crash) and wait until it is gone"),
    "stop": (_stop, "SIGSTOP one broker (freeze it)"),
    "cont": (_cont, "SIGCONT one broker stopped by 'stop'"),
    "terminate": (_terminate, "SIGTERM one broker: controlled shutdown, SIGKILL after --timeout"),
    "restart": (_restart, "controlled shutdown of one broker, then start it again"),
}


def _guarded(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        _quiet_kazoo()
        try:
            return command(args)
        except OperatorError as e:
            return _fail(str(e))

    return run


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "cluster",
        help="a local cluster: up, status, down, and broker fault drills",
        description="A local ZooKeeper and brokers as background processes.",
    )
    commands = parser.add_subparsers(dest="cluster_command", required=True, metavar="COMMAND")

    up = commands.add_parser("up", help="start ZooKeeper and N brokers in the background")
    up.add_argument("--brokers", type=int, default=3, help="number of brokers (default 3)")
    up.add_argument(
        "--zookeepers",
        type=int,
        default=1,
        help="members of the private ZooKeeper ensemble (default 1: a standalone server)",
    )
    up.add_argument("--dir", required=True, help="the cluster directory")
    up.add_argument(
        "--base-port", type=int, help="ZooKeeper on this port, broker i on base+i (default: free)"
    )
    up.add_argument(
        "--override", action="append", metavar="K=V", help="a broker property for every broker"
    )
    up.add_argument("--zookeeper", metavar="CONNECT", help="use this ZooKeeper instead of our own")
    up.add_argument(
        "--secure",
        action="store_true",
        help="TLS certificates, SCRAM users, SASL_SSL listeners only, and ACLs",
    )
    up.add_argument(
        "--spark-workers",
        type=int,
        default=0,
        metavar="N",
        help="also start a Spark standalone master and N workers (default 0: no Spark)",
    )
    up.add_argument(
        "--spark-worker-cores",
        type=int,
        default=1,
        help="cores each Spark worker offers (default 1)",
    )
    up.add_argument(
        "--spark-worker-memory",
        default="1g",
        help="memory each Spark worker offers its executors (default 1g, one default executor)",
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds to wait for the brokers, and for Spark (default 60)",
    )
    up.set_defaults(func=_guarded(cmd_up))

    status = commands.add_parser("status", help="brokers, controller and partition health")
    status.add_argument("--dir", required=True)
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.set_defaults(func=_guarded(cmd_status))

    down = commands.add_parser(
        "down", help="stop Spark (if started), every broker (controlled) and ZooKeeper"
    )
    down.add_argument("--dir", required=True)
    down.add_argument(
        "--timeout", type=float, default=60.0, help="seconds before stragglers are killed"
    )
    down.set_defaults(func=_guarded(cmd_down))

    for name, (action, help_text) in _BROKER_ACTIONS.items():
        command = commands.add_parser(name, help=help_text)
        command.add_argument("broker_id", type=int, metavar="BROKER_ID")
        command.add_argument("--dir", required=True)
        if name in ("terminate", "restart"):
            command.add_argument(
                "--timeout", type=float, default=60.0, help="seconds to wait (default 60)"
            )
        command.set_defaults(func=_guarded(_broker_command(action)))
    return parser
