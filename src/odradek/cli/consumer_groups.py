"""`odradek consumer-groups`: list, describe, reset and delete consumer groups, like Kafka's
`kafka-consumer-groups.sh`.

  odradek consumer-groups --bootstrap-server H:P --list [--state [STATE,...]]
  odradek consumer-groups --bootstrap-server H:P --describe (--group G ... | --all-groups)
                          [--offsets | --members [--verbose] | --state]
  odradek consumer-groups --bootstrap-server H:P --reset-offsets (--group G ... | --all-groups)
                          (--topic T[:P,P...] ... | --all-topics)
                          (--to-earliest | --to-latest | --to-current | --to-offset N |
                           --shift-by N | --to-datetime YYYY-MM-DDTHH:mm:SS[.sss][±hh:mm] |
                           --by-duration PnDTnHnMnS)  [--dry-run | --execute]
  odradek consumer-groups --bootstrap-server H:P --delete (--group G ... | --all-groups)
  odradek consumer-groups --bootstrap-server H:P --delete-offsets --group G --topic T[:P,...]

Output is Kafka's: `--describe` prints, per group, a blank line and a table (`GROUP TOPIC
PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID`; `-` where there is no
value: a partition with a committed offset that no member is assigned, or an assigned one never
committed); `--members` lists `GROUP CONSUMER-ID GROUP-INSTANCE-ID HOST CLIENT-ID #PARTITIONS`
(and the `ASSIGNMENT` with `--verbose`); `--state` shows `GROUP COORDINATOR (ID)
ASSIGNMENT-STRATEGY STATE #MEMBERS`. LOG-END-OFFSET is the partition's high watermark and LAG
the difference, as Kafka computes them. A group with no members is reported on standard error
("Consumer group 'g' has no active members.") and still described.

`--reset-offsets` needs the group inactive (Empty, or not existing yet) and prints the plan
(`GROUP TOPIC PARTITION NEW-OFFSET`); it commits only with `--execute` (without it, or with
`--dry-run`, nothing changes). Offsets asked for outside [log start, log end] are clamped to them;
`--to-datetime`/`--by-duration` take the first offset at or after the time, or the log end.

Exit status: 0 when everything asked for was done; 1, with one line `odradek: error: ...` on
standard error, for a mistake in the arguments, a group that does not exist (`--describe`,
`--delete-offsets`), a group that cannot be reset or deleted, or any error a broker answered.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from odradek.admin.groups import EARLIEST, LATEST, GroupAdminClient, GroupDescription
from odradek.cli.topics import KafkaResponseError, parse_bootstrap
from odradek.errors import OperatorError

TopicPartition = tuple[str, int]
MISSING = "-"
RESET_SPECS = (
    "to_earliest",
    "to_latest",
    "to_current",
    "to_offset",
    "shift_by",
    "to_datetime",
    "by_duration",
)
_DURATION = re.compile(
    r"P(?:(?P<days>\d+)D)?(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?"
)


class Failure(OperatorError):
    """The command ran but something it was asked for failed (exit status 1)."""


@dataclass
class Output:
    out: list[str]
    err: list[str]


def parse_topic_partitions(specs: Sequence[str]) -> list[tuple[str, list[int] | None]]:
    """`T` (every partition) or `T:0,1` -> [(topic, partitions or None)]."""
    parsed: list[tuple[str, list[int] | None]] = []
    for spec in specs:
        topic, _, partitions = spec.partition(":")
        if not topic:
            raise OperatorError(f"invalid --topic {spec!r}: expected TOPIC or TOPIC:P,P")
        if not partitions:
            parsed.append((topic, None))
            continue
        try:
            parsed.append((topic, [int(p) for p in partitions.split(",")]))
        except ValueError:
            raise OperatorError(f"invalid --topic {spec!r}: partitions must be numbers") from None
    return parsed


def parse_datetime(text: str) -> int:
    """Kafka's --to-datetime: `YYYY-MM-DDTHH:mm:SS[.sss]` in local time, or with a zone."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise OperatorError(
            f"invalid --to-datetime {text!r}: expected YYYY-MM-DDTHH:mm:SS.sss (with an optional "
            "zone such as Z or +01:00)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()
    return int(moment.timestamp() * 1000)


