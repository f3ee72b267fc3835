"""Latency, jitter, loss and reordering on a network namespace's link, in user space.

`tc netem` is what one would use, but this machine's kernel (and CI's, the same kind) is built
without `sch_netem`, and without most other qdiscs. It does have netfilter's packet queue
(`CONFIG_NETFILTER_NETLINK_QUEUE`) and iptables' NFQUEUE target, so the link is emulated the way
user-space firewalls hold packets: iptables hands every packet leaving or entering the
namespace's `eth0` to queue `QUEUE_NUMBER`, and this program, running inside the namespace
(`ip netns exec NS python -m odradek.testing.link_emulator ...`), decides each packet's fate and
gives the kernel its verdict when the packet's time has come:

* delay: `delay_ms` plus a uniform random amount in [-jitter_ms, +jitter_ms] (never below zero);
  packets whose delays differ leave in a different order, as with netem's jitter;
* loss: dropped with probability `loss_percent` / 100;
* reordering: with probability `reorder_percent` / 100 a packet is let through at once, ahead of
  the delayed ones (netem's `reorder`).

Both directions are delayed (the INPUT and OUTPUT hooks), so a 100 ms delay is a 200 ms round
trip. The rules use `--queue-bypass`: while no emulator is bound to the queue the kernel lets
packets through, so killing the emulator restores the plain link rather than cutting it.

The netlink messages (nfnetlink_queue, linux/netfilter/nfnetlink_queue.h), all built here:

* every message: `nlmsghdr` (u32 length, u16 type, u16 flags, u32 sequence, u32 port id, host
  byte order) then `nfgenmsg` (u8 family, u8 version, u16 queue number, big-endian), then
  attributes, each `nlattr` (u16 length, u16 type) padded to 4 bytes;
* type = (NFNL_SUBSYS_QUEUE = 3) << 8 | message: CONFIG (2) to bind the queue (attribute
  CFG_CMD: u8 command BIND = 1, u8 pad, u16 protocol family) and set the copy mode (attribute
  CFG_PARAMS: u32 copy range, u8 mode; META = 1, no payload is copied, only the packet id is
  needed), PACKET (0) from the kernel (attribute PACKET_HDR: u32 packet id, u16 protocol, u8
  hook), VERDICT (1) to the kernel (attribute VERDICT_HDR: u32 verdict, u32 packet id; DROP = 0,
  ACCEPT = 1, both big-endian).

Runs until SIGTERM; it holds no state a crash could leave behind.
"""

from __future__ import annotations

import argparse
import heapq
import random
import select
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass
from types import FrameType

QUEUE_NUMBER = 7
NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NF_DROP = 0
NF_ACCEPT = 1
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
QUEUE_MAX_LENGTH = 65536

_NLMSGHDR = struct.Struct("=IHHII")
_NFGENMSG = struct.Struct("=BBH")  # the queue number is packed big-endian by hand
_NLATTR = struct.Struct("=HH")
_VERDICT = struct.Struct(">II")
_PACKET_ID = struct.Struct(">I")


