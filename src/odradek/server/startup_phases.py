"""How long each step of a broker's start-up took, for the one line it logs when it has started
(Kafka logs its log loading time and a "started" line; an operator whose broker takes long to
come back wants to know which step it was).

Concurrency: used by `KafkaBroker.startup` only, on the event loop thread.
"""

from __future__ import annotations

import os
import time


def process_age_s() -> float | None:
    """Seconds since this process was started (the interpreter's start-up and imports included),
    from /proc; None where there is no /proc."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces: count from after it.
    fields = stat[stat.rindex(b")") + 2 :].split()
    started_ticks = int(fields[19])  # field 22, starttime, in clock ticks since boot
    return max(uptime - started_ticks / os.sysconf("SC_CLK_TCK"), 0.0)


class StartupPhases:
    """Durations of named steps, each from the end of the previous one."""

    def __init__(self) -> None:
        self.process_age_s = process_age_s()
        self._started = self._last = time.monotonic()
        self.phases: list[tuple[str, float]] = []

    def mark(self, name: str) -> None:
        """The step `name` has just finished."""
        now = time.monotonic()
        self.phases.append((name, now - self._last))
        self._last = now

    def summary(self) -> str:
        """`2.10 s (process start-up 0.95 s, logs 0.61 s, ...)`."""
        total = time.monotonic() - self._started
        parts = [f"{name} {seconds:.2f} s" for name, seconds in self.phases]
        if self.process_age_s is not None:
            total += self.process_age_s
            parts.insert(0, f"process start-up {self.process_age_s:.2f} s")
        return f"{total:.2f} s ({', '.join(parts)})"
