"""The cyclic garbage collector paused around allocation-heavy build steps (planning, the choice,
program emission): :func:`gc_paused`. A module of its own so that any step can use it without
importing the choice."""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator

__all__ = ["gc_paused"]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block (if it runs; nested blocks leave it
    to the outermost). Planning an operator (decoding embeddings, packed programs, knob grids)
    and building and timing its candidates allocate hundreds of thousands of long-lived objects
    and no reference cycles; each full collection the allocations trigger meanwhile would walk
    every object of the process (about 0.1 s in a cold ResNet-18 build). Garbage is collected as
    usual once the block ends; within a build, the block's objects are frozen first
    (:func:`vta_ext.heap.freeze_young`), so that the next young collection does not walk them."""
    from vta_ext.heap import freeze_young

    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            freeze_young()
            gc.enable()