@dataclass(frozen=True)
class LinkProfile:
    """What a link does to each packet (module docstring); all zero is a perfect link."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_percent: float = 0.0
    reorder_percent: float = 0.0

    def arguments(self) -> list[str]:
        return [
            f"--delay-ms={self.delay_ms:g}",
            f"--jitter-ms={self.jitter_ms:g}",
            f"--loss-percent={self.loss_percent:g}",
            f"--reorder-percent={self.reorder_percent:g}",
        ]


def decide(profile: LinkProfile, rng: random.Random) -> float | None:
    """Seconds to hold one packet, or None to drop it. Pure, for the tests."""
    if profile.loss_percent > 0 and rng.random() * 100 < profile.loss_percent:
        return None
    if profile.reorder_percent > 0 and rng.random() * 100 < profile.reorder_percent:
        return 0.0
    delay = profile.delay_ms
    if profile.jitter_ms > 0:
        delay += rng.uniform(-profile.jitter_ms, profile.jitter_ms)
    return max(0.0, delay) / 1000.0


def _attribute(kind: int, payload: bytes) -> bytes:
    length = _NLATTR.size + len(payload)
    return _NLATTR.pack(length, kind) + payload + b"\0" * (-length % 4)


def _message(kind: int, queue: int, attributes: bytes, sequence: int = 0) -> bytes:
    body = _NFGENMSG.pack(socket.AF_UNSPEC, 0, 0)[:2] + struct.pack(">H", queue) + attributes
    header = _NLMSGHDR.pack(
        _NLMSGHDR.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, NLM_F_REQUEST, sequence, 0
    )
    return header + body


def config_messages(queue: int) -> list[bytes]:
    """Bind `queue` for IPv4 and ask for packet ids only."""
    return [
        _message(
            NFQNL_MSG_CONFIG,
            queue,
            _attribute(NFQA_CFG_CMD, struct.pack(">BBH", NFQNL_CFG_CMD_BIND, 0, socket.AF_INET)),
            1,
        ),
        _message(
            NFQNL_MSG_CONFIG,
            queue,
            _attribute(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META))
            + _attribute(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", QUEUE_MAX_LENGTH)),
            2,
        ),
    ]


def verdict_message(queue: int, packet_id: int, verdict: int) -> bytes:
    return _message(
        NFQNL_MSG_VERDICT, queue, _attribute(NFQA_VERDICT_HDR, _VERDICT.pack(verdict, packet_id))
    )


def packet_ids(data: bytes) -> list[int]:
    """The packet ids of every PACKET message in one netlink read; raises OSError on a netlink
    error answer (a refused configuration)."""
    ids = []
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _flags, _sequence, _port = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size:
            break
        if kind == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", data, offset + _NLMSGHDR.size)
            if code != 0:
                raise OSError(-code, f"nfnetlink_queue refused a request: errno {-code}")
        elif kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            position = offset + _NLMSGHDR.size + _NFGENMSG.size
            end = offset + length
            while position + _NLATTR.size <= end:
                attr_length, attr_type = _NLATTR.unpack_from(data, position)
                if attr_length < _NLATTR.size:
                    break
                if attr_type & 0x3FFF == NFQA_PACKET_HDR:
                    ids.append(_PACKET_ID.unpack_from(data, position + _NLATTR.size)[0])
                    break
                position += (attr_length + 3) & ~3
        offset += (length + 3) & ~3
    return ids


def run(profile: LinkProfile, queue: int, seed: int) -> int:
    rng = random.Random(seed)
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((0, 0))
    for message in config_messages(queue):
        sock.send(message)
    print(f"link emulator bound to queue {queue}: {profile}", flush=True)
    held: list[tuple[float, int, int]] = []  # (release time, arrival order, packet id)
    arrivals = 0
    errors = 0
    while not stopping:
        now = time.monotonic()
        while held and held[0][0] <= now:
            _release, _order, packet_id = heapq.heappop(held)
            sock.send(verdict_message(queue, packet_id, NF_ACCEPT))
        wait = max(0.0, held[0][0] - now) if held else 0.5
        try:
            readable, _, _ = select.select([sock], [], [], wait)
        except InterruptedError:
            continue
        if not readable:
            continue
        try:
            data = sock.recv(1 << 16)
        except InterruptedError:
            continue
        except OSError as e:  # ENOBUFS: the kernel dropped messages; those packets time out
            errors += 1
            if errors <= 10:  # the parent reads only the first line: never fill the pipe
                print(f"link emulator: {e}", file=sys.stderr, flush=True)
            continue
        now = time.monotonic()
        for packet_id in packet_ids(data):
            hold = decide(profile, rng)
            if hold is None:
                sock.send(verdict_message(queue, packet_id, NF_DROP))
            elif hold == 0.0:
                sock.send(verdict_message(queue, packet_id, NF_ACCEPT))
            else:
                arrivals += 1
                heapq.heappush(held, (now + hold, arrivals, packet_id))
    for _release, _order, packet_id in held:  # let what is held go: nothing is lost on exit
        sock.send(verdict_message(queue, packet_id, NF_ACCEPT))
    sock.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="link_emulator", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--queue", type=int, default=QUEUE_NUMBER)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--loss-percent", type=float, default=0.0)
    parser.add_argument("--reorder-percent", type=float, default=0.0)
    args = parser.parse_args(argv)
    profile = LinkProfile(args.delay_ms, args.jitter_ms, args.loss_percent, args.reorder_percent)
    return run(profile, args.queue, args.seed)


if __name__ == "__main__":
    sys.exit(main())
