"""Small HTTP helpers shared by the Elasticsearch and Prometheus sources."""

from __future__ import annotations

import datetime as dt
import email.utils
from urllib.parse import urlsplit


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


def mask_userinfo(url: str, mask: str = "***") -> str:
    """``url`` with everything between its scheme and its last ``@`` masked: the user info of a URL
    that urllib cannot split (an unencoded ``/``, ``?`` or ``#`` in the password) named safely."""
    scheme, sep, rest = url.rpartition("://")
    return f"{scheme}{sep}{mask}@{rest.rsplit('@', 1)[-1]}"


def unsplit_userinfo(url: str) -> bool:
    """Whether ``url`` has an ``@`` after its scheme that urllib did not read as user info: a password
    starting with digits and an unencoded ``/`` (``http://user:2024/pw@host``) reads as a port and a
    path, and the URL would be used -- and logged -- with the password in it."""
    try:
        parsed = urlsplit(url if "://" in url else f"http://{url}")
        has_user = parsed.username is not None or parsed.password is not None
    except ValueError:
        has_user = False
    return "@" in url.split("://", 1)[-1] and not has_user
