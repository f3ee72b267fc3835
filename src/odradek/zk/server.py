"""A private standalone ZooKeeper server, run from the installed jars as a child JVM.

This is what `odradek zookeeper`, `odradek cluster up` and the integration tests use: real Apache
ZooKeeper (Debian's `zookeeper` package puts the jars in /usr/share/java), never a fake. Production
clusters point `zookeeper.connect` at their own ensemble instead.

Files, all inside `data_dir`:

* `zoo.cfg` -- written on every start, a Java properties file: the client port bound to
  127.0.0.1 only, `dataDir` (the snapshots and transaction logs under `version-2/`), a short
  tick (500 ms, so session expiry tests run quickly) with a maximum session timeout of 120 s (the
  maximum defaults to 20 ticks, which would silently cap Kafka's 18 s default), no connection cap
  per client address (a local cluster opens many from 127.0.0.1), the AdminServer off (it would
  bind port 8080), and the four-letter words srvr/ruok/stat/mntr allowed.
* the server's output (stdout and stderr, WARN and above through slf4j-simple) goes to
  `log_file`, by default `data_dir/zookeeper.log`.

Readiness: `start()` returns only once `srvr` answers with a `Mode:` line. `ruok` answers "imok"
as soon as the socket listens, before the database is loaded, so it is not used for readiness.

Concurrency: a `ZooKeeperServer` belongs to the thread that created it; its methods block (they
wait on sockets and the child process), so asyncio code calls them through `asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from odradek.errors import OperatorError

DEFAULT_JAR_DIRS: tuple[Path, ...] = (Path("/usr/share/java"),)
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

# Jars ZooKeeper 3.8's standalone server cannot start without.
_REQUIRED_JARS = ("zookeeper", "zookeeper-jute", "slf4j-api")
# Jars it loads for optional features (Netty connection factory, metrics, snapshot compression,
# command-line parsing); added when present.
_OPTIONAL_JARS = (
    "netty-buffer",
    "netty-codec",
    "netty-common",
    "netty-handler",
    "netty-resolver",
    "netty-transport",
    "netty-transport-native-epoll",
    "netty-transport-native-unix-common",
    "metrics-core",
    "snappy-java",
    "commons-cli",
    "commons-io",
)
# One slf4j binding, in order of preference: slf4j-simple prints WARN+ to stderr (the log file);
# slf4j-nop discards everything; log4j 1.2 is what Debian's own scripts use.
_LOGGING_BINDINGS: tuple[tuple[str, ...], ...] = (
    ("slf4j-simple",),
    ("slf4j-nop",),
    ("slf4j-log4j12", "log4j-1.2"),
)

_JVM_OPTIONS = (
    "-Xms32m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    # C1 only: a short-lived test server starts noticeably faster and never needs C2's peak speed.
    "-XX:TieredStopAtLevel=1",
    "-Djava.awt.headless=true",
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd HH:mm:ss,SSS",
    "-Dzookeeper.jmx.log4j.disable=true",
    "-Dlog4j.rootLogger=WARN,CONSOLE",
    "-Dzookeeper.root.logger=WARN,CONSOLE",
)

_POLL_INTERVAL_S = 0.05


def find_jar(name: str, jar_dirs: Iterable[Path]) -> Path | None:
    """The jar called `name` in the first directory that has it.

    Prefers the unversioned name Debian installs as a symlink (`zookeeper.jar`), else the
    highest-sorting versioned file (`zookeeper-3.8.0.jar`). A versioned match must continue with a
    digit, so that `zookeeper` does not pick up `zookeeper-jute-3.8.0.jar`.
    """
    for directory in jar_dirs:
        exact = directory / f"{name}.jar"
        if exact.is_file():
            return exact
        versioned = sorted(
            p
            for p in directory.glob(f"{name}-*.jar")
            if p.name[len(name) + 1 : len(name) + 2].isdigit()
        )
        if versioned:
            return versioned[-1]
    return None


def jar_directories() -> tuple[Path, ...]:
    """Where to look for jars: $ODRADEK_ZOOKEEPER_JARS (a path list), $ZOOKEEPER_HOME/lib and
    $ZOOKEEPER_HOME (a tarball install), then /usr/share/java."""
    dirs: list[Path] = []
    override = os.environ.get("ODRADEK_ZOOKEEPER_JARS")
    if override:
        dirs.extend(Path(p) for p in override.split(os.pathsep) if p)
    home = os.environ.get("ZOOKEEPER_HOME")
    if home:
        dirs.extend((Path(home) / "lib", Path(home)))
    dirs.extend(DEFAULT_JAR_DIRS)
    return tuple(dirs)


def find_classpath(jar_dirs: Sequence[Path] | None = None) -> list[Path]:
    """The classpath of a standalone ZooKeeper 3.8 server; OperatorError if a required jar is
    missing."""
    dirs = tuple(jar_dirs) if jar_dirs is not None else jar_directories()
    classpath: list[Path] = []
    for name in _REQUIRED_JARS:
        jar = find_jar(name, dirs)
        if jar is None:
            searched = ", ".join(str(d) for d in dirs)
            raise OperatorError(
                f"ZooKeeper jar {name}.jar not found in {searched}: install the 'zookeeper' "
                f"package (apt-get install zookeeper) or set ODRADEK_ZOOKEEPER_JARS"
            )
        classpath.append(jar)
    for name in _OPTIONAL_JARS:
        jar = find_jar(name, dirs)
        if jar is not None:
            classpath.append(jar)
    for binding in _LOGGING_BINDINGS:
        jars = [find_jar(name, dirs) for name in binding]
        if all(jars):
            classpath.extend(j for j in jars if j is not None)
            break
    return classpath


def find_java() -> Path:
    """$JAVA_HOME/bin/java, else `java` on PATH; OperatorError if neither exists."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return Path(java_home) / "bin" / "java"
    found = shutil.which("java")
    if found is None:
        raise OperatorError(
            "java not found: install a Java runtime (apt-get install default-jre-headless) "
            "or set JAVA_HOME"
        )
    return Path(found)


