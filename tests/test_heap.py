"""vta_ext.heap: within a build, what a paused step leaves (and every older object) is out of the
cyclic collector's reach until the build ends, back in it afterwards; nothing else changes."""
from __future__ import annotations

import gc
import weakref

import pytest

from tvm_csp_embed.collector import gc_paused
from vta_ext import heap


class _Node:
    def __init__(self):
        self.other = self       # a reference cycle: only the cyclic collector frees it


def _cycle():
    """A garbage reference cycle (made and dropped here) and a weak reference to it."""
    node = _Node()
    ref = weakref.ref(node)
    del node
    return ref


@pytest.fixture(autouse=True)
def _nothing_frozen():
    gc.collect()
    assert gc.get_freeze_count() == 0
    yield
    assert gc.get_freeze_count() == 0


def test_garbage_older_than_a_paused_step_is_collected_after_the_build():
    node = _Node()
    ref = weakref.ref(node)
    with heap.frozen_heap():
        assert gc.get_freeze_count() == 0     # nothing frozen before a paused step ends
        with gc_paused():
            pass
        assert gc.get_freeze_count() > 0
        del node                  # becomes garbage while frozen
        gc.collect()
        assert ref() is not None  # the collector does not reach it
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None          # unfrozen: collected as usual


def test_a_build_without_a_paused_step_collects_as_usual():
    with heap.frozen_heap():
        ref = _cycle()
        gc.collect()
        assert ref() is None and gc.get_freeze_count() == 0


def test_a_paused_step_leaves_its_objects_frozen_until_the_build_ends():
    with heap.frozen_heap():
        with gc_paused():
            ref = _cycle()
        gc.collect()
        assert ref() is not None
        young = _cycle()          # made outside a paused step: collected as usual
        gc.collect()
        assert young() is None
    gc.collect()
    assert ref() is None


def test_outside_a_build_a_paused_step_freezes_nothing():
    with gc_paused():
        ref = _cycle()
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None


def test_objects_frozen_by_the_application_are_left_alone():
    node = _Node()
    ref = weakref.ref(node)
    gc.freeze()
    try:
        count = gc.get_freeze_count()
        with heap.frozen_heap():
            with gc_paused():
                inner = _cycle()
        assert gc.get_freeze_count() == count      # neither unfrozen nor more frozen
        gc.collect()
        assert inner() is None
        del node
    finally:
        gc.unfreeze()
    gc.collect()
    assert ref() is None


def test_nested_blocks_unfreeze_once_at_the_outer_end():
    with heap.frozen_heap():
        with heap.frozen_heap():
            with gc_paused():
                ref = _cycle()
        gc.collect()
        assert ref() is not None        # the inner end unfroze nothing
    gc.collect()
    assert ref() is None
