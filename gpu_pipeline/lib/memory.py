"""Giving freed memory back to the system between the steps of a run.

A run materializes many steps in one process, one after another. What a step frees stays with the
allocators that served it, for reuse, and still counts in the process's resident set while the next
step runs on top of it:

- Arrow's memory pool (mimalloc, jemalloc) keeps freed pages cached: ``release_unused`` returns them;
- the C library's ``malloc`` (numpy arrays, Python's large objects, the DuckDB and Parquet libraries'
  own allocations) keeps freed blocks in its arenas, one arena per thread that allocated: glibc's
  ``malloc_trim(0)`` returns the free pages of every arena, not only the top of the main heap.

:func:`give_back` does both; on a C library without ``malloc_trim`` (musl, macOS) only the first.

glibc gives each thread that allocates its own heap arena, up to eight per core: the telemetry
parse threads, DuckDB's, Arrow's and the run's each leave freed blocks in theirs, and blocks still
in use here and there keep an arena's pages from being trimmed. :func:`limit_heap_arenas` caps the
arenas (``GPU_PIPELINE_MALLOC_ARENAS``, default 2; ``0`` leaves glibc's choice), which the assets
do as a step starts: in a 1,000-GPU range run the peak of the steps' resident set was 60-115 MiB
lower (README, Performance).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import pyarrow as pa

from gpu_pipeline.lib.envutil import whole_number_env

ENV_HEAP_ARENAS = "GPU_PIPELINE_MALLOC_ARENAS"
DEFAULT_HEAP_ARENAS = 2
_M_ARENA_MAX = -8  # glibc's mallopt() parameter number


@functools.cache
def _libc_function(name: str, argtypes: tuple, restype: type) -> ctypes._CFuncPtr | None:
    """A function of the C library, or None where it has none of that name (musl, macOS)."""
    lib = ctypes.util.find_library("c")
    if not lib:
        return None
    try:
        fn = getattr(ctypes.CDLL(lib), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = list(argtypes)
    fn.restype = restype
    return fn


def _malloc_trim() -> ctypes._CFuncPtr | None:
    return _libc_function("malloc_trim", (ctypes.c_size_t,), ctypes.c_int)


def limit_heap_arenas(arenas: int | None = None) -> bool:
    """Cap glibc's heap arenas for the process's threads from now on: ``arenas``, else
    ``GPU_PIPELINE_MALLOC_ARENAS``, else 2 (``0``: leave glibc's choice). It holds for threads that
    have no arena yet, as long as the process has not yet made more than eight. True when set."""
    if arenas is None:
        arenas = whole_number_env(ENV_HEAP_ARENAS, DEFAULT_HEAP_ARENAS, "arenas", "glibc's choice")
    if arenas < 0:
        raise ValueError(f"heap arenas must be >= 0, got {arenas}")
    mallopt = _libc_function("mallopt", (ctypes.c_int, ctypes.c_int), ctypes.c_int)
    if arenas == 0 or mallopt is None:
        return False
    return mallopt(_M_ARENA_MAX, arenas) == 1


def give_back() -> bool:
    """Return the memory that Arrow's pool and the C heap hold freed to the system; True when the C
    heap could be trimmed too."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
