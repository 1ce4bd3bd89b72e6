"""give_back returns what the C heap holds freed to the system."""

from __future__ import annotations

import os
import platform

import pytest

from gpu_pipeline.lib import memory


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="malloc_trim is glibc's; elsewhere give_back only empties Arrow's pool")
def test_give_back_returns_freed_heap_pages_below_a_live_block():
    # 256 MiB in 64 KiB blocks (from the heap, below the mmap threshold), then one small block
    # above them that stays alive: freeing the blocks leaves them inside the heap, where free()
    # alone never returns them (only the heap's top is trimmed automatically).
    blocks = [bytearray(64 << 10) for _ in range(4096)]
    for b in blocks:
        b[::4096] = b"\x01" * len(b[::4096])  # touch every page
    keep = bytearray(64 << 10)
    held = _rss_bytes()
    del blocks
    freed = _rss_bytes()
    assert memory.give_back() is True
    trimmed = _rss_bytes()
    assert keep is not None
    assert held - freed < (64 << 20), "free() alone already gave the blocks back: the test proves nothing here"
    assert freed - trimmed > (192 << 20), (held, freed, trimmed)

