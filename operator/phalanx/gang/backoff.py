"""When an admitted gang has waited too long to run, and how long it waits before trying again."""

from typing import Final

DEFAULT_BASE_SECONDS: Final = 10.0
DEFAULT_CAP_SECONDS: Final = 600.0


def requeue_delay_seconds(
    timeouts_so_far: int, base: float = DEFAULT_BASE_SECONDS, cap: float = DEFAULT_CAP_SECONDS
) -> float:
    """base x 2^(n-1) after the n-th gang timeout, never above cap; 0 before any timeout.

    Deterministic on purpose (no jitter): gangs time out at different moments already, and a
    reproducible delay is easier to explain in a condition message and to test.
    """
    if timeouts_so_far <= 0:
        return 0.0
    # Stop doubling once past the cap so a huge count cannot overflow a float.
    exponent = min(timeouts_so_far - 1, 62)
    return float(min(cap, base * (2**exponent)))


def gang_timed_out(
    admitted_at: float, now: float, timeout_seconds: float, pods_running: int, replicas: int
) -> bool:
    """True when the gang was admitted at least timeout_seconds ago and fewer than all of its
    `replicas` pods run (not minAvailable: the trainer needs every rank).

    A partly running gang holds accelerators while its peers cannot start; after the timeout the
    whole attempt is torn down and requeued (docs/scheduling.md). timeout_seconds <= 0 disables it.
    """
    if timeout_seconds <= 0 or pods_running >= replicas:
        return False
    return now - admitted_at >= timeout_seconds


def requeue_at(
    timed_out_at: float,
    timeouts_so_far: int,
    base: float = DEFAULT_BASE_SECONDS,
    cap: float = DEFAULT_CAP_SECONDS,
) -> float:
    """The earliest time the torn-down gang may be considered for admission again."""
    return timed_out_at + requeue_delay_seconds(timeouts_so_far, base, cap)