def parse_duration(text: str) -> int:
    """Kafka's --by-duration (ISO-8601 `PnDTnHnMnS`) in milliseconds."""
    match = _DURATION.fullmatch(text)
    if not match or text in ("P", "PT") or text.endswith("T"):
        raise OperatorError(f"invalid --by-duration {text!r}: expected PnDTnHnMnS, e.g. PT30M")
    days, hours, minutes = (int(match.group(k) or 0) for k in ("days", "hours", "minutes"))
    seconds = float(match.group("seconds") or 0)
    return int(((days * 24 + hours) * 60 + minutes) * 60_000 + seconds * 1000)


def _table(rows: list[list[str]], widths: list[int]) -> list[str]:
    """Kafka's `%-Ns` columns separated by one space; the last column is not padded."""
    return [
        " ".join(cell if i == len(row) - 1 else cell.ljust(widths[i]) for i, cell in enumerate(row))
        for row in rows
    ]


def _width(values: Sequence[str], minimum: int = 15) -> int:
    return max([minimum, *(len(v) for v in values)])


# -- describe ------------------------------------------------------------------------------------


async def _describe_offsets(
    client: GroupAdminClient, group: GroupDescription, output: Output
) -> None:
    committed = await client.committed_offsets(group.group_id)
    assigned = [(m, tp) for m in group.members for tp in m.assignment]
    members_first = sorted(group.members, key=lambda m: -len(m.assignment))
    rows_of: list[tuple[TopicPartition, Any]] = [
        (tp, member) for member in members_first for tp in member.assignment
    ]
    owned = {tp for _m, tp in assigned}
    rows_of += [(tp, None) for tp in sorted(committed) if tp not in owned]
    ends = await client.list_offsets([tp for tp, _ in rows_of], LATEST) if rows_of else {}
    if not _print_state(group, len(rows_of), output):
        return
    rows = [["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
             "CONSUMER-ID", "HOST", "CLIENT-ID"]]  # fmt: skip
    for (topic, partition), member in rows_of:
        offset = committed.get((topic, partition))
        end = ends.get((topic, partition))
        lag = end - offset if offset is not None and end is not None and end >= 0 else None
        rows.append(
            [
                group.group_id,
                topic,
                str(partition),
                MISSING if offset is None else str(offset),
                MISSING if end is None or end < 0 else str(end),
                MISSING if lag is None else str(lag),
                member.member_id if member is not None else MISSING,
                member.host if member is not None else MISSING,
                member.client_id if member is not None else MISSING,
            ]
        )
    widths = [
        _width([r[0] for r in rows]),
        _width([r[1] for r in rows]),
        10,
        15,
        15,
        15,
        _width([r[6] for r in rows]),
        _width([r[7] for r in rows]),
    ]
    output.out.append("")
    output.out.extend(_table(rows, widths))


def _print_state(group: GroupDescription, rows: int, output: Output) -> bool:
    """Kafka's shouldPrintMemberState: warnings to standard error; False: nothing to print."""
    if group.state == "Dead":
        raise Failure(f"consumer group '{group.group_id}' does not exist")
    if group.state == "Empty":
        output.err.append(f"\nConsumer group '{group.group_id}' has no active members.")
    elif group.state in ("PreparingRebalance", "CompletingRebalance"):
        output.err.append(f"\nWarning: Consumer group '{group.group_id}' is rebalancing.")
    return rows > 0


