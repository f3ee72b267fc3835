"""Reading many znodes fast: a private, short-lived ZooKeeper session speaking the wire protocol.

Why not kazoo: kazoo sends one request per turn of its connection thread, and each turn builds a
new epoll selector, makes a system call to wake the thread and another to write the request, and
every answer crosses back to the event loop on its own. That costs ~250-300 µs per read here,
which at controller failover (one read per partition state znode) makes 100,000 partitions take
half a minute of reads alone. Kafka's controller pipelines these reads on one connection; so does
this module, without the per-request thread hops: it opens its own session (asyncio streams on the
caller's loop), sends `sync` so that the server it reached has caught up with the ensemble's
leader, writes the GetData requests in large pipelined batches, parses the answers straight from
the receive buffer, and closes the session. The reads set no watches, which is all the controller
needs for partition states.

Only the three messages below are spoken (jute encoding, big-endian, every frame prefixed with its
length):

* ConnectRequest  (protocolVersion i32, lastZxidSeen i64, timeOut i32, sessionId i64,
  passwd buffer, readOnly bool) → ConnectResponse (protocolVersion, timeOut, sessionId, passwd).
* GetData request: RequestHeader (xid i32, type i32 = 4), path string, watch bool → ReplyHeader
  (xid i32, zxid i64, err i32), then on success data buffer (-1 = null) and Stat (czxid, mzxid,
  ctime, mtime i64; version, cversion, aversion i32; ephemeralOwner i64; dataLength, numChildren
  i32; pzxid i64).
* multiRead (type 22, ZooKeeper 3.6 and later): many GetData ops in one request. Each op is a
  MultiHeader (type i32 = 4, done bool = false, err i32 = -1) and its GetData body; a MultiHeader
  with type -1 and done true ends the list. The answer is a ReplyHeader and then, per op, a
  MultiHeader (type 4 and the data buffer and Stat above, or type -1 and an error code i32, for
  that op alone: a missing znode does not fail its neighbours), ended by a done header.
* sync (type 9, path) and closeSession (type -11).

The reads go as multiReads of up to MULTI_READ_OPS paths: the server's cost is per request, and
one request for a thousand znodes costs it about what a few single reads do (100,000 partition
states: ~0.3 s instead of ~4.5 s here). A server older than 3.6 answers the first multiRead with
an error; the session then falls back to pipelined GetData requests.

Answers come back in request order on one session, which is what lets the reader match them to
paths by position (and check the xid anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
from collections.abc import Sequence

from kazoo.protocol.states import ZnodeStat

from odradek.zk.errors import (
    ConnectionLossError,
    NoNodeError,
    SessionExpiredError,
    ZkError,
    ZkOperationError,
)

OP_GET_DATA = 4
OP_SYNC = 9
OP_MULTI_READ = 22
OP_ERROR = -1
OP_CLOSE_SESSION = -11
ERR_OK = 0
ERR_NO_NODE = -101

_INT = struct.Struct(">i")
_REQUEST_HEADER = struct.Struct(">iii")  # frame length, xid, type
_REPLY_HEADER = struct.Struct(">iqi")  # xid, zxid, err
_STAT = struct.Struct(">qqqqiiiqiiq")
_MULTI_HEADER = struct.Struct(">i?i")  # type, done, err
_CONNECT_REQUEST = struct.Struct(">iiqiqi16sB")  # frame length first
PASSWORD_BYTES = 16  # every ZooKeeper session password is 16 bytes

# Requests written per batch; answers are parsed as they arrive, so this only bounds the bytes
# queued in the socket buffer and the server's pipeline.
BATCH = 2000
# Paths per multiRead, and the most request bytes of paths in one (the server refuses requests
# over its jute.maxbuffer, 1 MB by default), with a few multiReads in flight.
MULTI_READ_OPS = 1000
MULTI_READ_PATH_BYTES = 256 * 1024
MULTI_READS_IN_FLIGHT = 4

ReadResult = tuple[bytes, ZnodeStat] | ZkError


class MultiReadRefusedError(ConnectionLossError):
    """The server closed the connection on the session's first multiRead (a server older than
    3.6 may): read from it again with GetData requests."""


def split_connect_string(connect_string: str) -> tuple[list[tuple[str, int]], str]:
    """(host, port) pairs and the chroot ('' when none) of a ZooKeeper connect string."""
    hosts, slash, chroot = connect_string.partition("/")
    pairs = []
    for item in hosts.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host:
            host, port = port, "2181"
        pairs.append((host.strip("[]"), int(port)))
    chroot = "/" + chroot.strip("/") if slash and chroot.strip("/") else ""
    return pairs, chroot


def encode_get_data(xid: int, path: str) -> bytes:
    raw = path.encode()
    # frame length covers header (8), path length (4), path, watch flag (1)
    return _REQUEST_HEADER.pack(13 + len(raw), xid, OP_GET_DATA) + _INT.pack(len(raw)) + raw + b"\0"


def _encode_path_request(xid: int, op: int, path: str) -> bytes:
    raw = path.encode()
    return _REQUEST_HEADER.pack(12 + len(raw), xid, op) + _INT.pack(len(raw)) + raw


def encode_multi_read(xid: int, paths: Sequence[str]) -> bytes:
    """One multiRead request of a GetData op per path (no watches)."""
    parts = []
    for path in paths:
        raw = path.encode()
        parts.append(_MULTI_HEADER.pack(OP_GET_DATA, False, -1) + _INT.pack(len(raw)) + raw + b"\0")
    parts.append(_MULTI_HEADER.pack(OP_ERROR, True, -1))
    body = b"".join(parts)
    return _REQUEST_HEADER.pack(8 + len(body), xid, OP_MULTI_READ) + body


def _op_error(err: int, path: str) -> ZkError:
    if err == ERR_NO_NODE:
        return NoNodeError(f"no znode {path}", path=path)
    return ZkOperationError(f"read of {path} failed: error {err}", path=path, zk_code=err)


def decode_multi_read_reply(
    frame: memoryview, paths: Sequence[str]
) -> tuple[int, int, list[ReadResult]]:
    """(xid, error of the whole request, each path's result) of one multiRead answer frame
    (without its length prefix). A request-level error (a server without multiRead) gives no
    results. struct.error or ConnectionLossError when the answer does not match the request."""
    xid, _zxid, err = _REPLY_HEADER.unpack_from(frame, 0)
    if err != ERR_OK:
        return xid, err, []
    results: list[ReadResult] = []
    offset = _REPLY_HEADER.size
    header = _MULTI_HEADER.unpack_from
    stat_size = _STAT.size
    unpack_stat = _STAT.unpack_from
    unpack_int = _INT.unpack_from
    for path in paths:
        op, done, op_err = header(frame, offset)
        offset += 9
        if done:
            break
        if op == OP_GET_DATA:
            (length,) = unpack_int(frame, offset)
            offset += 4
            data = b""
            if length > 0:
                data = bytes(frame[offset : offset + length])
                offset += length
            results.append((data, ZnodeStat(*unpack_stat(frame, offset))))
            offset += stat_size
        elif op == OP_ERROR:
            (op_err,) = unpack_int(frame, offset)
            offset += 4
            results.append(_op_error(op_err, path))
        else:
            raise ConnectionLossError(f"multiRead answered with an op of type {op}")
    if len(results) != len(paths) or not header(frame, offset)[1]:
        raise ConnectionLossError(f"multiRead answered {len(results)} ops for {len(paths)} paths")
    return xid, ERR_OK, results


def multi_read_chunks(paths: Sequence[str]) -> list[tuple[int, int]]:
    """(start, end) of each multiRead: at most MULTI_READ_OPS paths and MULTI_READ_PATH_BYTES of
    path text (at least one path each)."""
    chunks = []
    start = 0
    used = 0
    for index, path in enumerate(paths):
        size = len(path) + 14
        if index > start and (
            index - start >= MULTI_READ_OPS or used + size > MULTI_READ_PATH_BYTES
        ):
            chunks.append((start, index))
            start, used = index, 0
        used += size
    if start < len(paths):
        chunks.append((start, len(paths)))
    return chunks


def decode_get_data_reply(frame: memoryview, path: str) -> tuple[int, ReadResult]:
    """(xid, result) of one GetData answer frame (without its length prefix)."""
    xid, _zxid, err = _REPLY_HEADER.unpack_from(frame, 0)
    if err != ERR_OK:
        return xid, _op_error(err, path)
    (length,) = _INT.unpack_from(frame, 16)
    offset = 20
    data = b""
    if length > 0:
        data = bytes(frame[offset : offset + length])
        offset += length
    return xid, (data, ZnodeStat(*_STAT.unpack_from(frame, offset)))


class WireSession:
    """One private session spoken over asyncio streams: connect, pipelined reads, close.

    Also used (`odradek.zk.session_close`) to re-attach to an existing session by its id and
    password and close it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buffer = bytearray()
        self.xid = 0
        self.no_multi_read = False  # set once the server refused a multiRead

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        session_timeout_ms: int,
        *,
        session_id: int = 0,
        password: bytes = bytes(PASSWORD_BYTES),
    ) -> WireSession:
        """A new session; with `session_id` and `password`, that existing session re-attached to
        this connection instead (SessionExpiredError when the server answers that it is not
        alive: expired, closed, or the password is not its own)."""
        if len(password) != PASSWORD_BYTES:
            raise ZkOperationError(f"a ZooKeeper session password has {PASSWORD_BYTES} bytes")
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 26)
        session = cls(reader, writer)
        writer.write(
            _CONNECT_REQUEST.pack(
                44 + 1, 0, 0, session_timeout_ms, session_id, PASSWORD_BYTES, password, 0
            )
        )
        try:
            frame = await session.frame()
        except BaseException:
            writer.close()  # a timeout or a dropped connection: nobody else will close it
            raise
        _protocol, timeout, answered_id = struct.unpack_from(">iiq", frame, 0)
        if timeout <= 0 or answered_id == 0:
            # ZooKeeper's answer for a session it will not (re-)open: timeout 0, then it closes.
            writer.close()
            if session_id:
                raise SessionExpiredError(f"ZooKeeper session 0x{session_id:x} is not alive")
            raise ConnectionLossError("ZooKeeper refused the bulk-read session")
        return session

    async def frame(self) -> memoryview:
        """The next answer frame (without its length prefix)."""
        while True:
            if len(self.buffer) >= 4:
                (length,) = _INT.unpack_from(self.buffer, 0)
                if len(self.buffer) >= 4 + length:
                    frame = memoryview(bytes(self.buffer[4 : 4 + length]))
                    del self.buffer[: 4 + length]
                    return frame
            chunk = await self.reader.read(1 << 20)
            if not chunk:
                raise ConnectionLossError("ZooKeeper closed the bulk-read connection")
            self.buffer += chunk

    def frames(self) -> list[memoryview]:
        """Every complete answer frame already buffered, in order."""
        data = bytes(self.buffer)
        view = memoryview(data)
        out = []
        offset = 0
        while len(data) - offset >= 4:
            (length,) = _INT.unpack_from(data, offset)
            if len(data) - offset < 4 + length:
                break
            out.append(view[offset + 4 : offset + 4 + length])
            offset += 4 + length
        del self.buffer[:offset]
        return out

    async def sync(self, path: str) -> None:
        self.xid += 1
        self.writer.write(_encode_path_request(self.xid, OP_SYNC, path))
        frame = await self.frame()
        xid, _zxid, err = _REPLY_HEADER.unpack_from(frame, 0)
        if xid != self.xid or err != ERR_OK:
            raise ConnectionLossError(f"sync failed (xid {xid}, error {err})")

    async def read(self, paths: Sequence[str], full_paths: Sequence[str]) -> list[ReadResult]:
        """Each path's result, in order: multiReads, or GetData requests from a server that has
        no multiRead."""
        if not self.no_multi_read:
            results = await self._multi_read(paths, full_paths)
            if results is not None:
                return results
            self.no_multi_read = True
        return await self._pipelined_read(paths, full_paths)

    async def _multi_read(
        self, paths: Sequence[str], full_paths: Sequence[str]
    ) -> list[ReadResult] | None:
        """None when the server refuses multiRead (its first answer is a request-level error;
        nothing else was in flight then); MultiReadRefusedError when it closes the connection
        instead."""
        chunks = multi_read_chunks(full_paths)
        results: list[ReadResult] = []
        first_xid = self.xid + 1
        sent = 0
        answered = 0
        while answered < len(chunks):
            # One multiRead first, alone: a server without it may close the connection on a
            # pipeline of them.
            limit = 1 if answered == 0 else MULTI_READS_IN_FLIGHT
            while sent < len(chunks) and sent - answered < limit:
                start, end = chunks[sent]
                self.xid = first_xid + sent
                self.writer.write(encode_multi_read(self.xid, full_paths[start:end]))
                sent += 1
            try:
                await self.writer.drain()
                frame = await self.frame()
            except (OSError, ConnectionError, ConnectionLossError) as e:
                if answered == 0:
                    raise MultiReadRefusedError(
                        f"connection lost at the first multiRead: {e}"
                    ) from e
                raise
            start, end = chunks[answered]
            xid, err, part = decode_multi_read_reply(frame, paths[start:end])
            if xid != first_xid + answered:
                raise ConnectionLossError(f"answer out of order: xid {xid}")
            if err != ERR_OK:
                if answered == 0:
                    return None
                raise ConnectionLossError(f"multiRead failed: error {err}")
            results.extend(part)
            answered += 1
        return results

    async def _pipelined_read(
        self, paths: Sequence[str], full_paths: Sequence[str]
    ) -> list[ReadResult]:
        results: list[ReadResult] = []
        first_xid = self.xid + 1
        sent = 0
        while len(results) < len(paths):
            # keep about two batches in flight: one being answered, one queued behind it
            while sent < len(paths) and sent - len(results) < 2 * BATCH:
                end = min(sent + BATCH, len(paths))
                self.writer.write(
                    b"".join(
                        encode_get_data(first_xid + i, full_paths[i]) for i in range(sent, end)
                    )
                )
                sent = end
            await self.writer.drain()
            frames = self.frames()
            if not frames:
                chunk = await self.reader.read(1 << 20)
                if not chunk:
                    raise ConnectionLossError("ZooKeeper closed the bulk-read connection")
                self.buffer += chunk
                continue
            for frame in frames:
                index = len(results)
                xid, result = decode_get_data_reply(frame, paths[index])
                if xid != first_xid + index:
                    raise ConnectionLossError(f"answer out of order: xid {xid}")
                results.append(result)
        self.xid = first_xid + len(paths) - 1
        return results

    async def close_confirmed(self) -> None:
        """closeSession, and wait for ZooKeeper's answer: once it has come, the session is gone
        and its ephemeral znodes with it (the server deletes them in the closing transaction).
        ConnectionLossError when no answer comes; the session may then be closed or not."""
        self.xid += 1
        self.writer.write(_REQUEST_HEADER.pack(8, self.xid, OP_CLOSE_SESSION))
        try:
            await self.writer.drain()
            frame = await self.frame()
        finally:
            self.writer.close()
        xid, _zxid, err = _REPLY_HEADER.unpack_from(frame, 0)
        if xid != self.xid or err != ERR_OK:
            raise ConnectionLossError(f"closeSession failed (xid {xid}, error {err})")

    async def close(self) -> None:
        with contextlib.suppress(
            OSError, ConnectionError, asyncio.TimeoutError, ConnectionLossError
        ):
            self.xid += 1
            self.writer.write(_REQUEST_HEADER.pack(8, self.xid, OP_CLOSE_SESSION))
            async with asyncio.timeout(2):
                await self.writer.drain()
                await self.frame()
        self.writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self.writer.wait_closed()


