"""A private network of Linux network namespaces for fault tests: partitions, slow and lossy links.

A `NetworkLab` is a set of *nodes* (a ZooKeeper server, a broker, the test's clients), each in its
own network namespace with one interface, `eth0`, holding one address in `SUBNET`. The other end
of every node's veth pair sits in the lab's hub namespace, on a bridge, so every node reaches
every other directly. Nothing else is connected: the hub has no address, no node has a default
route, and the namespace the test runs in (the machine's own) is not on the bridge at all, so no
packet from the lab can leave it and nothing outside can reach it. While any lab exists, the
machine's own namespace has a blackhole route for `SUBNET`, so that a client thread that forgot
to enter the lab fails at once instead of sending its packets to the default gateway. Code that talks to the lab
runs inside one of its nodes, either as a process (`exec_prefix`, i.e. `ip netns exec`) or as a
thread that `entered()` a node's namespace (setns(2) changes only the calling thread; threads
it starts afterwards inherit the namespace, which is how client libraries' own threads follow).

Faults, all undone by `heal()` and all gone with the namespaces at `close()`:

* `partition(a, b)`: nodes in `a` and nodes in `b` stop hearing each other (iptables DROP of the
  other side's source addresses on each node's INPUT, chain `ODRADEK-PARTITION`); with
  `one_way=True` only packets from `a` to `b` are dropped (as in Jepsen, TCP then cannot connect
  either way, but datagrams and packets already sent from `b` still arrive).
* `isolate(node, except_=...)`: `node` cut off from every other node but those named.
* `set_link(node, LinkProfile(...))`: delay, jitter, loss and reordering on both directions of
  the node's link (`odradek.testing.link_emulator`, since this kernel has no `tc netem`).
* `link_down(node)` / `link_up(node)`: the hub end of the node's veth goes down (a cable pulled);
  `flap(...)` alternates the two.

Names: every namespace is `odr<pid>-<node>` (the hub `odr<pid>-hub`), so `sweep_stale()` can
remove namespaces a killed test left behind (their pid is gone) without touching anyone else's.
`close()` runs from the context manager, an atexit hook and SIGTERM-safe paths alike.

Needs root (or CAP_NET_ADMIN/CAP_SYS_ADMIN), `ip` (iproute2) and `iptables` (Debian's package;
`./dev setup` installs it). Concurrency: a lab belongs to the thread that created it; `entered`
affects only the calling thread.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ipaddress
import itertools
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from odradek.errors import OperatorError
from odradek.testing.link_emulator import QUEUE_NUMBER, LinkProfile

SUBNET = ipaddress.IPv4Network("10.213.0.0/24")
PARTITION_CHAIN = "ODRADEK-PARTITION"
NETNS_DIR = Path("/var/run/netns")
CLONE_NEWNET = 0x40000000
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,15}$")
_COMMAND_TIMEOUT_S = 20.0

_libc = ctypes.CDLL(None, use_errno=True)
_LAB_NUMBERS = itertools.count(1)


def available() -> str | None:
    """None if labs can be built here, else why not (for a test's skip reason)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (./dev setup installs it)"
    return None


def _run(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S, check=False
    )
    if check and result.returncode != 0:
        raise OperatorError(f"{' '.join(command)}: {result.stderr.strip() or result.returncode}")
    return result


def _setns(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({path}): {os.strerror(errno)}")
    finally:
        os.close(fd)


@dataclass
class Node:
    name: str
    namespace: str
    address: str
    hub_interface: str
    emulator: subprocess.Popen[bytes] | None = None


@dataclass
class NetworkLab:
    """The lab (module docstring). Use as a context manager, or call `close()`."""

    prefix: str = field(default_factory=lambda: f"odr{os.getpid()}-{next(_LAB_NUMBERS)}")
    nodes: dict[str, Node] = field(default_factory=dict)
    _hub: str = ""
    _closed: bool = False
    _partitions: list[tuple[frozenset[str], frozenset[str]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        reason = available()
        if reason is not None:
            raise OperatorError(reason)
        self._hub = f"{self.prefix}-hub"
        # Belt and braces: should code in the machine's own namespace ever aim at a lab address
        # (a client thread that did not enter the lab), the packet must die here rather than
        # follow the default route off the machine.
        _run("ip", "route", "replace", "blackhole", str(SUBNET))
        _run("ip", "netns", "add", self._hub)
        atexit.register(self.close)
        try:
            _run("ip", "-n", self._hub, "link", "set", "lo", "up")
            _run("ip", "-n", self._hub, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self._hub, "link", "set", "br0", "up")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> NetworkLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- nodes --------------------------------------------------------------------------------

    def add_node(self, name: str) -> Node:
        """A new namespace `name` on the bridge with the next free address; returns it."""
        if not _NAME.match(name):
            raise OperatorError(f"node name {name!r}: lower-case letters, digits and '-' only")
        if name in self.nodes:
            return self.nodes[name]
        index = len(self.nodes) + 1
        hosts = list(SUBNET.hosts())
        if index >= len(hosts):
            raise OperatorError(f"no address left in {SUBNET}")
        namespace = f"{self.prefix}-{name}"
        node = Node(name, namespace, str(hosts[index]), f"h{index}")
        temporary = f"odrtmp{index}"
        _run("ip", "netns", "add", namespace)
        self.nodes[name] = node
        _run(
            "ip", "-n", self._hub, "link", "add", node.hub_interface, "type", "veth",
            "peer", "name", temporary, "netns", namespace,
        )  # fmt: skip
        _run("ip", "-n", namespace, "link", "set", temporary, "name", "eth0")
        _run(
            "ip",
            "-n",
            namespace,
            "addr",
            "add",
            f"{node.address}/{SUBNET.prefixlen}",
            "dev",
            "eth0",
        )
        for interface in ("lo", "eth0"):
            _run("ip", "-n", namespace, "link", "set", interface, "up")
        _run("ip", "-n", self._hub, "link", "set", node.hub_interface, "master", "br0")
        _run("ip", "-n", self._hub, "link", "set", node.hub_interface, "up")
        self._iptables(node, "-N", PARTITION_CHAIN)
        self._iptables(node, "-A", "INPUT", "-i", "eth0", "-j", PARTITION_CHAIN)
        return node

    def node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise OperatorError(f"no node {name!r} in the lab") from None

    def address(self, name: str) -> str:
        return self.node(name).address

    def exec_prefix(self, name: str) -> list[str]:
        """Put this before a command to run it inside the node (`ip netns exec` execs it, so the
        pid is the command's own)."""
        return ["ip", "netns", "exec", self.node(name).namespace]

    @contextlib.contextmanager
    def entered(self, name: str) -> Iterator[Node]:
        """Move the calling thread into the node's namespace for the block (threads it starts
        meanwhile stay there for good), then back to where it was."""
        node = self.node(name)
        previous = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            _setns(NETNS_DIR / node.namespace)
            try:
                yield node
            finally:
                if _libc.setns(previous, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns back to the original namespace")
        finally:
            os.close(previous)

    # -- faults -------------------------------------------------------------------------------

    def _iptables(self, node: Node, *arguments: str) -> None:
        _run("ip", "netns", "exec", node.namespace, "iptables", "-w", "5", *arguments)

    def partition(self, a: Iterable[str], b: Iterable[str], one_way: bool = False) -> None:
        """Drop packets from every node of `a` to every node of `b` (and back, unless
        `one_way`). Adds to partitions already in place."""
        side_a, side_b = frozenset(a), frozenset(b)
        if side_a & side_b:
            raise OperatorError(f"a node cannot be on both sides: {sorted(side_a & side_b)}")
        pairs = [(side_a, side_b)] if one_way else [(side_a, side_b), (side_b, side_a)]
        for senders, receivers in pairs:
            for receiver in sorted(receivers):
                for sender in sorted(senders):
                    self._iptables(
                        self.node(receiver), "-A", PARTITION_CHAIN,
                        "-s", self.address(sender), "-j", "DROP",
                    )  # fmt: skip
            self._partitions.append((senders, receivers))

    def isolate(self, name: str, except_: Iterable[str] = ()) -> None:
        """Cut `name` off from every node except `except_` (both ways)."""
        others = set(self.nodes) - {name} - set(except_)
        if others:
            self.partition([name], others)

    def heal(self) -> None:
        """Remove every partition, restore every link (profiles and downed links)."""
        for node in self.nodes.values():
            self._iptables(node, "-F", PARTITION_CHAIN)
            self.set_link(node.name, None)
            self.link_up(node.name)
        self._partitions.clear()

    @property
    def partitions(self) -> list[tuple[frozenset[str], frozenset[str]]]:
        """(senders, receivers) of every one-way cut in place."""
        return list(self._partitions)

    def set_link(self, name: str, profile: LinkProfile | None, seed: int = 0) -> None:
        """Give the node's link `profile` (both directions), or a perfect link with None."""
        node = self.node(name)
        if node.emulator is not None:
            node.emulator.terminate()
            try:
                node.emulator.wait(10)
            except subprocess.TimeoutExpired:
                node.emulator.kill()
                node.emulator.wait()
            node.emulator = None
            for hook in ("INPUT", "OUTPUT"):
                self._iptables(node, "-D", hook, *_queue_rule(hook))
        if profile is None:
            return
        # Not `python -m`: this package imports the module already, and runpy would warn.
        command = [
            *self.exec_prefix(name), sys.executable, "-c",
            "import sys; from odradek.testing.link_emulator import main; sys.exit(main())",
            f"--queue={QUEUE_NUMBER}", f"--seed={seed}", *profile.arguments(),
        ]  # fmt: skip
        emulator = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        assert emulator.stdout is not None
        line = emulator.stdout.readline().decode(errors="replace")
        if "bound to queue" not in line:
            emulator.kill()
            emulator.wait()
            raise OperatorError(f"the link emulator of {name} did not start: {line.strip()}")
        node.emulator = emulator
        # Queue only once the emulator listens (with --queue-bypass nothing is held before).
        for hook in ("INPUT", "OUTPUT"):
            self._iptables(node, "-A", hook, *_queue_rule(hook))

    def link_down(self, name: str) -> None:
        _run("ip", "-n", self._hub, "link", "set", self.node(name).hub_interface, "down")

    def link_up(self, name: str) -> None:
        _run("ip", "-n", self._hub, "link", "set", self.node(name).hub_interface, "up")

    def flap(self, name: str, times: int, down_s: float, up_s: float) -> None:
        """Take the node's link down and up again `times` times (blocks for the whole flapping)."""
        for _ in range(times):
            self.link_down(name)
            time.sleep(down_s)
            self.link_up(name)
            time.sleep(up_s)

    # -- the end ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the emulators and delete every namespace of the lab (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        for node in self.nodes.values():
            if node.emulator is not None:
                node.emulator.kill()
                node.emulator.wait()
                node.emulator = None
        for namespace in [n.namespace for n in self.nodes.values()] + [self._hub]:
            _delete_namespace(namespace)
        if not lab_namespaces():  # the last lab on this machine: the blackhole route goes too
            _run("ip", "route", "del", "blackhole", str(SUBNET), check=False)


def _queue_rule(hook: str) -> list[str]:
    interface = "-i" if hook == "INPUT" else "-o"
    return [
        interface, "eth0", "-j", "NFQUEUE", "--queue-num", str(QUEUE_NUMBER), "--queue-bypass",
    ]  # fmt: skip


def _delete_namespace(namespace: str) -> None:
    """Kill what still runs in the namespace (a process left there would keep it alive without
    its name), then delete it."""
    pids = _run("ip", "netns", "pids", namespace, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)
    _run("ip", "netns", "del", namespace, check=False)


def lab_namespaces() -> list[str]:
    """Every namespace named like a lab's (`odr<pid>-...`) on this machine."""
    listing = _run("ip", "netns", "list", check=False).stdout
    return [
        line.split()[0]
        for line in listing.splitlines()
        if line.strip() and re.match(r"^odr\d+-", line.split()[0])
    ]


def sweep_stale() -> list[str]:
    """Delete the namespaces of labs whose process is gone (a test killed before its clean-up);
    returns their names."""
    removed = []
    for namespace in lab_namespaces():
        pid = int(re.match(r"^odr(\d+)-", namespace).group(1))  # type: ignore[union-attr]
        if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            _delete_namespace(namespace)
            removed.append(namespace)
    return removed