def _describe_members(group: GroupDescription, verbose: bool, output: Output) -> None:
    if not _print_state(group, len(group.members), output):
        return
    header = ["GROUP", "CONSUMER-ID", "GROUP-INSTANCE-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
    rows = [header + (["ASSIGNMENT"] if verbose else [])]
    for member in group.members:
        row = [
            group.group_id,
            member.member_id,
            member.group_instance_id or MISSING,
            member.host,
            member.client_id,
            str(len(member.assignment)),
        ]
        if verbose:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in member.assignment:
                by_topic.setdefault(topic, []).append(partition)
            row.append(
                ",".join(f"{t}({','.join(map(str, ps))})" for t, ps in sorted(by_topic.items()))
                or MISSING
            )
        rows.append(row)
    widths = [_width([r[i] for r in rows]) for i in range(5)] + [15]
    output.out.append("")
    output.out.extend(_table(rows, widths))


def _describe_state(group: GroupDescription, output: Output) -> None:
    if group.state == "Dead":
        raise Failure(f"consumer group '{group.group_id}' does not exist")
    node, host, port = group.coordinator
    coordinator = f"{host}:{port} ({node})"
    rows = [
        ["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"],
        [group.group_id, coordinator, group.protocol or "", group.state, str(len(group.members))],
    ]
    widths = [_width([r[0] for r in rows], 25), _width([r[1] for r in rows], 25), 20, 15]
    output.out.append("")
    output.out.extend(_table(rows, widths))


# -- reset ---------------------------------------------------------------------------------------


async def _partitions_to_reset(
    client: GroupAdminClient, args: argparse.Namespace, group_id: str
) -> list[TopicPartition]:
    if args.all_topics:
        return sorted(await client.committed_offsets(group_id))
    wanted: list[TopicPartition] = []
    specs = parse_topic_partitions(args.topic)
    known = await client.partitions_of(sorted({t for t, _ in specs}))
    for topic, partitions in specs:
        if partitions is None:
            wanted += sorted(tp for tp in known if tp[0] == topic)
        else:
            for partition in partitions:
                if (topic, partition) not in known:
                    raise OperatorError(f"partition {topic}-{partition} does not exist")
                wanted.append((topic, partition))
    return sorted(set(wanted))


async def _new_offsets(
    client: GroupAdminClient,
    args: argparse.Namespace,
    group_id: str,
    partitions: list[TopicPartition],
) -> dict[TopicPartition, int]:
    if not partitions:
        return {}
    earliest = await client.list_offsets(partitions, EARLIEST)
    latest = await client.list_offsets(partitions, LATEST)

    def clamp(requested: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        return {tp: min(max(o, earliest[tp]), latest[tp]) for tp, o in requested.items()}

    if args.to_earliest:
        return earliest
    if args.to_latest:
        return latest
    if args.to_offset is not None:
        return clamp(dict.fromkeys(partitions, args.to_offset))
    if args.shift_by is not None or args.to_current:
        committed = await client.committed_offsets(group_id)
        missing = [tp for tp in partitions if tp not in committed]
        if missing:
            names = ", ".join(f"{t}-{p}" for t, p in missing)
            raise OperatorError(f"no committed offset of group {group_id} for {names}")
        shift = args.shift_by or 0
        return clamp({tp: committed[tp] + shift for tp in partitions})
    if args.to_datetime is not None:
        timestamp = parse_datetime(args.to_datetime)
    else:
        timestamp = int(time.time() * 1000) - parse_duration(args.by_duration)
    found = await client.list_offsets(partitions, timestamp)
    return {tp: found[tp] if found.get(tp, -1) >= 0 else latest[tp] for tp in partitions}


async def _reset(
    client: GroupAdminClient, args: argparse.Namespace, groups: list[str], output: Output
) -> None:
    plans: list[tuple[str, dict[TopicPartition, int]]] = []
    for group_id in groups:
        described = await client.describe_group(group_id)
        if described.state not in ("Empty", "Dead"):
            raise Failure(
                f"assignments can only be reset if the group '{group_id}' is inactive, but the "
                f"current state is {described.state}"
            )
        partitions = await _partitions_to_reset(client, args, group_id)
        plans.append((group_id, await _new_offsets(client, args, group_id, partitions)))
    rows = [["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]]
    rows += [
        [g, t, str(p), str(o)] for g, offsets in plans for (t, p), o in sorted(offsets.items())
    ]
    if len(rows) > 1:
        output.out.append("")
        output.out.extend(line.rstrip() for line in _table(rows, [30, 30, 10, 15]))
    if not args.execute:
        if not args.dry_run:
            output.err.append(
                "WARN: No action will be performed as the --execute option is missing. Add "
                "--dry-run to say so explicitly in scripts."
            )
        return
    for group_id, offsets in plans:
        results = await client.commit_offsets(group_id, offsets)
        failed = {tp: e for tp, e in results.items() if e is not ErrorCode.none}
        if failed:
            detail = ", ".join(f"{t}-{p}: {e.name.upper()}" for (t, p), e in sorted(failed.items()))
            raise Failure(f"resetting the offsets of group {group_id} failed: {detail}")


# -- delete --------------------------------------------------------------------------------------


async def _delete(client: GroupAdminClient, groups: list[str], output: Output) -> None:
    results = {g: await client.delete_group(g) for g in groups}
    failed = {g: e for g, e in results.items() if e is not ErrorCode.none}
    deleted = [g for g in groups if g not in failed]
    if deleted:
        names = ", ".join(f"'{g}'" for g in deleted)
        output.out.append(f"Deletion of requested consumer groups ({names}) was successful.")
    if failed:
        detail = "; ".join(f"'{g}': {e.name.upper()}" for g, e in failed.items())
        raise Failure(f"deletion of some consumer groups failed: {detail}")


async def _delete_offsets(
    client: GroupAdminClient, args: argparse.Namespace, output: Output
) -> None:
    (group_id,) = args.group
    specs = parse_topic_partitions(args.topic)
    partitions: list[TopicPartition] = []
    for topic, wanted in specs:
        if wanted is None:
            known = await client.partitions_of([topic])
            partitions += sorted(known)
        else:
            partitions += [(topic, p) for p in wanted]
    error, results = await client.delete_offsets(group_id, partitions)
    if error is ErrorCode.group_id_not_found:
        raise Failure(f"consumer group '{group_id}' does not exist")
    if error is ErrorCode.non_empty_group:
        raise Failure(
            f"deleting offsets of a consumer group '{group_id}' is forbidden if the group is not empty"
        )
    if error is not ErrorCode.none:
        raise KafkaResponseError(error, f"group {group_id}")
    topics = ", ".join(dict.fromkeys(t for t, _ in specs))
    output.out.append(f"Request succeed for deleting offsets with topic {topics} group {group_id}")
    rows = [["TOPIC", "PARTITION", "STATUS"]]
    for (topic, partition), code in sorted(results.items()):
        status = "Successful" if code is ErrorCode.none else f"Error: {code.name.upper()}"
        rows.append([topic, str(partition), status])
    output.out.append("")
    output.out.extend(line.rstrip() for line in _table(rows, [30, 15, 15]))
    failed = sum(1 for code in results.values() if code is not ErrorCode.none)
    if failed:
        raise Failure(f"{failed} partition(s) kept their offsets")


# -- the command ---------------------------------------------------------------------------------


def validate(args: argparse.Namespace) -> None:
    actions = [
        a
        for a in ("list", "describe", "reset_offsets", "delete", "delete_offsets")
        if getattr(args, a)
    ]
    if len(actions) != 1:
        raise OperatorError(
            "exactly one of --list, --describe, --reset-offsets, --delete, --delete-offsets is needed"
        )
    action = actions[0]
    if action in ("describe", "reset_offsets", "delete") and not (args.group or args.all_groups):
        raise OperatorError(f"--{action.replace('_', '-')} needs --group or --all-groups")
    if args.group and args.all_groups:
        raise OperatorError("--group and --all-groups exclude each other")
    if action == "reset_offsets":
        specs = [s for s in RESET_SPECS if getattr(args, s) not in (None, False)]
        if len(specs) != 1:
            raise OperatorError(
                "--reset-offsets needs exactly one of --to-earliest, --to-latest, --to-current, "
                "--to-offset, --shift-by, --to-datetime, --by-duration"
            )
        if bool(args.topic) == bool(args.all_topics):
            raise OperatorError("--reset-offsets needs --topic or --all-topics (one of them)")
        if args.dry_run and args.execute:
            raise OperatorError("--dry-run and --execute exclude each other")
        if args.to_datetime is not None:
            parse_datetime(args.to_datetime)
        if args.by_duration is not None:
            parse_duration(args.by_duration)
    if action == "delete_offsets" and (len(args.group or []) != 1 or not args.topic):
        raise OperatorError("--delete-offsets needs one --group and at least one --topic")
    if args.topic:
        parse_topic_partitions(args.topic)


async def run(args: argparse.Namespace, output: Output) -> None:
    client = await GroupAdminClient.connect(parse_bootstrap(args.bootstrap_server), args.timeout)
    try:
        if args.list:
            states = [] if args.state in (None, True) else [s for s in args.state.split(",") if s]
            listed = await client.list_groups(states)
            if args.state is None:
                output.out.extend(group for group, _type, _state in listed)
            else:
                rows = [["GROUP", "STATE"]] + [[g, s] for g, _t, s in listed]
                output.out.extend(_table(rows, [_width([r[0] for r in rows]), 15]))
            return
        groups = list(dict.fromkeys(args.group or []))
        if args.all_groups:
            groups = [g for g, _type, _state in await client.list_groups()]
        if args.describe:
            for group_id in groups:
                described = await client.describe_group(group_id)
                if args.members:
                    _describe_members(described, args.verbose, output)
                elif args.state:
                    _describe_state(described, output)
                else:
                    await _describe_offsets(client, described, output)
        elif args.reset_offsets:
            await _reset(client, args, groups, output)
        elif args.delete:
            await _delete(client, groups, output)
        else:
            await _delete_offsets(client, args, output)
    finally:
        client.close()


def cmd_consumer_groups(args: argparse.Namespace) -> int:
    output = Output([], [])
    status = 0
    try:
        validate(args)
        asyncio.run(run(args, output))
    except OperatorError as e:
        status = 1
        error = f"odradek: error: {e}"
    for line in output.out:
        print(line)
    for line in output.err:
        print(line, file=sys.stderr)
    if status:
        print(error, file=sys.stderr)
    return status


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "consumer-groups",
        help="list, describe, reset and delete consumer groups",
        description="List, describe, reset the offsets of, and delete consumer groups "
        "(like kafka-consumer-groups.sh).",
    )
    parser.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,HOST:PORT]")
    parser.add_argument("--list", action="store_true", help="list the groups")
    parser.add_argument("--describe", action="store_true", help="describe groups")
    parser.add_argument("--reset-offsets", action="store_true", help="reset committed offsets")
    parser.add_argument("--delete", action="store_true", help="delete groups and their offsets")
    parser.add_argument(
        "--delete-offsets", action="store_true", help="delete some offsets of a group"
    )
    parser.add_argument("--group", action="append", metavar="GROUP", help="a group (repeatable)")
    parser.add_argument("--all-groups", action="store_true", help="every group")
    parser.add_argument(
        "--topic", action="append", metavar="TOPIC[:P,P]", help="a topic, or some of its partitions"
    )
    parser.add_argument(
        "--all-topics", action="store_true", help="every topic the group has offsets for"
    )
    view = parser.add_mutually_exclusive_group()
    view.add_argument("--offsets", action="store_true", help="describe offsets and lag (default)")
    view.add_argument("--members", action="store_true", help="describe the members")
    view.add_argument(
        "--state",
        nargs="?",
        const=True,
        metavar="STATE[,STATE]",
        help="with --describe: the group's state; with --list: show (or filter by) states",
    )
    parser.add_argument("--verbose", action="store_true", help="with --members: the assignments")
    parser.add_argument("--to-earliest", action="store_true", help="reset to the log start")
    parser.add_argument("--to-latest", action="store_true", help="reset to the log end")
    parser.add_argument("--to-current", action="store_true", help="reset to the committed offsets")
    parser.add_argument("--to-offset", type=int, metavar="N", help="reset to offset N")
    parser.add_argument("--shift-by", type=int, metavar="N", help="move the offsets by N (±)")
    parser.add_argument("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS.sss", help="reset to a time")
    parser.add_argument("--by-duration", metavar="PnDTnHnMnS", help="reset to this long ago")
    parser.add_argument("--dry-run", action="store_true", help="only print the plan (default)")
    parser.add_argument("--execute", action="store_true", help="commit the new offsets")
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the brokers (default 30)"
    )
    parser.set_defaults(func=cmd_consumer_groups)
    return parser