async def read_many(
    connect_string: str,
    paths: Sequence[str],
    *,
    sessions: int = 1,
    session_timeout_ms: int = 30_000,
    timeout_s: float = 120.0,
    multi_read: bool = True,
) -> list[ReadResult]:
    """Each path's (data, stat) or its own error (NoNodeError for a missing znode), in order.

    `paths` are relative to the connect string's chroot; `sessions` splits the reads over that
    many parallel sessions (ZooKeeper serves different sessions' reads in parallel). Raises
    ConnectionLossError when no server answers or a connection breaks: the caller falls back to
    its regular session. `multi_read=False` sends GetData requests only (as to a server older
    than 3.6)."""
    if not paths:
        return []
    hosts, chroot = split_connect_string(connect_string)
    random.shuffle(hosts)
    full_paths = [chroot + p if chroot else p for p in paths]
    sessions = max(1, min(sessions, len(paths) // BATCH + 1))
    step = -(-len(paths) // sessions)
    parts = await asyncio.gather(
        *(
            _read_part(
                hosts,
                chroot,
                paths[i : i + step],
                full_paths[i : i + step],
                session_timeout_ms,
                timeout_s,
                multi_read,
            )
            for i in range(0, len(paths), step)
        )
    )
    return [result for part in parts for result in part]


async def _read_part(
    hosts: list[tuple[str, int]],
    chroot: str,
    paths: Sequence[str],
    full_paths: Sequence[str],
    session_timeout_ms: int,
    timeout_s: float,
    multi_read: bool,
) -> list[ReadResult]:
    last_error: BaseException | None = None
    attempts = [(host, port, multi_read) for host, port in hosts]
    while attempts:
        host, port, use_multi_read = attempts.pop(0)
        try:
            async with asyncio.timeout(timeout_s):
                session = await WireSession.open(host, port, session_timeout_ms)
                session.no_multi_read = not use_multi_read
                try:
                    await session.sync(chroot or "/")
                    return await session.read(paths, full_paths)
                finally:
                    await session.close()
        except MultiReadRefusedError as e:
            last_error = e
            attempts.insert(0, (host, port, False))  # the same server, GetData requests only
        except (OSError, ConnectionError, TimeoutError, struct.error, ConnectionLossError) as e:
            last_error = e
    raise ConnectionLossError(f"bulk read failed: {last_error}")
