"""Pausing Python's cyclic garbage collector around CPU-bound stages.

The ONNX import and the embedding sharder allocate millions of small objects and keep most of them until they
return; each full pass of the cyclic collector walks every live object, finds nothing to free, and costs a
tenth of a second or more on large inputs, up to a fifth of the sharder's time and a quarter of the import's.
Reference counting still frees what these stages drop: the sharder makes no reference cycles, the import a
few hundred objects' worth per model whatever its size, so pausing the collector changes their memory little.
Pauses nest and may overlap across threads: the collector is back in the state it
was in before the first pause once the last one ends.
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the ``with`` block (or, as ``@collector_paused()``, each call of a function) with the cyclic garbage
    collector disabled."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
