"""`odradek dump-log`: print a partition directory's files offline, like Kafka's
`kafka-dump-log.sh` (DumpLogSegments).

  odradek dump-log --files 00000000000000000000.log[,...] [--print-data-log] [--deep-iteration]
                   [--verify-index-only] [--index-sanity-check] [--max-bytes N]
                   [--skip-record-metadata]

It reads files, never a broker: point it at a stopped broker's directory or at a copy. Each file is
recognised by its suffix and read with the `odradek.log` package's own readers, so what it prints is
what the broker would load:

* `.log` (a segment): one line per batch (`baseOffset: 0 lastOffset: 2 count: 3 baseSequence: ...
  position: 0 CreateTime: ... size: ... magic: 2 compresscodec: none crc: ... isvalid: true`); with
  `--deep-iteration` (implied by `--print-data-log`) one `| offset: ...` line per record below its
  batch (size of key and value, sequence, header keys, the marker of a control batch), and with
  `--print-data-log` the key and payload as UTF-8 text. Offsets that do not follow one another are
  reported on standard error at the end; bytes after the last whole batch are reported as
  `Found N invalid bytes at the end of ...`.
* `.index`: `offset: O position: P` per entry, each checked against the segment beside it (the
  batch at P must end at O; mismatches are reported on standard error); `--index-sanity-check` runs
  only the check the broker runs before trusting an index at start-up (whole entries, increasing
  columns) and prints `... passed sanity check.`.
* `.timeindex`: `timestamp: T offset: O` per entry, checked against the segment (the batch ending
  at O must have T as its largest timestamp; timestamps must increase).
* `.snapshot` (producer state): one line per producer, Kafka's fields.
* `.txnindex` (aborted transactions): one line per aborted transaction.
* checkpoint files (`recovery-point-offset-checkpoint`, `replication-offset-checkpoint`,
  `log-start-offset-checkpoint`, `cleaner-offset-checkpoint`, `leader-epoch-checkpoint`) — which
  Kafka's tool does not read — one line per entry.

Exit status 0, or 1 when a file could not be read, failed its sanity check, or held corrupt data
(each reported as one line on standard error after what could be printed).
"""

from __future__ import annotations

import argparse
import mmap
import os
import struct
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from odradek.errors import CorruptIndexError, KafkaError, OdradekError
from odradek.log.checkpoints import read_offset_checkpoint
from odradek.log.index import OffsetIndex, TimeIndex
from odradek.log.leader_epoch import LeaderEpochCache
from odradek.log.naming import (
    CLEANER_OFFSET_CHECKPOINT,
    INDEX_SUFFIX,
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    LOG_SUFFIX,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    SNAPSHOT_SUFFIX,
    TIME_INDEX_SUFFIX,
)
from odradek.log.producer_snapshot import read_snapshot
from odradek.log.transaction_index import SUFFIX as TXN_INDEX_SUFFIX
from odradek.log.transaction_index import VERSION as TXN_INDEX_VERSION
from odradek.log.transaction_index import read_index_file
from odradek.protocol.record_batch import (
    BatchHeader,
    TimestampType,
    compute_crc,
    decode_records,
    iter_batches,
)

RECORD_INDENT = "|"
_INT32_MAX = 2**31 - 1
_DELETE_HORIZON_BIT = 0x40
_CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_TIMESTAMP_TYPE_NAMES = {
    TimestampType.CREATE_TIME: "CreateTime",
    TimestampType.LOG_APPEND_TIME: "LogAppendTime",
}
# A control record's key: version (int16) and type (int16); an end-transaction marker's value:
# version (int16) and the coordinator epoch (int32).
_CONTROL_KEY = struct.Struct(">hh")
_END_TXN_MARKER = struct.Struct(">hi")
_CONTROL_TYPES = {0: "ABORT", 1: "COMMIT"}
_OFFSET_CHECKPOINTS = (
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    CLEANER_OFFSET_CHECKPOINT,
)


