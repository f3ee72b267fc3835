"""The processes of a local cluster (brokers, the private ZooKeeper): their state and signals.

Each child runs in its own session (process group: `LocalCluster` starts it with
`start_new_session`), so a Ctrl-C in the terminal that ran `odradek cluster up` does not reach it,
and signals from here go to its whole group. A child started by this process is reaped by it (no
zombies); a child named only by a pid in cluster.json (another `odradek cluster` invocation
started it) is recognised by its command line in /proc, so that a recycled pid is never signalled.

Concurrency: a `ClusterProcess` belongs to the thread of the `LocalCluster` that holds it; `wait`
and `kill` block.
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from odradek.errors import OperatorError


class ProcessState(enum.Enum):
    RUNNING = "running"
    STOPPED = "stopped"  # SIGSTOP: alive, holding its ports and ZooKeeper session, doing nothing
    DEAD = "dead"


def _proc_state(pid: int) -> str | None:
    """The one-letter state of `pid` from /proc (R, S, T, Z, ...); None if no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return "?"
    # The command name in parentheses may itself contain spaces and parentheses.
    return stat.rpartition(")")[2].split()[0]


class ClusterProcess:
    """A process of the cluster: a child this process started (`popen`), or one known only by the
    pid recorded in cluster.json, identified by `marker` (a string its command line contains)."""

    def __init__(self, pid: int, marker: str, popen: subprocess.Popen[bytes] | None = None) -> None:
        self.pid = pid
        self.marker = marker
        self.popen = popen

    def _is_ours(self) -> bool:
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except FileNotFoundError:
            return False
        except OSError:  # no /proc here: trust the pid
            return _pid_exists(self.pid)
        return self.marker.encode() in cmdline

    def state(self) -> ProcessState:
        if self.popen is not None:
            if self.popen.poll() is not None:
                return ProcessState.DEAD
        else:
            self._reap()
            if not self._is_ours():
                return ProcessState.DEAD
        letter = _proc_state(self.pid)
        if letter is None or letter in "ZXx":
            return ProcessState.DEAD
        return ProcessState.STOPPED if letter in "Tt" else ProcessState.RUNNING

    @property
    def alive(self) -> bool:
        return self.state() is not ProcessState.DEAD

    def _reap(self) -> None:
        # A pid from cluster.json may still be our child (loaded in the process that started it):
        # reap it if it has exited; for anyone else's child this is a harmless ChildProcessError.
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(self.pid, os.WNOHANG)

    def signal(self, signum: int) -> bool:
        """Send `signum` to the process group; False if the process is not alive."""
        if not self.alive:
            return False
        try:
            os.killpg(self.pid, signum)  # the child leads its own group (start_new_session)
        except ProcessLookupError:
            return False
        except PermissionError:
            os.kill(self.pid, signum)
        return True

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the process to exit (and reap it); True if it did."""
        if self.popen is not None:
            try:
                self.popen.wait(max(0.0, timeout))
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + timeout
        while self.alive:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def kill(self) -> None:
        """SIGKILL and wait until gone; a stopped process dies too (SIGKILL needs no SIGCONT)."""
        self.signal(signal.SIGKILL)
        if not self.wait(30.0):
            raise OperatorError(f"process {self.pid} survived SIGKILL for 30s")


def request_exit(process: ClusterProcess) -> None:
    """SIGTERM (a broker's controlled shutdown), then SIGCONT: a broker frozen by SIGSTOP would
    otherwise never see the SIGTERM. Does not wait."""
    process.signal(signal.SIGTERM)
    process.signal(signal.SIGCONT)


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def free_ports(count: int, host: str) -> list[int]:
    """`count` distinct ports on `host` that nothing listens on now (all sockets held open while
    choosing, so the kernel does not hand out the same port twice)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for sock in sockets:
            sock.close()
