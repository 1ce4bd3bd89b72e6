"""Small HTTP helpers shared by the Elasticsearch and Prometheus sources."""

from __future__ import annotations

import datetime as dt
import email.utils


def retry_after_seconds(value: object) -> float | None:
    """Seconds to wait from a ``Retry-After`` header value: delta-seconds or an HTTP date
    (RFC 9110 10.2.3); None when absent or unreadable."""
    if not value:
        return None
    text = str(value).strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())
