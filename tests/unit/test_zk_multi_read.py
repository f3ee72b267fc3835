"""The bulk reader's multiRead (`odradek.zk.bulk_read`): the request's bytes, the decoding of
answers with data and per-op errors, the chunking by count and size, and the fallback to GetData
requests when a server refuses multiRead, against a scripted server speaking just enough of the
wire protocol (the real server's answers are checked in tests/integration/test_zk_bulk_read.py)."""

from __future__ import annotations

import asyncio
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from odradek.zk import bulk_read
from odradek.zk.errors import ConnectionLossError, NoNodeError, ZkOperationError

STAT = (1, 2, 3, 4, 5, 6, 7, 0, 9, 0, 11)
_STAT = struct.Struct(">qqqqiiiqiiq")


def string(raw: bytes) -> bytes:
    return struct.pack(">i", len(raw)) + raw


def parse_multi_read_request(body: bytes) -> list[str]:
    """The paths of a multiRead request body (after xid and type), as ZooKeeper parses it."""
    paths = []
    offset = 0
    while True:
        op, done, err = struct.unpack_from(">i?i", body, offset)
        offset += 9
        if done:
            assert (op, err) == (-1, -1)
            assert offset == len(body)
            return paths
        assert (op, err) == (bulk_read.OP_GET_DATA, -1)
        (length,) = struct.unpack_from(">i", body, offset)
        paths.append(body[offset + 4 : offset + 4 + length].decode())
        assert body[offset + 4 + length] == 0  # no watch
        offset += 5 + length


def multi_read_answer(xid: int, results: list[bytes | int]) -> bytes:
    """A server's answer frame (no length prefix): data, or an error code per op."""
    out = [struct.pack(">iqi", xid, 99, 0)]
    for result in results:
        if isinstance(result, int):
            out.append(struct.pack(">i?i", -1, False, result) + struct.pack(">i", result))
        else:
            out.append(struct.pack(">i?i", 4, False, 0) + string(result) + _STAT.pack(*STAT))
    out.append(struct.pack(">i?i", -1, True, -1))
    return b"".join(out)


paths_strategy = st.lists(
    st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=40).map(
        lambda s: "/" + s
    ),
    min_size=1,
    max_size=30,
)


@given(paths_strategy, st.integers(1, 2**31 - 1))
def test_multi_read_request_names_every_path_in_order(paths: list[str], xid: int) -> None:
    request = bulk_read.encode_multi_read(xid, paths)
    length, got_xid, op = struct.unpack_from(">iii", request, 0)
    assert length == len(request) - 4
    assert (got_xid, op) == (xid, bulk_read.OP_MULTI_READ)
    assert parse_multi_read_request(request[12:]) == paths


@given(
    st.lists(
        st.one_of(st.binary(max_size=50), st.sampled_from([-101, -102, -6])),
        min_size=1,
        max_size=30,
    )
)
def test_multi_read_answer_decodes_data_and_each_ops_own_error(
    results: list[bytes | int],
) -> None:
    paths = [f"/p/{i}" for i in range(len(results))]
    xid, err, decoded = bulk_read.decode_multi_read_reply(
        memoryview(multi_read_answer(7, results)), paths
    )
    assert (xid, err) == (7, 0)
    for path, expected, got in zip(paths, results, decoded, strict=True):
        if isinstance(expected, int):
            assert isinstance(got, ZkOperationError | NoNodeError)
            assert got.path == path
            assert isinstance(got, NoNodeError) == (expected == -101)
        else:
            assert isinstance(got, tuple)
            assert got[0] == expected
            assert tuple(got[1]) == STAT


def test_multi_read_answer_with_too_few_ops_is_a_broken_connection() -> None:
    frame = memoryview(multi_read_answer(1, [b"a"]))
    with pytest.raises(ConnectionLossError):
        bulk_read.decode_multi_read_reply(frame, ["/a", "/b"])


def test_request_level_error_gives_no_results() -> None:
    frame = memoryview(struct.pack(">iqi", 3, 0, -6))  # UNIMPLEMENTED
    assert bulk_read.decode_multi_read_reply(frame, ["/a"]) == (3, -6, [])


@given(st.lists(st.integers(1, 3000), max_size=3000))
def test_chunks_cover_every_path_once_within_the_bounds(lengths: list[int]) -> None:
    paths = ["/" + "x" * (n - 1) for n in lengths]
    chunks = bulk_read.multi_read_chunks(paths)
    assert [i for start, end in chunks for i in range(start, end)] == list(range(len(paths)))
    for start, end in chunks:
        assert 1 <= end - start <= bulk_read.MULTI_READ_OPS
        size = sum(len(p) + 14 for p in paths[start:end])
        assert end - start == 1 or size <= bulk_read.MULTI_READ_PATH_BYTES


class ScriptedServer:
    """Connect, sync, GetData and close as ZooKeeper answers them; multiRead answered with
    UNIMPLEMENTED, or the connection dropped, as a server older than 3.6 might."""

    def __init__(self, on_multi_read: str) -> None:
        self.on_multi_read = on_multi_read
        self.multi_reads = 0
        self.get_data = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve(reader, writer)
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        (length,) = struct.unpack(">i", await reader.readexactly(4))
        await reader.readexactly(length)  # ConnectRequest
        answer = struct.pack(">iiq", 0, 30000, 0x1234) + string(bytes(16)) + b"\0"
        writer.write(struct.pack(">i", len(answer)) + answer)
        while True:
            (length,) = struct.unpack(">i", await reader.readexactly(4))
            body = await reader.readexactly(length)
            xid, op = struct.unpack_from(">ii", body, 0)
            if op == bulk_read.OP_MULTI_READ:
                self.multi_reads += 1
                if self.on_multi_read == "close":
                    return
                answer = struct.pack(">iqi", xid, 5, -6)
            elif op == bulk_read.OP_GET_DATA:
                self.get_data += 1
                (n,) = struct.unpack_from(">i", body, 8)
                path = body[12 : 12 + n]
                answer = struct.pack(">iqi", xid, 5, 0) + string(path) + _STAT.pack(*STAT)
            else:  # sync, closeSession
                answer = struct.pack(">iqi", xid, 5, 0)
            writer.write(struct.pack(">i", len(answer)) + answer)
            await writer.drain()
            if op == bulk_read.OP_CLOSE_SESSION:
                return


@pytest.mark.parametrize("on_multi_read", ["unimplemented", "close"])
def test_a_server_without_multi_read_is_read_with_get_data(on_multi_read: str) -> None:
    async def scenario() -> None:
        scripted = ScriptedServer(on_multi_read)
        server = await asyncio.start_server(scripted.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            paths = [f"/t/{i}" for i in range(2500)]
            results = await bulk_read.read_many(f"127.0.0.1:{port}", paths, timeout_s=30)
        finally:
            server.close()
        assert [r[0] for r in results] == [p.encode() for p in paths]  # type: ignore[index]
        assert scripted.multi_reads == 1  # refused once, then GetData only
        assert scripted.get_data == len(paths)

    asyncio.run(asyncio.wait_for(scenario(), 60))