@dataclass(frozen=True, slots=True)
class DumpOptions:
    print_data_log: bool = False
    deep_iteration: bool = False
    verify_index_only: bool = False
    index_sanity_check: bool = False
    max_bytes: int = _INT32_MAX
    skip_record_metadata: bool = False


@dataclass(slots=True)
class DumpReport:
    """What goes to standard error after every file was dumped (Kafka's order)."""

    index_mismatches: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    time_mismatches: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    time_out_of_order: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    time_offsets_not_found: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    non_consecutive: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = []
        for name, pairs in self.index_mismatches.items():
            out.append(f"Mismatches in :{name}")
            out += [f"  Index offset: {i}, log offset: {o}" for i, o in pairs]
        for name, pairs in self.time_mismatches.items():
            out.append(f"Found timestamp mismatch in :{name}")
            out += [f"  Index timestamp: {i}, log timestamp: {t}" for i, t in pairs]
        for name, pairs in self.time_out_of_order.items():
            out.append(f"Found out of order timestamp in :{name}")
            out += [f"  Index timestamp: {i}, Previously indexed timestamp: {p}" for i, p in pairs]
        for pairs in self.time_offsets_not_found.values():
            out.append("The following indexed offsets are not found in the log.")
            out += [f"Indexed offset: {i}, found log offset: {o}" for i, o in pairs]
        for name, pairs in self.non_consecutive.items():
            out.append(f"Non-consecutive offsets in {name}")
            out += [f"  {first} is followed by {second}" for first, second in pairs]
        return out


@contextmanager
def _mapped(path: Path) -> Iterator[mmap.mmap | bytes]:
    """The file's bytes, memory-mapped (segments can be a gigabyte); slicing copies only the
    slice, and no memoryview is kept, so the map closes cleanly."""
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            yield b""
            return
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            yield mapped


def _base_offset(path: Path) -> int:
    try:
        return int(path.name.split(".")[0])
    except ValueError:
        raise OdradekError(f"{path.name} is not named after a base offset") from None


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(path.name.split(".")[0] + suffix)


# -- segments ---------------------------------------------------------------------------------


def _last_sequence(header: BatchHeader) -> int:
    if header.base_sequence < 0:
        return -1
    # Sequences wrap at Int32.MaxValue, as Kafka's DefaultRecordBatch.incrementSequence does.
    return (header.base_sequence + header.last_offset_delta) % (_INT32_MAX + 1)


def batch_line(header: BatchHeader, position: int, data: mmap.mmap | bytes) -> str:
    timestamp_type = _TIMESTAMP_TYPE_NAMES[header.timestamp_type]
    delete_horizon = (
        f"OptionalLong[{header.base_timestamp}]"
        if header.attributes & _DELETE_HORIZON_BIT
        else "OptionalLong.empty"
    )
    crc_ok = compute_crc(data, header) == header.crc
    return (
        f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} "
        f"count: {header.records_count} baseSequence: {header.base_sequence} "
        f"lastSequence: {_last_sequence(header)} producerId: {header.producer_id} "
        f"producerEpoch: {header.producer_epoch} "
        f"partitionLeaderEpoch: {header.partition_leader_epoch} "
        f"isTransactional: {str(header.is_transactional).lower()} "
        f"isControl: {str(header.is_control).lower()} deleteHorizonMs: {delete_horizon} "
        f"position: {position} {timestamp_type}: {header.max_timestamp} size: {header.size} "
        f"magic: {header.magic} compresscodec: {_CODEC_NAMES.get(header.compression, '?')} "
        f"crc: {header.crc} isvalid: {str(crc_ok).lower()}"
    )


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _record_lines(
    header: BatchHeader, batch: bytes, options: DumpOptions
) -> Iterator[tuple[int, str]]:
    """(offset, line) of each record of the batch."""
    timestamp_type = _TIMESTAMP_TYPE_NAMES[header.timestamp_type]
    for record in decode_records(batch):
        parts: list[str] = []
        if not options.skip_record_metadata:
            delta = record.offset - header.base_offset
            sequence = (
                -1
                if header.base_sequence < 0
                else (header.base_sequence + delta) % (_INT32_MAX + 1)
            )
            parts.append(
                f"offset: {record.offset} {timestamp_type}: {record.timestamp} "
                f"keySize: {-1 if record.key is None else len(record.key)} "
                f"valueSize: {-1 if record.value is None else len(record.value)} "
                f"sequence: {sequence} headerKeys: [{','.join(k for k, _ in record.headers)}]"
            )
            if header.is_control:
                parts.append(_control_text(record.key, record.value))
        if options.print_data_log and not header.is_control:
            if record.key is not None:
                parts.append(f"key: {_text(record.key)}")
            if record.value is not None:
                parts.append(f"payload: {_text(record.value)}")
        yield record.offset, f"{RECORD_INDENT} " + " ".join(parts)


