"""`odradek console`: the web console (`odradek.console`), a process of its own.

  odradek console --bootstrap-server H:P --zookeeper H:P [--port 8080] [--host 127.0.0.1]
                  [--metrics ID=http://H:P/metrics ...] [--command-config FILE]
  odradek console --cluster-dir DIR [--port 8080]     (a cluster of `odradek cluster up`)

`--cluster-dir` reads the local cluster's cluster.json for the bootstrap servers, the ZooKeeper
address and each broker's metrics endpoint; flags given as well win. Without metrics endpoints the
console shows everything but throughput and per-replica log end offsets and sizes.
`--command-config` (Kafka's client properties) secures both of its Kafka clients: confluent-kafka's
(translated to librdkafka's names) and the project's own (the ACL and transactions pages). It prints its
URL once it listens, and runs until SIGINT or SIGTERM. A mistake an operator can fix (a missing
flag, a bad --metrics item, an unreachable ZooKeeper, a port in use) is one `odradek: error:`
line and exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
from pathlib import Path
from typing import Any

from odradek.errors import OdradekError, OperatorError

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "console",
        help="the web console: overview, topics, consumer groups, records, operator actions",
        description="Serve the web console for a cluster.",
    )
    parser.add_argument("--bootstrap-server", metavar="HOST:PORT[,HOST:PORT]")
    parser.add_argument("--zookeeper", metavar="HOST:PORT[/chroot]")
    parser.add_argument("--port", type=int, default=8080, help="HTTP port (default 8080)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--metrics",
        action="append",
        metavar="ID=URL",
        help="a broker's Prometheus endpoint, e.g. 1=http://127.0.0.1:9404/metrics (repeat)",
    )
    parser.add_argument(
        "--cluster-dir", metavar="DIR", help="take the addresses from DIR/cluster.json"
    )
    parser.add_argument(
        "--command-config",
        metavar="FILE",
        help="client properties (security.protocol, ssl.*, sasl.*) for the Kafka connections",
    )
    parser.add_argument(
        "--refresh", type=float, default=2.0, help="seconds between live updates (default 2)"
    )
    parser.add_argument(
        "--metrics-interval",
        type=float,
        default=5.0,
        help="least seconds between two scrapes of a broker's metrics while pages are viewed"
        " (default 5)",
    )
    parser.set_defaults(func=cmd_console)


def parse_metrics(items: list[str] | None) -> dict[int, str]:
    endpoints: dict[int, str] = {}
    for item in items or []:
        broker, eq, url = item.partition("=")
        if not eq or not broker.strip().isdigit() or not url.startswith("http://"):
            raise OperatorError(f"--metrics must be ID=http://HOST:PORT/metrics, not {item!r}")
        endpoints[int(broker)] = url.strip()
    return endpoints


def settings_from(args: argparse.Namespace) -> Any:
    from odradek.cli.client_config import load_command_config
    from odradek.cli.client_tools import client_config
    from odradek.console.app import ConsoleSettings

    bootstrap, zookeeper, metrics = args.bootstrap_server, args.zookeeper, {}
    if args.cluster_dir:
        from odradek.testing import LocalCluster

        cluster = LocalCluster.load(Path(args.cluster_dir))
        bootstrap = bootstrap or cluster.bootstrap_servers
        zookeeper = zookeeper or cluster.zookeeper_connect
        metrics = {b.id: b.metrics for b in cluster.brokers if b.metrics}
    metrics.update(parse_metrics(args.metrics))
    if not bootstrap:
        raise OperatorError("--bootstrap-server is required (or --cluster-dir)")
    if not zookeeper:
        raise OperatorError("--zookeeper is required (or --cluster-dir)")
    if not 0 <= args.port <= 65535:
        raise OperatorError(f"--port must be 0-65535, not {args.port}")
    if args.refresh <= 0 or args.metrics_interval <= 0:
        raise OperatorError("--refresh and --metrics-interval must be above 0")
    config = client_config(bootstrap, config_file=args.command_config)
    config.pop("bootstrap.servers", None)
    try:  # the same file for the ACL and transactions pages' own clients (odradek.admin)
        security = load_command_config(args.command_config)
    except OdradekError as e:
        raise OperatorError(f"--command-config {args.command_config}: {e}") from None
    return ConsoleSettings(
        bootstrap_servers=bootstrap,
        zookeeper=zookeeper,
        metrics=metrics,
        client_config=config,
        security=security,
        host=args.host,
        port=args.port,
        refresh_s=args.refresh,
        metrics_interval_s=args.metrics_interval,
    )


def _check_port(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            raise OperatorError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


async def _check_zookeeper(connect: str) -> None:
    """Fail in one line before serving when ZooKeeper cannot be reached (the app's own session
    starts on uvicorn's loop, where a failure would be a traceback)."""
    from odradek.zk.client import ZkClient

    zk = ZkClient(connect, session_timeout_s=10.0)
    await zk.start(timeout=10.0)
    await zk.close()


def cmd_console(args: argparse.Namespace) -> int:
    from odradek.cli.logs import configure_logging

    try:
        from odradek.console.app import serve
    except ImportError as e:  # pragma: no cover - the console's dependencies are the package's
        print(f"odradek: error: the console needs {e.name} (pip install odradek)", file=sys.stderr)
        return 1
    configure_logging("WARNING", None, 0, 0)
    try:
        settings = settings_from(args)
        _check_port(settings.host, settings.port)
        asyncio.run(_check_zookeeper(settings.zookeeper))
        print(f"odradek console on http://{settings.host}:{settings.port}/", flush=True)
        return serve(settings)
    except OperatorError as e:
        print(f"odradek: error: {e}", file=sys.stderr)
        return 1
