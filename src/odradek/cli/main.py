"""The `odradek` command.

  odradek server server.properties [--override k=v ...]   run a broker
  odradek zookeeper --port P --dir D                       run a private standalone ZooKeeper
  odradek cluster up|down|status|kill|stop|cont|restart    a local cluster for development and tests
  odradek topics --bootstrap-server H:P --create|--list|--describe|--delete
  odradek reassign-partitions --bootstrap-server H:P (--reassignment-json-file F
                              (--execute|--verify|--cancel) | --list)
  odradek leader-election --bootstrap-server H:P --election-type preferred|unclean
                          (--topic T --partition P | --all-topic-partitions | --path-to-json-file F)
  odradek consumer-groups --bootstrap-server H:P --list|--describe|--reset-offsets|--delete|
                          --delete-offsets ...
  odradek delete-records --bootstrap-server H:P --offset-json-file F
  odradek log-dirs --bootstrap-server H:P --describe [--topic-list T,..] [--broker-list 1,..]
  odradek acls --bootstrap-server H:P --add|--remove|--list ...   (like kafka-acls.sh)
  odradek configs --bootstrap-server H:P --entity-type topics|brokers|users|clients ...
                                                                   (like kafka-configs.sh)
  odradek console-producer / console-consumer --bootstrap-server H:P --topic T ...
  odradek producer-perf-test / consumer-perf-test ...    (Kafka's flags and output lines)
  odradek get-offsets --bootstrap-server H:P [--topic T] [--time -1|-2|-3|MS]
  odradek dump-log --files F1,F2 [--print-data-log] ...  (offline: segments, indexes, snapshots)
  odradek verifiable-producer / verifiable-consumer ...  (JSON events, as Kafka's system tests)
  odradek console --bootstrap-server H:P --zookeeper H:P --port N   the web console

Every tool that talks to brokers takes --command-config FILE (Kafka client security properties).

Operator mistakes (bad config or arguments, unreachable ZooKeeper or brokers, port in use) print one
line and exit 1; only a bug prints a traceback.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # before kio is imported: see odradek.cli.entry
    from odradek.cli.entry import without_test_strategies

    without_test_strategies()

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import NoReturn

from odradek.cli.logs import configure_logging
from odradek.errors import OperatorError

log = logging.getLogger("odradek")


def _fail(message: str) -> int:
    print(f"odradek: error: {message}", file=sys.stderr)
    return 1


def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but not on every platform
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def _run_broker(config: object) -> int:
    from odradek.server.broker import Broker

    broker = Broker(config, own_process=True)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await broker.startup()
    except OperatorError:
        try:
            await broker.shutdown()
        except Exception as e:  # the start-up error is the one to report
            log.warning("cleaning up after the failed start-up: %s", e)
        raise
    print(f"odradek broker {broker.broker_id} started", file=sys.stderr, flush=True)
    await stop.wait()
    await broker.shutdown()
    return 0


def cmd_server(args: argparse.Namespace) -> int:
    from odradek.server.config import load_config

    try:
        config = load_config(Path(args.config) if args.config else None, args.override or [])
    except OperatorError as e:
        return _fail(str(e))
    configure_logging(
        args.log_level,
        Path(args.log_file) if args.log_file else None,
        config["broker.log.max.bytes"],
        config["broker.log.backup.count"],
    )
    if args.state_change_log:
        from odradek.controller.states import attach_state_change_log_file

        attach_state_change_log_file(Path(args.state_change_log))
    from odradek.log.fd_limit import raise_soft_limit

    raise_soft_limit()  # a broker needs about one descriptor per partition (fd_limit)
    from odradek.server.malloc_tuning import keep_freed_memory

    keep_freed_memory()  # large buffers freed are kept for the next ones (malloc_tuning)
    _install_uvloop()
    try:
        return asyncio.run(_run_broker(config))
    except OperatorError as e:
        return _fail(str(e))


def cmd_zookeeper(args: argparse.Namespace) -> int:
    from odradek.zk.server import run_foreground

    try:
        return run_foreground(args.port, Path(args.dir))
    except OperatorError as e:
        return _fail(str(e))


class _ArgumentParser(argparse.ArgumentParser):
    """Usage mistakes exit with status 1, as Kafka's tools do (argparse's own is 2), so a script
    sees one status for every operator error. Subcommand parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="odradek", description="Kafka's replicated log, in Python")
    sub = parser.add_subparsers(dest="command", required=True)

    server = sub.add_parser("server", help="run a broker")
    server.add_argument("config", nargs="?", help="server.properties")
    server.add_argument("--override", action="append", metavar="K=V", help="override a property")
    server.add_argument("--log-level", default=os.environ.get("ODRADEK_LOG_LEVEL", "INFO"))
    server.add_argument("--state-change-log", metavar="DIR", help="write state-change.log in DIR")
    server.add_argument(
        "--log-file",
        metavar="FILE",
        help="log to FILE, rotated by size (broker.log.max.bytes, broker.log.backup.count)"
        " instead of to standard error",
    )
    server.set_defaults(func=cmd_server)

    zookeeper = sub.add_parser("zookeeper", help="run a private standalone ZooKeeper")
    zookeeper.add_argument("--port", type=int, default=2181)
    zookeeper.add_argument("--dir", required=True)
    zookeeper.set_defaults(func=cmd_zookeeper)

    # Every subcommand's module is imported here, unguarded: one that fails to import is a bug
    # to report with its traceback, not a command to leave out of --help silently.
    from odradek.cli import acls as acls_cli
    from odradek.cli import cluster as cluster_cli
    from odradek.cli import configs as configs_cli
    from odradek.cli import console as console_cli
    from odradek.cli import console_consumer as console_consumer_cli
    from odradek.cli import console_producer as console_producer_cli
    from odradek.cli import consumer_groups as consumer_groups_cli
    from odradek.cli import dump_log as dump_log_cli
    from odradek.cli import get_offsets as get_offsets_cli
    from odradek.cli import leader_election as leader_election_cli
    from odradek.cli import log_admin as log_admin_cli
    from odradek.cli import perf_test as perf_test_cli
    from odradek.cli import reassign as reassign_cli
    from odradek.cli import topics as topics_cli
    from odradek.cli import transactions as transactions_cli
    from odradek.cli import verifiable as verifiable_cli

    cluster_cli.add_parser(sub)
    topics_cli.add_parser(sub)
    reassign_cli.add_parser(sub)
    leader_election_cli.add_parser(sub)
    consumer_groups_cli.add_parser(sub)
    log_admin_cli.add_parsers(sub)
    acls_cli.add_parser(sub)
    configs_cli.add_parser(sub)
    transactions_cli.add_parser(sub)
    console_producer_cli.add_parser(sub)
    console_consumer_cli.add_parser(sub)
    get_offsets_cli.add_parser(sub)
    perf_test_cli.add_parsers(sub)
    verifiable_cli.add_parsers(sub)
    dump_log_cli.add_parser(sub)
    console_cli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
