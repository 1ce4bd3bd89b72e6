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



_ARENAS_SCRIPT = r"""
import ctypes, ctypes.util, re, sys, tempfile, threading
from gpu_pipeline.lib import memory
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
def heaps():
    with tempfile.NamedTemporaryFile(suffix=".xml") as out:
        fp = libc.fopen(out.name.encode(), b"w")
        libc.malloc_info(0, fp)
        libc.fclose(fp)
        return len(re.findall(r'<heap nr="', open(out.name).read()))
before = heaps()
limited = memory.limit_heap_arenas(int(sys.argv[1])) if sys.argv[1] != "-" else None
start, held = threading.Barrier(9), []
def work():  # each thread allocates from the C heap (not Python's small-object allocator) at once
    start.wait()
    held.append([bytearray(4096) for _ in range(64)])
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
start.wait()
for t in threads:
    t.join()
print(limited, before, heaps())
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="heap arenas and mallopt are glibc's")
def test_limit_heap_arenas_caps_the_arenas_that_threads_get():
    """Eight threads allocating at once get arenas of their own (glibc's default); with the cap they
    share two. Counted by glibc's own malloc_info, in fresh processes."""
    import subprocess
    import sys

    def heaps(arg: str) -> tuple[str, int, int]:
        out = subprocess.run([sys.executable, "-c", _ARENAS_SCRIPT, arg], capture_output=True, text=True,
                             check=True).stdout.split()
        return out[0], int(out[1]), int(out[2])

    limited, before, after = heaps("2")  # the arenas made before the cap stay; no more are made
    assert limited == "True" and before <= 8 and after == max(2, before)
    limited, before, after = heaps("-")
    assert limited == "None" and after >= before + 4  # most of the eight threads get one of their own
    unset, before, after = heaps("0")  # 0: glibc's choice
    assert unset == "False" and after >= before + 4


def test_a_bad_arena_count_is_named(monkeypatch):
    monkeypatch.setenv(memory.ENV_HEAP_ARENAS, "two")
    with pytest.raises(ValueError, match="GPU_PIPELINE_MALLOC_ARENAS='two'"):
        memory.limit_heap_arenas()
    with pytest.raises(ValueError, match=">= 0"):
        memory.limit_heap_arenas(-1)
