"""Giving freed memory back to the system between the steps of a run.

A run materializes many steps in one process, one after another. What a step frees stays with the
allocators that served it, for reuse, and still counts in the process's resident set while the next
step runs on top of it:

- Arrow's memory pool (mimalloc, jemalloc) keeps freed pages cached: ``release_unused`` returns them;
- the C library's ``malloc`` (numpy arrays, Python's large objects, the DuckDB and Parquet libraries'
  own allocations) keeps freed blocks in its arenas, one arena per thread that allocated: glibc's
  ``malloc_trim(0)`` returns the free pages of every arena, not only the top of the main heap.

:func:`give_back` does both; on a C library without ``malloc_trim`` (musl, macOS) only the first.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import pyarrow as pa


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def give_back() -> bool:
    """Return the memory that Arrow's pool and the C heap hold freed to the system; True when the C
    heap could be trimmed too."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
