"""The cyclic garbage collector paused for a run over a large live heap.

A run that allocates many small objects while a large state stays alive triggers
collections that each walk everything still alive:

- a projection (reading, folding and writing): decoding a batch allocates hundreds of
  thousands of objects; the collections more than doubled the fold time, and pausing
  only the fold left the reads to pay for them (4 of 24 s on a million events);
- a forecast's forward run, over a copy of the cluster's state: about a tenth of it.

Neither creates reference cycles of its own (refcounting frees what they drop), so
pausing the collector for them holds back nothing.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block; restore it as it was."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
