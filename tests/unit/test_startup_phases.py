"""The start-up line's step durations (server/startup_phases.py)."""

from __future__ import annotations

import re
import time

import pytest

from odradek.server import startup_phases
from odradek.server.startup_phases import StartupPhases, process_age_s


def test_process_age_is_this_process_lifetime() -> None:
    age = process_age_s()
    assert age is not None  # Linux: /proc is there
    assert 0 < age < time.monotonic()  # started after the machine booted


def test_each_step_is_timed_from_the_end_of_the_previous_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter([100.0, 100.5, 102.0, 102.25])
    monkeypatch.setattr(startup_phases.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(startup_phases, "process_age_s", lambda: 0.75)
    phases = StartupPhases()
    phases.mark("logs")
    phases.mark("ZooKeeper state")
    assert phases.phases == [("logs", 0.5), ("ZooKeeper state", 1.5)]
    assert phases.summary() == (
        "3.00 s (process start-up 0.75 s, logs 0.50 s, ZooKeeper state 1.50 s)"
    )


def test_without_proc_the_summary_leaves_the_process_start_up_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(startup_phases, "process_age_s", lambda: None)
    phases = StartupPhases()
    phases.mark("logs")
    assert re.fullmatch(r"\d+\.\d\d s \(logs \d+\.\d\d s\)", phases.summary())
