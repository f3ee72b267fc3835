"""pytest wiring of the fault-injection suite: the seed, and where its summary goes.

* `fault_seed`: `ODRADEK_FAULT_SEED` if set (to repeat a run), else a fresh random seed. Either
  way it is written to the terminal before the run starts, and added to the report of a failed
  test with the command that repeats it.
* `fault_summary`: a list the test appends its one-line summaries to; they are printed in the
  terminal summary at the end of the session (past output capture), so a passing run shows what
  it did too: seed, faults by kind, records acknowledged, checks passed.

Soak mode (`ODRADEK_SOAK=1`) is decided by the test module: without it the soak test is skipped,
and pytest reports it as skipped, not passed.
"""

from __future__ import annotations

import os
import random
from collections.abc import Generator

import pytest

SEED_VARIABLE = "ODRADEK_FAULT_SEED"

_summaries_key = pytest.StashKey[list[str]]()
_seed_key = pytest.StashKey[int]()


def _write(config: pytest.Config, text: str) -> None:
    reporter = config.pluginmanager.getplugin("terminalreporter")
    capture = config.pluginmanager.getplugin("capturemanager")
    if reporter is None:
        return
    if capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(text)
    else:
        reporter.write_line(text)


@pytest.fixture
def fault_seed(request: pytest.FixtureRequest) -> int:
    raw = os.environ.get(SEED_VARIABLE, "").strip()
    seed = int(raw) if raw else random.SystemRandom().randrange(1, 2**31)
    request.node.stash[_seed_key] = seed
    _write(request.config, f"\nfault-injection seed {seed} (repeat with {SEED_VARIABLE}={seed})")
    return seed


@pytest.fixture
def fault_summary(request: pytest.FixtureRequest) -> list[str]:
    return request.config.stash.setdefault(_summaries_key, [])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    seed = item.stash.get(_seed_key, None)
    if report.failed and seed is not None:
        report.sections.append(
            (
                "fault-injection seed",
                f"seed {seed}: repeat with {SEED_VARIABLE}={seed} .venv/bin/pytest {item.nodeid}",
            )
        )
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = terminalreporter.config.stash.get(_summaries_key, [])
    if lines:
        terminalreporter.section("fault injection")
        for line in lines:
            terminalreporter.write_line(line)