def _control_text(key: bytes | None, value: bytes | None) -> str:
    if key is None or len(key) < _CONTROL_KEY.size:
        return "controlType: UNKNOWN(-1)"
    _, control_type = _CONTROL_KEY.unpack_from(key)
    name = _CONTROL_TYPES.get(control_type)
    if name is None or value is None or len(value) < _END_TXN_MARKER.size:
        return f"controlType: UNKNOWN({control_type})"
    _, coordinator_epoch = _END_TXN_MARKER.unpack_from(value)
    return f"endTxnMarker: {name} coordinatorEpoch: {coordinator_epoch}"


def dump_segment(
    path: Path, options: DumpOptions, report: DumpReport, out: Callable[[str], None]
) -> None:
    out(f"Log starting offset: {_base_offset(path)}")
    deep = options.deep_iteration or options.print_data_log
    with _mapped(path) as data:
        limit = min(len(data), options.max_bytes)
        valid_bytes = 0
        last_offset = -1
        pairs: list[tuple[int, int]] = []
        try:
            for header in iter_batches(data):
                if header.position + header.size > limit:
                    break
                out(batch_line(header, valid_bytes, data))
                if deep:
                    batch = data[header.position : header.position + header.size]
                    for offset, line in _record_lines(header, batch, options):
                        if last_offset != -1 and offset != last_offset + 1:
                            pairs.append((last_offset, offset))
                        last_offset = offset
                        out(line)
                valid_bytes += header.size
        except KafkaError as e:
            report.errors.append(f"{path}: {e} (after {valid_bytes} valid bytes)")
        finally:
            if pairs:
                report.non_consecutive[str(path.absolute())] = pairs
        trailing = len(data) - valid_bytes
        if trailing > 0 and options.max_bytes == _INT32_MAX:
            out(f"Found {trailing} invalid bytes at the end of {path.name}")


# -- indexes ----------------------------------------------------------------------------------


def _batch_ending_at_or_after(
    data: mmap.mmap | bytes, position: int, offset: int
) -> BatchHeader | None:
    for header in iter_batches(data, position):
        if header.last_offset >= offset:
            return header
    return None


def _sanity_check(index: OffsetIndex | TimeIndex, path: Path) -> None:
    size = path.stat().st_size
    entry_size = index._ENTRY.size
    if size % entry_size:
        raise CorruptIndexError(
            f"Index file {path.name} is corrupt, found {size} bytes which is neither positive "
            f"nor a multiple of {entry_size}."
        )
    index.entries()  # loads the file and runs the broker's checks on its columns


