"""Freezing what a paused body left alive (controller/gc_pause.py, `freeze_after_pauses`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from odradek.controller import gc_pause
from odradek.controller.gc_pause import freeze_after_pauses, paused_gc


@pytest.fixture(autouse=True)
def restore_the_collector() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    freeze_after_pauses(False)
    gc.unfreeze()
    if not was:
        gc.disable()


def tracked(obj: object) -> bool:
    """Whether the collector's generations (not its permanent one) hold `obj`."""
    return any(o is obj for o in gc.get_objects())


def test_without_it_a_pause_freezes_nothing() -> None:
    gc.unfreeze()
    with paused_gc():
        survivor = [object()]
    assert gc.get_freeze_count() == 0
    assert tracked(survivor)


def test_what_a_pause_built_is_out_of_the_collectors_reach_afterwards() -> None:
    freeze_after_pauses()
    with paused_gc():
        survivor = [object()]
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0
    assert not tracked(survivor)
    later = [object()]  # objects made after the pause are collected as usual
    assert tracked(later)


def test_nested_pauses_freeze_once_the_outermost_ends() -> None:
    freeze_after_pauses()
    with paused_gc():
        with paused_gc():
            inner = [object()]
        assert tracked(inner)
    assert not tracked(inner)


def test_after_the_interval_the_frozen_objects_go_back_to_the_collector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    freeze_after_pauses()
    with paused_gc():
        survivor = [object()]
    assert not tracked(survivor)
    monkeypatch.setattr(gc_pause, "UNFREEZE_INTERVAL_S", 0.0)
    with paused_gc():
        pass
    assert gc.get_freeze_count() == 0
    assert tracked(survivor)
    monkeypatch.setattr(gc_pause, "UNFREEZE_INTERVAL_S", 600.0)
    with paused_gc():  # and the next pause freezes again
        pass
    assert not tracked(survivor)
