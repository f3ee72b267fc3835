"""Freezing what a paused body left alive (controller/gc_pause.py, `freeze_after_pauses`).

Most tests lower `FREEZE_MIN_OBJECTS` to 0 to see the mechanics with a few objects; the last ones
keep the broker's threshold and show that a small pause leaves the collector's work alone."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from odradek.controller import gc_pause
from odradek.controller.gc_pause import freeze_after_pauses, paused_gc


@pytest.fixture(autouse=True)
def restore_the_collector() -> Iterator[None]:
    was = gc.isenabled()
    gc.collect()
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


@pytest.fixture
def any_pause_freezes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gc_pause, "FREEZE_MIN_OBJECTS", 0)


@pytest.mark.usefixtures("any_pause_freezes")
def test_what_a_pause_built_is_out_of_the_collectors_reach_afterwards() -> None:
    freeze_after_pauses()
    with paused_gc():
        survivor = [object()]
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0
    assert not tracked(survivor)
    later = [object()]  # objects made after the pause are collected as usual
    assert tracked(later)


@pytest.mark.usefixtures("any_pause_freezes")
def test_nested_pauses_freeze_once_the_outermost_ends() -> None:
    freeze_after_pauses()
    with paused_gc():
        with paused_gc():
            inner = [object()]
        assert tracked(inner)
    assert not tracked(inner)


@pytest.mark.usefixtures("any_pause_freezes")
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


class Cycle:
    """A reference cycle (weakly referenceable): only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_a_small_pause_freezes_nothing() -> None:
    freeze_after_pauses()
    with paused_gc():
        survivor = [object()]
    assert gc.get_freeze_count() == 0
    assert tracked(survivor)


def test_garbage_waiting_for_the_collector_is_not_frozen_alive_by_small_pauses() -> None:
    """A broker under request traffic makes cyclic garbage between collections; a pause for a
    small UpdateMetadata or controller event must leave it to the collector (freezing it after
    every such pause grew the fuzzed broker by 171 MB)."""
    freeze_after_pauses()
    gc.disable()  # no collection between making the garbage and the pause
    garbage = weakref.ref(Cycle())
    with paused_gc():
        pass
    gc.enable()
    gc.collect()
    assert garbage() is None


def test_a_large_pause_freezes_what_it_built() -> None:
    freeze_after_pauses()
    with paused_gc():
        built = [[i] for i in range(gc_pause.FREEZE_MIN_OBJECTS + 1000)]
    assert gc.get_freeze_count() >= len(built)
    assert not tracked(built)