def dump_index(
    path: Path, options: DumpOptions, report: DumpReport, out: Callable[[str], None]
) -> None:
    index = OffsetIndex(path, _base_offset(path), _INT32_MAX)
    if index.entry_count == 0:
        out(f"{path} is empty.")
        return
    if options.index_sanity_check:
        _sanity_check(index, path)
        out(f"{path} passed sanity check.")
        return
    mismatches: list[tuple[int, int]] = []
    with _mapped(_sibling(path, LOG_SUFFIX)) as data:
        for i, (offset, position) in enumerate(index.entries()):
            if offset == index.base_offset and i > 0:
                break  # zero-filled tail entries (a crash): nothing after them is real
            found = next(iter_batches(data, position), None) if position < len(data) else None
            last = -1 if found is None else found.last_offset
            if last != offset:
                mismatches.append((offset, last))
            if not options.verify_index_only:
                out(f"offset: {offset} position: {position}")
    if mismatches:
        report.index_mismatches[str(path.absolute())] = mismatches


def dump_time_index(
    path: Path, options: DumpOptions, report: DumpReport, out: Callable[[str], None]
) -> None:
    base = _base_offset(path)
    time_index = TimeIndex(path, base, _INT32_MAX)
    if options.index_sanity_check:
        _sanity_check(time_index, path)
        out(f"{path} passed sanity check.")
        return
    offset_index = OffsetIndex(_sibling(path, INDEX_SUFFIX), base, _INT32_MAX)
    name = str(path.absolute())
    previous = -1
    with _mapped(_sibling(path, LOG_SUFFIX)) as data:
        for i, (timestamp, offset) in enumerate(time_index.entries()):
            if offset == base and i > 0:
                break
            _, position = offset_index.lookup(offset)
            header = _batch_ending_at_or_after(data, position, offset)
            if header is None or header.last_offset != offset:
                found = -1 if header is None else header.last_offset
                report.time_offsets_not_found.setdefault(name, []).append((offset, found))
            else:
                batch = data[header.position : header.position + header.size]
                largest = max((r.timestamp for r in decode_records(batch)), default=-1)
                if largest != timestamp:
                    report.time_mismatches.setdefault(name, []).append((timestamp, largest))
                if previous >= timestamp:
                    report.time_out_of_order.setdefault(name, []).append((timestamp, previous))
            if not options.verify_index_only:
                out(f"timestamp: {timestamp} offset: {offset}")
            previous = timestamp


# -- producer snapshots, transaction indexes, checkpoints --------------------------------------


def dump_producer_snapshot(path: Path, out: Callable[[str], None]) -> None:
    for entry in read_snapshot(path):
        line = (
            f"producerId: {entry.producer_id} producerEpoch: {entry.producer_epoch} "
            f"coordinatorEpoch: {entry.coordinator_epoch} "
            f"currentTxnFirstOffset: {entry.current_txn_first_offset} "
            f"lastTimestamp: {entry.timestamp} "
        )
        if entry.last_offset >= 0:
            first_sequence = (
                -1
                if entry.last_sequence < 0
                else (entry.last_sequence - entry.offset_delta) % (_INT32_MAX + 1)
            )
            line += (
                f"firstSequence: {first_sequence} lastSequence: {entry.last_sequence} "
                f"lastOffset: {entry.last_offset} offsetDelta: {entry.offset_delta} "
                f"timestamp: {entry.timestamp}"
            )
        out(line)


def dump_txn_index(path: Path, out: Callable[[str], None]) -> None:
    for txn in read_index_file(path):
        out(
            f"version: {TXN_INDEX_VERSION} producerId: {txn.producer_id} "
            f"firstOffset: {txn.first_offset} lastOffset: {txn.last_offset} "
            f"lastStableOffset: {txn.last_stable_offset}"
        )


def dump_checkpoint(path: Path, out: Callable[[str], None]) -> None:
    if not path.is_file():
        raise OdradekError(f"{path} does not exist or is not a file")
    if path.name == LEADER_EPOCH_CHECKPOINT:
        for entry in LeaderEpochCache(path).epoch_entries():
            out(f"epoch: {entry.epoch} startOffset: {entry.start_offset}")
        return
    for (topic, partition), offset in sorted(read_offset_checkpoint(path).items()):
        out(f"topic: {topic} partition: {partition} offset: {offset}")


