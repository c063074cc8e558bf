"""Keeps the garbage collector off the imported heap.

Importing torch and the trainer leaves some 340,000 long-lived objects (modules, classes,
functions) that every full collection walks: about 0.2 s each on the development machine. A
restore allocates enough to run several, and on the demo model they were more than half of its
time (0.66 s of wall time per rank with 4 ranks on 2 cores, 0.25 s with the heap frozen;
docs/trainer.md). `gc.freeze()` moves what exists into a permanent generation that collections
skip, and a forked worker inherits it. Reference counting still frees frozen objects; only cycles
among them wait, until an exit unfreezes them.
"""

from __future__ import annotations

import atexit
import gc

_unfreeze_at_exit_registered = False


def freeze_imported() -> int:
    """Freezes every object alive now (call it once the imports are done); returns how many are.

    A normal interpreter exit (an uncaught error, a console script) unfreezes first: its last
    collection must reach the imported objects, or native extensions (triton's nanobind) print leak
    reports after the traceback, and a termination message keeps only the tail of the output.
    """
    global _unfreeze_at_exit_registered
    if not _unfreeze_at_exit_registered:
        atexit.register(gc.unfreeze)
        _unfreeze_at_exit_registered = True
    gc.freeze()
    return gc.get_freeze_count()
