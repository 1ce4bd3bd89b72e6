"""A list of independent tasks done by this process and helper processes at once.

Python code that holds the GIL (matplotlib drawing, say) only uses a second core from another
process. Helpers are started with ``spawn``: a fresh interpreter
that imports only what the task function's module needs, never a fork of a process that holds
DuckDB and Arrow threads. Task functions must be module-level and their arguments and results
picklable; a helper reads its own inputs (files, tables) rather than receiving them.

Work is shared by stealing: every task is queued for the helpers up front, in order; this process
takes tasks from the end of the list while the helpers take them from the front. A task the
helpers have not started is cancelled and run here, so the list is done when both meet. Results
come back in the list's order, and a task's result does not depend on where it ran. A helper that
dies (killed for memory, say) costs time, not results: its tasks are run here.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

HELPERS_ENV = "GPU_PIPELINE_HELPERS"


def default_helpers(env: str = HELPERS_ENV) -> int:
    """Helper processes: the environment variable ``env`` if set (0 = everything in this process),
    else one when the machine has a second core."""
    value = os.environ.get(env, "").strip()
    if value:
        if not value.isdigit():
            raise ValueError(f"{env}={value!r}: expected a number of helper processes, 0 or more")
        return int(value)
    return 1 if (os.cpu_count() or 1) > 1 else 0


@contextlib.contextmanager
def _bare_main() -> Iterator[None]:
    """A spawned process first re-imports the parent's ``__main__`` (for functions pickled from
    there); task functions live in library modules, so helpers start from an empty main instead
    (under Dagster the main module is its CLI, whose import would cost each helper seconds and memory)."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class Task:
    """One call, queued for the helpers (``future``) or to be run here."""

    __slots__ = ("fn", "args", "future")

    def __init__(self, fn: Callable[..., Any], args: tuple, future: Future | None):
        self.fn, self.args, self.future = fn, args, future


class HelperPool:
    """``workers`` helper processes (none: everything runs here). Use as a context manager; on exit
    the tasks nobody started are dropped. ``ran`` counts tasks by where they ran."""

    def __init__(self, workers: int):
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self.ran = {"here": 0, "helpers": 0}

    def __enter__(self) -> HelperPool:
        if self.workers > 0:
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Task:
        """Queue ``fn(*args)`` for the helpers (the first call starts them)."""
        future = None
        if self._pool is not None:
            with _bare_main():
                future = self._pool.submit(fn, *args)
        return Task(fn, args, future)

    def _steal(self, task: Task) -> bool:
        """Whether ``task`` is free to run here (no helper has started it; it is no longer queued)."""
        return task.future is None or task.future.cancel()

    def _run_here(self, task: Task) -> Any:
        self.ran["here"] += 1
        return task.fn(*task.args)

    def _helper_result(self, task: Task) -> Any:
        """The helper's result (its exception raised here), or the task run here after all when the
        helper died."""
        try:
            value = task.future.result()
        except BrokenProcessPool:
            return self._run_here(task)
        self.ran["helpers"] += 1
        return value

    def run_all(self, tasks: Sequence[Task]) -> list[tuple[Any, BaseException | None]]:
        """Every task's (result, None) or (None, exception), in list order: this process takes tasks
        from the end while the helpers take them from the front."""
        out: list[tuple[Any, BaseException | None] | None] = [None] * len(tasks)
        here = set()
        for i in range(len(tasks) - 1, -1, -1):
            if self._steal(tasks[i]):
                here.add(i)
                out[i] = _outcome(self._run_here, tasks[i])
        for i, task in enumerate(tasks):
            if i not in here:
                out[i] = _outcome(self._helper_result, task)
        return out  # type: ignore[return-value]


def _outcome(fn: Callable[[Task], Any], task: Task) -> tuple[Any, BaseException | None]:
    try:
        return fn(task), None
    except Exception as exc:  # noqa: BLE001 - handed to the caller with its task
        return None, exc
