"""Sends fuzzed frames to a live broker, many connections at a time, and checks each outcome.

Each frame gets its own connection: connect, send the frame, then read until an answer to its
correlation id arrives, the broker closes the connection, or the frame's deadline passes (short for
frames that may legitimately wait, long otherwise), then close. The outcome is checked against the
frame's `Expect` (see frames.py); an answer must also decode as a response of the frame's API and
version. The first violation stops the run with the frame's description (seed, index, hex dump).

Every `CHECK_EVERY` frames the broker process must still be alive; its RSS is sampled to let the
test bound its growth.

Concurrency: one asyncio loop in the test's thread; `CONCURRENCY` connections in flight.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from odradek.protocol.codec import ProtocolError, decode_response
from tests.fuzz.frames import Expect, Frame

CONCURRENCY = 24
ANSWER_DEADLINE_S = 20.0
WAIT_DEADLINE_S = 0.5
CHECK_EVERY = 2000


class FuzzFailure(AssertionError):
    """A frame the broker did not handle as expected (the message describes the frame)."""


@dataclass
class Stats:
    sent: int = 0
    skipped: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    by_api: Counter[str] = field(default_factory=Counter)
    rss_samples: list[tuple[int, int]] = field(default_factory=list)
    failures: list[FuzzFailure] = field(default_factory=list)
    seconds: float = 0.0


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise FuzzFailure(f"no VmRSS for pid {pid}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1][0] != "Z"


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    if size < 4 or size > 256 * 1024 * 1024:
        raise FuzzFailure(f"the broker sent a frame of size {size}")
    return await reader.readexactly(size)


async def exchange(host: str, port: int, frame: Frame) -> str:
    """Send one frame; 'answered', 'closed' or 'silent' (nothing before the deadline)."""
    # Frames that may legitimately wait are given up on soon; an answer or a close that must
    # come gets as long as a loaded machine may need.
    waits = frame.expect in (Expect.ANSWER_OR_WAIT, Expect.NOTHING, Expect.ANYTHING)
    deadline = WAIT_DEADLINE_S if waits else ANSWER_DEADLINE_S
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(frame.data)
        try:
            await writer.drain()
        except ConnectionError:
            return "closed"
        try:
            async with asyncio.timeout(deadline):
                while True:
                    response = await _read_frame(reader)
                    (correlation_id,) = struct.unpack_from(">i", response)
                    if correlation_id != frame.correlation_id:
                        raise FuzzFailure(
                            f"answer to correlation id {correlation_id}\n{frame.describe()}"
                        )
                    _check_response(frame, response)
                    return "answered"
        except TimeoutError:
            return "silent"
        except (asyncio.IncompleteReadError, ConnectionError):
            return "closed"
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except ConnectionError:
            pass


def _check_response(frame: Frame, response: bytes) -> None:
    if frame.expect is Expect.ANYTHING:
        return
    from odradek.protocol.codec import ApiKey, parse_request_header

    header = parse_request_header(frame.data[4:])
    version = header.api_version
    if header.api_key == ApiKey.API_VERSIONS and frame.expect is Expect.ANSWER:
        from odradek.server.apis import SUPPORTED_VERSIONS

        low, high = SUPPORTED_VERSIONS[ApiKey.API_VERSIONS]
        if not low <= version <= high:
            version = 0  # KIP-511: the answer to an unknown version is a v0 response
    try:
        decode_response(header.api_key, version, response)
    except ProtocolError as e:
        raise FuzzFailure(f"a malformed answer ({e})\n{frame.describe()}") from None


ALLOWED = {
    Expect.CLOSED: {"closed"},
    Expect.ANSWER: {"answered"},
    Expect.ANSWER_OR_WAIT: {"answered", "silent"},
    Expect.NOTHING: {"silent"},
    Expect.ANYTHING: {"answered", "closed", "silent"},
}


async def run(
    host: str,
    port: int,
    pid: int,
    frames: int,
    make: Callable[[int], Frame | None],
    stats: Stats,
    start_index: int = 0,
) -> None:
    """Send frames start_index .. start_index + frames - 1 (skipping unsafe ones)."""
    next_index = start_index
    end = start_index + frames
    started = time.monotonic()
    failure: list[BaseException] = []
    keep_going = os.environ.get("ODRADEK_FUZZ_KEEP_GOING") == "1"  # to survey, not for CI

    async def worker() -> None:
        nonlocal next_index
        while not failure and next_index < end:
            index = next_index
            next_index += 1
            frame = make(index)
            if frame is None:
                stats.skipped += 1
                continue
            try:
                outcome = await exchange(host, port, frame)
            except FuzzFailure as e:
                failure.append(e)
                return
            except OSError as e:
                if not alive(pid):
                    failure.append(FuzzFailure(f"the broker died\n{frame.describe()}"))
                    return
                outcome = f"connect error {e.errno}"
                if frame.expect is not Expect.ANYTHING:
                    failure.append(FuzzFailure(f"{e}\n{frame.describe()}"))
                    return
            stats.sent += 1
            stats.outcomes[f"{frame.expect.name}:{outcome}"] += 1
            stats.by_api[f"{frame.api_key}"] += 1
            if outcome not in ALLOWED[frame.expect]:
                problem = FuzzFailure(f"outcome {outcome}\n{frame.describe()}")
                if keep_going:
                    stats.failures.append(problem)
                    continue
                failure.append(problem)
                return
            if stats.sent % CHECK_EVERY == 0:
                if not alive(pid):
                    failure.append(FuzzFailure(f"the broker died near\n{frame.describe()}"))
                    return
                stats.rss_samples.append((stats.sent, rss_bytes(pid)))

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    stats.seconds += time.monotonic() - started
    if failure:
        raise failure[0]
