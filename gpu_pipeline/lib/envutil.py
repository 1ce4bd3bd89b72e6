"""Process environment helpers."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def scoped_env(key: str, value: str) -> Iterator[None]:
    """Run with ``os.environ[key] = value``; afterwards the variable is as it was (unset if it was)."""
    previous = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = previous
