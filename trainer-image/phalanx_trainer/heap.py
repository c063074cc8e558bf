"""Keeps the garbage collector off the imported heap.

Importing torch and the trainer leaves some 340,000 long-lived objects (modules, classes,
functions) that every full collection walks: about 0.2 s each on the development machine. A
restore allocates enough to run several, and on the demo model they were more than half of its
time (0.88 s of wall time per rank with 4 ranks on 2 cores, 0.36 s with the heap frozen;
docs/trainer.md). `gc.freeze()` moves what exists into a permanent generation that collections
skip; in the resident launcher it also keeps forked workers' collections from writing to the
parent's pages (copy-on-write). What is frozen is never freed, so only start-up's objects are.
"""

from __future__ import annotations

import gc


def freeze_imported() -> int:
    """Freezes every object alive now (call it once the imports are done); returns how many are."""
    gc.freeze()
    return gc.get_freeze_count()
