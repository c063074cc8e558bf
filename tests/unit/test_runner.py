import platform

import pytest

from phalanx.runner import limit_malloc_arenas

pytestmark = pytest.mark.unit


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt(M_ARENA_MAX) is glibc's")
def test_malloc_arenas_are_limited_on_glibc() -> None:
    assert limit_malloc_arenas(2) is True
