"""`odradek console` as a child process beside a local cluster: for the demo, the tests and the
console's benchmark.

`ConsoleProcess.start(cluster_dir, log_file)` runs `odradek console --cluster-dir DIR` on a free
port with its output in `log_file`, and returns once `/health` answers (OperatorError with the
log's tail if it does not within the deadline, the process killed). `stop()` sends SIGTERM,
waits a few seconds, then SIGKILLs: the console never outlives its owner's cleanup.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from odradek.errors import OperatorError
from odradek.testing.cluster_files import tail
from odradek.testing.processes import free_ports

HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0


@dataclass
class ConsoleProcess:
    process: subprocess.Popen[bytes]
    url: str
    log_file: Path
    _log: IO[Any]

    @classmethod
    def start(
        cls,
        cluster_dir: Path,
        log_file: Path,
        port: int | None = None,
        timeout: float = START_TIMEOUT_S,
        extra_args: list[str] | None = None,
    ) -> ConsoleProcess:
        port = port if port is not None else free_ports(1, HOST)[0]
        log_file.parent.mkdir(parents=True, exist_ok=True)
        log = log_file.open("ab")
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "odradek.cli.main",
                "console",
                "--cluster-dir",
                str(cluster_dir),
                "--host",
                HOST,
                "--port",
                str(port),
                *(extra_args or []),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        console = cls(process, f"http://{HOST}:{port}/", log_file, log)
        try:
            console.wait_ready(timeout)
        except BaseException:
            console.stop()
            raise
        return console

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise OperatorError(
                    f"the console exited with status {self.process.returncode}:\n"
                    + tail(self.log_file, 20)
                )
            try:
                with urllib.request.urlopen(self.url + "health", timeout=5) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() >= deadline:
                raise OperatorError(
                    f"the console did not answer within {timeout:g} s:\n" + tail(self.log_file, 20)
                )
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(OSError):
            self._log.close()
