"""Day windows and time-zone handling (zoneinfo; DST-aware)."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

UTC = dt.UTC


def day_window(day: dt.date | str, tz: str = "UTC") -> tuple[dt.datetime, dt.datetime]:
    """The UTC interval [start, end) of a calendar day in ``tz`` (23 or 25 h on DST days)."""
    if isinstance(day, str):
        day = dt.date.fromisoformat(day)
    zone = ZoneInfo(tz)
    start = dt.datetime.combine(day, dt.time(), zone).astimezone(UTC)
    end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), zone).astimezone(UTC)
    return start, end


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
_US = dt.timedelta(microseconds=1)


def epoch_us(t: dt.datetime) -> int:
    """Microseconds since the epoch of a timezone-aware time, exactly (no float rounding)."""
    if t.tzinfo is None:
        raise ValueError(f"naive datetime {t!r}: pass a timezone-aware (UTC) time")
    return (t - _EPOCH) // _US


def days_between(start: dt.date, end: dt.date) -> list[dt.date]:
    """Inclusive list of days."""
    n = (end - start).days
    return [start + dt.timedelta(days=i) for i in range(n + 1)]


def to_local_naive(ts: dt.datetime, tz: str) -> dt.datetime:
    return ts.astimezone(ZoneInfo(tz)).replace(tzinfo=None)
