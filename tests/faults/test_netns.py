"""The network lab itself (`odradek.testing.netns`): nodes reach each other, partitions cut what
they say (symmetric and one-way) and heal, the link emulator delays, the machine's own namespace
has no route into the lab, and nothing is left behind. Needs root, `ip` and `iptables`."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from odradek.testing.link_emulator import LinkProfile
from odradek.testing.netns import SUBNET, NetworkLab, available, lab_namespaces

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))


@pytest.fixture
def lab() -> Iterator[NetworkLab]:
    with NetworkLab() as network:
        yield network


def _echo_server(lab: NetworkLab, node: str, port: int) -> socket.socket:
    with lab.entered(node):
        server = socket.create_server((lab.address(node), port))

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            with connection:
                while data := connection.recv(64):
                    connection.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server


def _round_trip_s(
    lab: NetworkLab, source: str, target: str, port: int, timeout: float = 1.0
) -> float:
    """One TCP connect plus one echoed byte, from inside `source`."""
    with lab.entered(source):
        began = time.monotonic()
        with socket.create_connection((lab.address(target), port), timeout=timeout) as sock:
            sock.sendall(b"x")
            assert sock.recv(1) == b"x"
        return time.monotonic() - began


def test_partitions_cut_and_heal(lab: NetworkLab) -> None:
    for name in ("a", "b", "c"):
        lab.add_node(name)
    servers = [_echo_server(lab, name, 9000) for name in ("a", "b", "c")]
    try:
        _round_trip_s(lab, "a", "b", 9000, timeout=5)
        lab.partition(["a"], ["b"])
        with pytest.raises(OSError):
            _round_trip_s(lab, "a", "b", 9000)
        with pytest.raises(OSError):
            _round_trip_s(lab, "b", "a", 9000)
        _round_trip_s(lab, "a", "c", 9000, timeout=5)  # only the named pair is cut
        lab.heal()
        _round_trip_s(lab, "b", "a", 9000, timeout=5)

        # One way: a's packets never reach b; b reaches c, and c reaches a, as before.
        lab.partition(["a"], ["b"], one_way=True)
        assert lab.partitions == [(frozenset({"a"}), frozenset({"b"}))]
        with pytest.raises(OSError):
            _round_trip_s(lab, "a", "b", 9000)
        _round_trip_s(lab, "c", "a", 9000, timeout=5)
        lab.heal()

        lab.isolate("c", except_=["a"])
        _round_trip_s(lab, "a", "c", 9000, timeout=5)
        with pytest.raises(OSError):
            _round_trip_s(lab, "b", "c", 9000)
        lab.heal()
    finally:
        for server in servers:
            server.close()


def test_link_profile_delays_both_directions_and_heals(lab: NetworkLab) -> None:
    lab.add_node("a")
    lab.add_node("b")
    server = _echo_server(lab, "a", 9000)
    try:
        lab.set_link("a", LinkProfile(delay_ms=60))
        # The handshake and the echo are two round trips: 4 x 60 ms at least.
        assert _round_trip_s(lab, "b", "a", 9000, timeout=5) >= 0.24
        assert lab.node("a").emulator is not None
        lab.heal()
        # Healed: the emulator and its queue rules are gone and the echo answers (how fast is
        # not asserted: on a loaded machine a plain round trip can take 100 ms too).
        assert lab.node("a").emulator is None
        _round_trip_s(lab, "b", "a", 9000, timeout=5)
        lab.link_down("a")
        with pytest.raises(OSError):
            _round_trip_s(lab, "b", "a", 9000, timeout=0.5)
        lab.link_up("a")
        _round_trip_s(lab, "b", "a", 9000, timeout=5)
    finally:
        server.close()


def test_the_machine_has_no_route_into_the_lab_and_nothing_is_left() -> None:
    with NetworkLab() as lab:
        lab.add_node("a")
        namespaces = {n.namespace for n in lab.nodes.values()} | {f"{lab.prefix}-hub"}
        assert namespaces <= set(lab_namespaces())
        # The kernel refuses the route (blackhole): no packet could leave by the default route.
        route = subprocess.run(
            ["ip", "route", "get", str(next(SUBNET.hosts()))], capture_output=True, text=True
        )
        assert route.returncode != 0, route.stdout
    assert not set(lab_namespaces()) & namespaces
