"""Process environment helpers."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError


@contextlib.contextmanager
def scoped_env(key: str, value: str | None) -> Iterator[None]:
    """Run with ``os.environ[key] = value`` (unset where ``value`` is None); afterwards the variable
    is as it was (unset if it was)."""
    previous = os.environ.get(key)
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = previous


DATA_ROOT_VAR = "GPU_PIPELINE_DATA_ROOT"


def data_root(environ: Mapping[str, str] = os.environ) -> str:
    """Where the tables and plots are (DESIGN.md 3): ``GPU_PIPELINE_DATA_ROOT``; unset or blank,
    ``$DAGSTER_HOME/data`` (the folder the webserver, the daemon and the code server all know),
    else ``./data`` under the current folder, made absolute."""
    text = (environ.get(DATA_ROOT_VAR) or "").strip()
    if text:
        return text
    home = (environ.get("DAGSTER_HOME") or "").strip()
    return str(Path(home).expanduser() / "data") if home else str(Path.cwd() / "data")


def required_setting(name: str, value: str, what: str) -> str:
    """A required setting's value (``name``: its variable), refused when blank: a blank path is the
    current folder to ``Path`` (``Path('')``), where nothing should be read or written unasked."""
    if not str(value).strip():
        raise ValueError(f"{name} is blank: set it to {what}")
    return str(value)


def whole_number_env(name: str, default: int, unit: str, zero: str,
                     environ: Mapping[str, str] = os.environ) -> int:
    """The variable ``name`` as a whole number >= 0 (``default`` when unset or blank); anything else
    raises ValueError naming the variable, its value, the ``unit`` and what ``zero`` means."""
    text = (environ.get(name) or "").strip()
    try:
        value = int(text) if text else default
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected a whole number of {unit} (0: {zero})") from None
    if value < 0:
        raise ValueError(f"{name}={text!r}: negative (0: {zero})")
    return value


def zone_env(name: str, default: str = "", environ: Mapping[str, str] = os.environ) -> str:
    """The variable ``name`` as an IANA time zone name (``default`` when unset or blank); a name
    that is no zone, or one with spaces around it (the runs read the variable as it is, and
    ``'America/Chicago '`` is no zone there), raises ValueError naming the variable."""
    raw = environ.get(name) or ""
    text = raw.strip() or default
    if raw.strip() and raw != raw.strip():
        raise ValueError(f"{name}={raw!r}: remove the spaces around the time zone's name")
    if text:
        try:
            ZoneInfo(text)
        except (ValueError, ZoneInfoNotFoundError):
            raise ValueError(f"{name}={text!r}: not an IANA time zone (e.g. UTC, America/Chicago)") from None
    return text


def setting_number(name: str, text: str | int | float, *, whole: bool = False,
                   positive: bool = False) -> int | float:
    """A resource setting's value (``text``, as its variable ``name`` gave it) as a number: a whole
    number >= 0 when ``whole``, a number > 0 when ``positive``; anything else raises ValueError
    naming the variable and its value (``int('7d')`` named neither)."""
    raw = str(text).strip()
    kind = "a whole number >= 0" if whole else ("a number > 0" if positive else "a number")
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected {kind}") from None
    if not math.isfinite(value) or (whole and value < 0) or (positive and value <= 0):
        raise ValueError(f"{name}={raw!r}: expected {kind}")
    return value
