"""Produce the items of an iterator on a background thread, a few ahead of the one who takes them.

Used where the producer's work and the consumer's both run mostly without the GIL (Arrow kernels, the
SQLite driver, the Parquet writer, hashing), so that the two use two cores: two row ranges of a
SQLite archive decoded at once (:mod:`gpu_pipeline.lib.condor_archive`), a day's telemetry sorted
slab by slab while the previous batches are encoded into Parquet (:mod:`gpu_pipeline.lib.samples`).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Generic, TypeVar

__all__ = ["Prefetch"]

T = TypeVar("T")
_DONE = object()


class Prefetch(Generic[T]):
    """The items of ``items``, produced by a thread named ``name`` from the moment this is built, at
    most ``depth`` ahead of the caller. The producer's exception is raised to the caller when it
    reaches it; :meth:`close` (also on leaving a ``with`` block) stops the producer and waits for it,
    and the producer closes ``items`` in its own thread (a generator's ``finally`` runs there)."""

    def __init__(self, items: Iterator[T], depth: int, name: str = "prefetch"):
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self._items = items
        self._buffer: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._produce, name=name, daemon=True)
        self._worker.start()

    def _put(self, entry: tuple) -> bool:
        while not self._stop.is_set():
            try:
                self._buffer.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            for item in self._items:
                if not self._put((item, None)):
                    return
            self._put((_DONE, None))
        except BaseException as exc:  # handed to the consumer, raised there
            self._put((None, exc))
        finally:
            close = getattr(self._items, "close", None)
            if close is not None:
                close()

    def __iter__(self) -> Iterator[T]:
        while True:
            item, exc = self._buffer.get()
            if exc is not None:
                raise exc
            if item is _DONE:
                return
            yield item
            del item  # not held while waiting for the next one

    def close(self) -> None:
        """Stop the producer and wait until its thread has ended -- also when the wait is
        interrupted (a signal's exception is raised after it), so that nothing the producer
        reads is closed under it -- then drop the items still queued."""
        self._stop.set()
        interrupted: BaseException | None = None
        while self._worker.is_alive():
            try:
                self._worker.join()
            except BaseException as exc:  # KeyboardInterrupt, a run's termination
                interrupted = exc
        while True:
            try:
                self._buffer.get_nowait()
            except queue.Empty:
                break
        if interrupted is not None:
            raise interrupted

    def __enter__(self) -> Prefetch[T]:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
