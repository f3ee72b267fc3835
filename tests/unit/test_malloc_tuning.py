"""The broker's malloc thresholds (`server/malloc_tuning.py`): set on glibc, left alone when the
environment sets malloc's parameters itself. Each case runs in a fresh interpreter, since the
thresholds are process-wide."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from odradek.server.malloc_tuning import operator_settings

CALL = "from odradek.server.malloc_tuning import keep_freed_memory; print(keep_freed_memory())"


def _run(environ: dict[str, str]) -> str:
    env = {
        k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")
    }
    env.update(environ)
    done = subprocess.run(
        [sys.executable, "-c", CALL],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's")
def test_thresholds_are_set_on_glibc() -> None:
    assert _run({}) == "True"


@pytest.mark.parametrize(
    "environ",
    [
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000000"},
        {"MALLOC_MMAP_THRESHOLD_": "131072"},
        {"MALLOC_TRIM_THRESHOLD_": "0"},
    ],
)
def test_the_operators_own_settings_win(environ: dict[str, str]) -> None:
    assert operator_settings(environ)
    assert _run(environ) == "False"


def test_tunables_of_other_parts_of_glibc_are_not_malloc_settings() -> None:
    assert not operator_settings({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"})
    assert not operator_settings({})