def four_letter_word(host: str, port: int, command: str, timeout: float = 2.0) -> str:
    """Send a ZooKeeper four-letter command and return the whole answer (the server closes the
    connection when done). Raises OSError if nothing listens or the server hangs up early."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(command.encode("ascii"))
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def server_mode(host: str, port: int, timeout: float = 2.0) -> str | None:
    """The `Mode:` of the server at host:port (standalone, leader, follower), or None if it is not
    serving yet (not listening, or listening but still loading its database)."""
    try:
        answer = four_letter_word(host, port, "srvr", timeout)
    except OSError:
        return None
    for line in answer.splitlines():
        if line.startswith("Mode:"):
            return line.partition(":")[2].strip()
    return None


def wait_for_mode(host: str, port: int, timeout: float) -> str:
    """Block until the server at host:port reports a `Mode:`; return it.

    OperatorError when the deadline passes, naming the address.
    """
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        mode = server_mode(host, port, timeout=max(0.1, min(2.0, remaining)))
        if mode is not None:
            return mode
        if time.monotonic() >= deadline:
            raise OperatorError(f"ZooKeeper at {host}:{port} not serving after {timeout:g}s")
        time.sleep(_POLL_INTERVAL_S)


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if a server could bind host:port now. SO_REUSEADDR as ZooKeeper sets it, so that
    sockets in TIME_WAIT from a previous run on the same port do not count as "in use"."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class QuorumPeer:
    """One member of an ensemble as every member's `zoo.cfg` names it (`server.ID=host:quorum
    port:election port`): followers talk to the leader on the quorum port, elections use the
    election port."""

    id: int
    host: str
    client_port: int
    quorum_port: int
    election_port: int

    @property
    def connect(self) -> str:
        return f"{self.host}:{self.client_port}"


class ZooKeeperServer:
    """One ZooKeeper server in a child process (its own process group): standalone, or one
    member of an ensemble when `ensemble` lists every member (this one is `server_id`; its
    `myid` file is written beside `zoo.cfg` and it runs QuorumPeerMain).

    `host` is the address it binds (127.0.0.1 unless it runs in a network namespace of
    `odradek.testing.netns`, whose `ip netns exec` prefix is `command_prefix`).

    Lifecycle: `start()` -> serving -> `stop()` (or `kill()` for a crash); it may be started again
    on the same port and data directory, which keeps its znodes and live sessions (a restart).
    Not thread-safe: one owner thread.
    """

    def __init__(
        self,
        port: int,
        data_dir: Path,
        log_file: Path | None = None,
        *,
        tick_time_ms: int = 500,
        max_session_timeout_ms: int = 120_000,
        fsync: bool = True,
        jar_dirs: Sequence[Path] | None = None,
        host: str = "127.0.0.1",
        server_id: int | None = None,
        ensemble: Sequence[QuorumPeer] = (),
        command_prefix: Sequence[str] = (),
    ) -> None:
        self.port = port
        self.host = host
        self.server_id = server_id
        self.ensemble = tuple(ensemble)
        self.command_prefix = tuple(command_prefix)
        self.data_dir = Path(data_dir)
        self.log_file = Path(log_file) if log_file is not None else self.data_dir / "zookeeper.log"
        self.tick_time_ms = tick_time_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        # fsync=False (forceSync=no) skips the fsync per transaction: fine for throw-away test
        # servers, where it makes large batches much faster; never for data you want to keep.
        self.fsync = fsync
        self._jar_dirs = jar_dirs
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def connect_string(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def config_file(self) -> Path:
        return self.data_dir / "zoo.cfg"

    def write_config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            f"tickTime={self.tick_time_ms}",
            f"dataDir={self.data_dir.resolve()}",
            f"clientPortAddress={self.host}",
            f"clientPort={self.port}",
            f"maxSessionTimeout={self.max_session_timeout_ms}",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            "4lw.commands.whitelist=srvr,ruok,stat,mntr",
            f"forceSync={'yes' if self.fsync else 'no'}",
            "autopurge.snapRetainCount=3",
            "autopurge.purgeInterval=1",
        ]
        if self.ensemble:
            # initLimit/syncLimit in ticks: a follower has 5 s to sync and is dropped by the
            # leader after 2.5 s without an answer (the defaults Kafka's docs suggest, scaled to
            # this short tick).
            lines += ["initLimit=10", "syncLimit=5", "standaloneEnabled=false"]
            lines += [
                f"server.{p.id}={p.host}:{p.quorum_port}:{p.election_port}" for p in self.ensemble
            ]
            (self.data_dir / "myid").write_text(f"{self.server_id}\n")
        self.config_file.write_text("\n".join(lines) + "\n")
        return self.config_file

    def command(self) -> list[str]:
        classpath = os.pathsep.join(str(p) for p in find_classpath(self._jar_dirs))
        java = find_java()
        main = QUORUM_MAIN_CLASS if self.ensemble else MAIN_CLASS
        return [
            *self.command_prefix,
            str(java),
            *_JVM_OPTIONS,
            "-cp",
            classpath,
            main,
            str(self.config_file),
        ]

    def start(self, timeout: float = 30.0, wait: bool = True) -> None:
        """Start the server and return once it serves; OperatorError (one line) otherwise.

        Checks, in order: java and jars exist, the port is free (else `srvr` could be answered by
        someone else's server), the child stays alive, and `srvr` reports a mode before `timeout`.
        Without `wait` it returns once the process runs: a member of an ensemble serves only
        once a quorum of members runs, so an ensemble starts them all before waiting.
        """
        if self.is_running:
            return
        command = self.command()
        # In a namespace of its own the address is not this namespace's to test.
        if not self.command_prefix and not port_is_free(self.port, self.host):
            raise OperatorError(f"ZooKeeper port {self.port} is in use on {self.host}")
        self.write_config()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,  # own process group: signals to us don't reach it
            )
        if wait:
            self.wait_until_serving(timeout)

    def wait_until_serving(self, timeout: float = 30.0) -> None:
        """Block until `srvr` reports a mode; OperatorError if the child exits or time runs out."""
        if self._process is None:
            raise OperatorError(f"ZooKeeper on {self.connect_string} is not running")
        deadline = time.monotonic() + timeout
        while True:
            exit_code = self._process.poll()
            if exit_code is not None:
                self._process = None
                raise OperatorError(self._startup_failure(exit_code))
            if server_mode(self.host, self.port, timeout=1.0) is not None:
                return
            if time.monotonic() >= deadline:
                self.kill()
                raise OperatorError(
                    f"ZooKeeper on {self.connect_string} not serving after {timeout:g}s "
                    f"(see {self.log_file})"
                )
            time.sleep(_POLL_INTERVAL_S)

    def _startup_failure(self, exit_code: int) -> str:
        tail = _last_lines(self.log_file, 40)
        if "Address already in use" in tail or "BindException" in tail:
            return f"ZooKeeper port {self.port} is in use on 127.0.0.1"
        last = next((line for line in reversed(tail.splitlines()) if line.strip()), "")
        return f"ZooKeeper exited with code {exit_code} during start-up (see {self.log_file})" + (
            f": {last.strip()[:200]}" if last else ""
        )

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the server's process group, SIGKILL it if still alive after `timeout`, wait."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            _signal_group(process, signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        self._process = None

    def pause(self) -> None:
        """SIGSTOP: the server freezes with its sockets open (a long GC pause, a hung disk)."""
        if self._process is not None:
            _signal_group(self._process, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after `pause`."""
        if self._process is not None:
            _signal_group(self._process, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the server (a crash: no clean shutdown) and reap it."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            _signal_group(process, signal.SIGKILL)
        process.wait()
        self._process = None

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the child to exit on its own; its exit code, or None on timeout."""
        if self._process is None:
            return None
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    # The child leads its own process group (start_new_session), so its pid is the group id.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def _last_lines(path: Path, count: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16_384))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-count:])


def run_foreground(port: int, data_dir: Path, log_file: Path | None = None) -> int:
    """`odradek zookeeper --port P --dir D`: serve until SIGTERM or SIGINT, then stop cleanly.

    Returns the process exit status for the CLI: 0 after a requested stop, 1 if the server died
    on its own. Start-up problems raise OperatorError (the CLI prints its one line).
    """
    server = ZooKeeperServer(port, Path(data_dir), log_file)
    stop_requested = False

    def request_stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stop_requested
        stop_requested = True

    previous = {
        signum: signal.signal(signum, request_stop) for signum in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        server.start()
        print(f"ZooKeeper serving on {server.connect_string} (pid {server.pid})", flush=True)
        while not stop_requested:
            if server.wait(timeout=0.2) is not None:
                print(f"ZooKeeper exited unexpectedly (see {server.log_file})", flush=True)
                return 1
        return 0
    finally:
        server.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
