"""How soon the admission pass may run again (used by controller/admission_pass.py).

A pod that finishes frees GPUs that stay idle until the next pass hands them to a waiting gang, so
the pause after a pass is paid at every turnover: a fixed second between passes left pods that
finished just after a pass waiting for up to a second. The pause is instead sized by the CPU time
the pass itself took on its thread, which is also how long it held the interpreter lock the
reconcile threads wait on (its waits on the API server cost nothing): the pass may take at most
MAX_DUTY of one core, however many gangs wait and however often pods finish (a pass over thousands
of them is spaced further; under the fixed second a 100 ms pass took 9 %), never closer than
MIN_PAUSE_SECONDS (the pods of one generation finish within a few tens of milliseconds of each
other: one pass serves them all) and never further than MAX_PAUSE_SECONDS."""

from __future__ import annotations

from typing import Final

MIN_PAUSE_SECONDS: Final = 0.05
MAX_PAUSE_SECONDS: Final = 1.0
MAX_DUTY: Final = 0.1  # the share of one core the pass may take while gangs wait
MAX_PASS_CPU_SECONDS: Final = MAX_PAUSE_SECONDS * MAX_DUTY / (1.0 - MAX_DUTY)  # paused the longest from here
IDLE_PASS_SECONDS: Final = 3.0  # with nothing changed, a pass this often (reservations age, nodes heal)


def pause_after(pass_seconds: float) -> float:
    """Seconds to wait after a pass that took `pass_seconds` before the next may start."""
    duty_pause = pass_seconds * (1.0 - MAX_DUTY) / MAX_DUTY
    return min(MAX_PAUSE_SECONDS, max(MIN_PAUSE_SECONDS, duty_pause))
