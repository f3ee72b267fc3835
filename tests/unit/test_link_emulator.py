"""The user-space link emulator's pure parts: what it decides for each packet and the netlink
messages it reads and writes (nfnetlink_queue's layout)."""

from __future__ import annotations

import random
import socket
import struct

from odradek.testing.link_emulator import (
    NFNL_SUBSYS_QUEUE,
    NFQNL_MSG_PACKET,
    LinkProfile,
    config_messages,
    decide,
    packet_ids,
    verdict_message,
)


def test_a_perfect_link_holds_nothing() -> None:
    rng = random.Random(1)
    assert {decide(LinkProfile(), rng) for _ in range(100)} == {0.0}


def test_delay_and_jitter_stay_within_bounds() -> None:
    rng = random.Random(2)
    holds = [decide(LinkProfile(delay_ms=200, jitter_ms=20), rng) for _ in range(2000)]
    assert all(h is not None and 0.18 <= h <= 0.22 for h in holds)
    assert max(holds) - min(holds) > 0.03  # type: ignore[operator]


def test_loss_and_reordering_rates_follow_the_profile() -> None:
    rng = random.Random(3)
    profile = LinkProfile(delay_ms=100, loss_percent=5, reorder_percent=10)
    holds = [decide(profile, rng) for _ in range(20_000)]
    lost = sum(h is None for h in holds) / len(holds)
    immediate = sum(h == 0.0 for h in holds) / len(holds)
    assert 0.04 < lost < 0.06
    assert 0.08 < immediate < 0.11


def _packet_message(packet_id: int) -> bytes:
    header_attr = struct.pack("=HH", 4 + 7, 1) + struct.pack(">IHB", packet_id, 0x0800, 3) + b"\0"
    body = struct.pack("=BBH", socket.AF_INET, 0, 0) + header_attr
    return (
        struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET, 0, 0, 0)
        + body
    )


def test_packet_ids_are_read_from_every_message_of_a_read() -> None:
    data = _packet_message(7) + _packet_message(4_000_000_000)
    assert packet_ids(data) == [7, 4_000_000_000]


def test_a_netlink_error_answer_raises() -> None:
    error = struct.pack("=IHHII", 36, 2, 0, 1, 0) + struct.pack("=i", -1) + b"\0" * 16
    try:
        packet_ids(error)
    except OSError as e:
        assert e.errno == 1
    else:
        raise AssertionError("no error raised")


def test_messages_have_the_kernel_layout() -> None:
    verdict = verdict_message(7, 99, 1)
    length, kind, flags, _, _ = struct.unpack_from("=IHHII", verdict)
    assert length == len(verdict) == 16 + 4 + 4 + 8
    assert kind == (NFNL_SUBSYS_QUEUE << 8) | 1 and flags == 1
    assert struct.unpack_from(">H", verdict, 18)[0] == 7  # the queue number, big-endian
    assert struct.unpack_from(">II", verdict, 24) == (1, 99)
    bind, params = config_messages(7)
    assert struct.unpack_from("=HH", bind, 20) == (8, 1)
    assert struct.unpack_from(">BBH", bind, 24) == (1, 0, socket.AF_INET)
    assert len(params) % 4 == 0
