"""Pausing the cyclic garbage collector around short bursts of allocation."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Generator

_gc_pauses = 0
_gc_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Generator[None, None, None]:
    """The cyclic garbage collector off for the block, process-wide.

    Nested and overlapping pauses (two seasons' rounds in one process) keep it off until
    the last one ends, and it is turned back on only if it was on before the first. Only
    for short, bounded blocks: cyclic garbage made meanwhile waits for the next
    collection; everything else is freed by reference counting as usual.
    """
    global _gc_pauses, _gc_was_enabled
    if _gc_pauses == 0:
        _gc_was_enabled = gc.isenabled()
        gc.disable()
    _gc_pauses += 1
    try:
        yield
    finally:
        _gc_pauses -= 1
        if _gc_pauses == 0 and _gc_was_enabled:
            gc.enable()