def _is_checkpoint(path: Path) -> bool:
    return path.name in (*_OFFSET_CHECKPOINTS, LEADER_EPOCH_CHECKPOINT)


# -- the command ------------------------------------------------------------------------------


def dump_file(
    path: Path, options: DumpOptions, report: DumpReport, out: Callable[[str], None]
) -> bool:
    """Dump one file; False if its kind is unknown."""
    if _is_checkpoint(path):
        dump_checkpoint(path, out)
        return True
    suffix = path.suffix
    if not path.is_file():
        raise OdradekError(f"{path} does not exist or is not a file")
    if suffix == LOG_SUFFIX:
        dump_segment(path, options, report, out)
    elif suffix == INDEX_SUFFIX:
        dump_index(path, options, report, out)
    elif suffix == TIME_INDEX_SUFFIX:
        dump_time_index(path, options, report, out)
    elif suffix == SNAPSHOT_SUFFIX:
        dump_producer_snapshot(path, out)
    elif suffix == TXN_INDEX_SUFFIX:
        dump_txn_index(path, out)
    else:
        return False
    return True


def run(files: list[Path], options: DumpOptions, stdout: TextIO, stderr: TextIO) -> int:
    report = DumpReport()

    def out(line: str) -> None:
        stdout.write(line + "\n")

    for path in files:
        out(f"Dumping {path}")
        try:
            if not dump_file(path, options, report, out):
                stderr.write(f"Ignoring unknown file {path}\n")
        except BrokenPipeError:
            raise
        except (OdradekError, OSError, ValueError) as e:
            # OSError: unreadable file; ValueError: a file that is not what its name says.
            report.errors.append(f"{path}: {e}")
    stdout.flush()
    for line in report.lines():
        stderr.write(line + "\n")
    for error in report.errors:
        stderr.write(f"odradek: error: {error}\n")
    return 1 if report.errors else 0


def cmd_dump_log(args: argparse.Namespace) -> int:
    files = [Path(f) for f in args.files.split(",") if f]
    if not files:
        print("odradek: error: --files needs at least one file", file=sys.stderr)
        return 1
    if args.max_bytes <= 0:
        print("odradek: error: --max-bytes must be positive", file=sys.stderr)
        return 1
    options = DumpOptions(
        print_data_log=args.print_data_log,
        deep_iteration=args.deep_iteration,
        verify_index_only=args.verify_index_only,
        index_sanity_check=args.index_sanity_check,
        max_bytes=args.max_bytes,
        skip_record_metadata=args.skip_record_metadata,
    )
    try:
        return run(files, options, sys.stdout, sys.stderr)
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "dump-log",
        help="print log segments, indexes, snapshots and checkpoints (offline)",
        description="Parse a partition's files and print them, offline (like kafka-dump-log.sh): "
        ".log, .index, .timeindex, .snapshot, .txnindex and checkpoint files.",
    )
    parser.add_argument(
        "--files", required=True, metavar="F1,F2", help="comma-separated files to dump"
    )
    parser.add_argument(
        "--print-data-log",
        action="store_true",
        help="print each record's key and payload (implies --deep-iteration)",
    )
    parser.add_argument(
        "--deep-iteration", action="store_true", help="print every record, not only batches"
    )
    parser.add_argument(
        "--verify-index-only",
        action="store_true",
        help="check indexes against the segment without printing their entries",
    )
    parser.add_argument(
        "--index-sanity-check",
        action="store_true",
        help="only run the sanity check the broker runs on an index before using it",
    )
    parser.add_argument(
        "--max-bytes",
        type=int,
        default=_INT32_MAX,
        metavar="N",
        help="read at most N bytes of each .log file",
    )
    parser.add_argument(
        "--skip-record-metadata",
        action="store_true",
        help="with --print-data-log, print only keys and payloads",
    )
    parser.set_defaults(func=cmd_dump_log)
    return parser
