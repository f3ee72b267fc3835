"""A restarted broker reclaims its registration from its own previous process at once, instead of
waiting for that process's ZooKeeper session to expire.

The problem. A broker process that dies without closing its ZooKeeper session (SIGKILL, a crash,
the OOM killer) leaves the session open on the server until `zookeeper.session.timeout.ms` has
passed (18 s by default), and with it its ephemeral registration `/brokers/ids/<id>` (and
`/controller` if it was the controller). A new process of the same broker cannot register while
that znode exists, so it used to wait out the timeout (`BrokerZk._register_broker`).

The record. Just before each registration, that is for every new session (start-up, and again
after a session expiry), the broker writes the session's id and password to
`zookeeper-session.properties` in its first live log directory, next to `meta.properties`:

    version=0
    broker.id=1
    session.id=0x100008a5c2e0003
    session.password=<32 hex digits: ZooKeeper's 16-byte session password>
    log.dirs=/var/lib/odradek/a,/var/lib/odradek/b

`log.dirs` are the directories the writing process held locked then. The file is written
atomically (temporary file, fsync, rename, fsync of the directory: a crash leaves the old record
or the new one) with mode 0600: its password lets whoever reads it end the broker's session.

Reclaiming (`reclaim_registration`), before a process's first registration:
  1. read `/brokers/ids/<id>`; if it does not exist there is nothing to reclaim;
  2. read the records of every live log directory (one that cannot be read or parsed is ignored
     with a warning, never fatal: it is replaced at the next registration);
  3. `reclaimable`: the znode's ephemeralOwner must be a recorded session of this broker id, and
     this process must hold the lock of every directory listed with it;
  4. if so, re-attach to that session on a short-lived connection of our own and close it
     (`odradek.zk.session_close`): ZooKeeper deletes its ephemerals in the closing transaction,
     the controller sees the broker go (or, if it was the controller, a new election starts),
     and the registration that follows succeeds at once. If the session has expired meanwhile,
     ZooKeeper says so at once and registration simply proceeds.
Otherwise nothing is closed and registration waits for the znode to go, as before: in particular
when another process registered with our broker.id (an operator mistake, reported after a
session timeout's patience as one line), since its session is not in our records.

Why this is safe: closing a session whose process still runs would take the registration (and
perhaps the controller) away from a live broker. The log directory locks exclude that. A broker
process holds an exclusive flock (`.lock`, `LogManager`) on each of its log directories from before
it contacts ZooKeeper until it exits (the kernel releases it when the process dies, however it
dies); it lets one go early only when that directory fails, and a process left with none halts. So
if this process holds the lock of every directory the recording process held when it wrote the
record, the recording process is gone: a live one would still hold at least one of them (a second
process on the same directories fails at start-up: "log directory ... is in use by another broker
process"). A broker paused rather than dead (SIGSTOP, a long GC pause) still holds its locks,
so nothing can reclaim from it.

Off by default (`zookeeper.session.reclaim.enable=true` turns it on; the session is recorded
either way). The fault suite found (seed 903843703) the last stable offset of a partition going
back under one leader epoch on the same broker after such fast restarts. The likely path: the
old registration's removal and the new one follow each other at once, so a restart that used to
be seen by a controller (the old session expiring first) can now happen while no controller
watches (one was killed at the same time); the next controller then finds the restarted broker
registered, and where it is the only live ISR member it keeps its leadership at the same epoch
(`broker_events._on_unprocessed_restarts`) and serves its checkpointed high watermark. Until that
gap is closed (a new leader epoch for such a leader without putting its partitions offline), the
faster restart stays opt-in.

Concurrency: called on the broker's event loop only (`BrokerZk._register_broker`). The file I/O is
synchronous and small, like the other per-directory files.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from odradek.errors import OdradekError
from odradek.log.checkpoints import fsync_dir
from odradek.zk.client import ZnodeStat
from odradek.zk.errors import ConnectionLossError, ZkError
from odradek.zk.session_close import close_session
from odradek.zk.znodes import BrokerIdZNode

log = logging.getLogger(__name__)

SESSION_FILE = "zookeeper-session.properties"
VERSION = "0"
PASSWORD_BYTES = 16
FILE_MODE = 0o600
CLOSE_TIMEOUT_S = 5.0


class InvalidSessionRecordError(OdradekError):
    """A session record that cannot be used (torn, malformed, or another broker's)."""


@dataclass(frozen=True, slots=True)
class RecordedSession:
    """One broker process's ZooKeeper session, as it recorded it."""

    broker_id: int
    session_id: int
    password: bytes
    log_dirs: tuple[str, ...]  # absolute paths the recording process held locked

    def encode(self) -> str:
        return (
            f"version={VERSION}\n"
            f"broker.id={self.broker_id}\n"
            f"session.id=0x{self.session_id:x}\n"
            f"session.password={self.password.hex()}\n"
            f"log.dirs={','.join(self.log_dirs)}\n"
        )

    @classmethod
    def decode(cls, text: str) -> RecordedSession:
        """The record in `text`; InvalidSessionRecordError when it is torn or malformed."""
        if not text.endswith("\n"):
            raise InvalidSessionRecordError("torn (no final newline)")
        values: dict[str, str] = {}
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip()
        if values.get("version") != VERSION:
            raise InvalidSessionRecordError(f"unknown version {values.get('version')!r}")
        try:
            broker_id = int(values["broker.id"])
            session_id = int(values["session.id"], 16)
            password = bytes.fromhex(values["session.password"])
            log_dirs = tuple(d for d in values["log.dirs"].split(",") if d)
        except KeyError as e:
            raise InvalidSessionRecordError(f"no {e.args[0]}") from None
        except ValueError as e:
            raise InvalidSessionRecordError(str(e)) from None
        if session_id <= 0 or len(password) != PASSWORD_BYTES or not log_dirs:
            raise InvalidSessionRecordError("malformed session id, password or log.dirs")
        return cls(broker_id, session_id, password, log_dirs)


def _absolute(log_dir: Path | str) -> str:
    return os.path.abspath(log_dir)


def write_session_record(log_dir: Path, record: RecordedSession) -> None:
    """Replace `log_dir`'s record atomically, readable by this user only. Raises OSError."""
    path = log_dir / SESSION_FILE
    temporary = path.with_name(SESSION_FILE + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # a temporary file left by a crash keeps its old mode otherwise
        os.write(fd, record.encode().encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    fsync_dir(log_dir)


def read_session_records(log_dirs: Iterable[Path], broker_id: int) -> list[RecordedSession]:
    """The usable records of these directories. A missing file is normal; one that cannot be read
    or parsed, or that names another broker, is logged as a warning and skipped."""
    records = []
    for log_dir in log_dirs:
        path = log_dir / SESSION_FILE
        try:
            record = RecordedSession.decode(path.read_text(encoding="ascii"))
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError, InvalidSessionRecordError) as e:
            log.warning("ignoring %s: %s", path, e)
            continue
        if record.broker_id != broker_id:
            log.warning("ignoring %s: it is broker %d's, not ours", path, record.broker_id)
            continue
        records.append(record)
    return records


def reclaimable(
    owner: int, records: Sequence[RecordedSession], locked_dirs: Iterable[Path | str]
) -> RecordedSession | None:
    """The record of the session `owner` (a registration's ephemeralOwner) if it may be closed:
    recorded by this broker, and every directory its process held is locked by this process.
    None otherwise (see the module docstring for why the locks make it safe)."""
    locked = {_absolute(d) for d in locked_dirs}
    for record in records:
        if record.session_id == owner and owner != 0:
            if all(_absolute(d) in locked for d in record.log_dirs):
                return record
            log.info(
                "session 0x%x of our previous process held %s; not all of them are ours now: "
                "not closing it",
                owner,
                ", ".join(record.log_dirs),
            )
    return None


class SessionClient(Protocol):
    """What reclaiming needs of the broker's ZooKeeper client (`ZkClient`)."""

    connect_string: str

    @property
    def session_id(self) -> int | None: ...

    @property
    def session_password(self) -> bytes | None: ...

    async def get_or_none(self, path: str) -> tuple[bytes, ZnodeStat] | None: ...


async def reclaim_registration(
    zk: SessionClient,
    broker_id: int,
    live_log_dirs: Sequence[Path],
) -> bool:
    """Steps 1-4 of the module docstring. True when it closed our previous process's session
    (its registration is gone); False when there was nothing to do or it may not or could not.
    ZooKeeper errors are logged, not raised: registration then waits as it always did."""
    path = BrokerIdZNode.path(broker_id)
    try:
        found = await zk.get_or_none(path)
    except ZkError as e:
        log.warning("cannot read %s to reclaim it: %s", path, e)
        return False
    if found is None:
        return False
    owner = found[1].ephemeralOwner
    if owner == zk.session_id:
        return False  # ours already (a retried registration)
    record = reclaimable(owner, read_session_records(live_log_dirs, broker_id), live_log_dirs)
    if record is None:
        log.info(
            "%s is held by session 0x%x, not one our dead previous process recorded: "
            "waiting for it to go",
            path,
            owner,
        )
        return False
    try:
        closed = await close_session(
            zk.connect_string, record.session_id, record.password, timeout_s=CLOSE_TIMEOUT_S
        )
    except ConnectionLossError as e:
        log.warning(
            "cannot close session 0x%x of our previous process (%s): waiting for it to expire",
            record.session_id,
            e,
        )
        return False
    if closed:
        log.info(
            "closed session 0x%x of our previous process: its registration %s is gone",
            record.session_id,
            path,
        )
    else:
        log.info("session 0x%x of our previous process had already ended", record.session_id)
    return closed


def record_session(zk: SessionClient, broker_id: int, live_log_dirs: Sequence[Path]) -> None:
    """Record the current session in the first live log directory (before registering with it).
    A write that fails is logged: the broker still registers, and a restart waits as before."""
    session_id, password = zk.session_id, zk.session_password
    if not session_id or password is None or not live_log_dirs:
        return
    record = RecordedSession(
        broker_id, session_id, password, tuple(_absolute(d) for d in live_log_dirs)
    )
    try:
        write_session_record(live_log_dirs[0], record)
    except OSError as e:
        log.warning(
            "cannot record ZooKeeper session 0x%x in %s: %s", session_id, live_log_dirs[0], e
        )
