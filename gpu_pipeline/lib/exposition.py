"""Prometheus text exposition read fast, with ``prometheus_client``'s parser deciding every series.

``prometheus_client.parser`` spends ~70-80 us per sample line, almost all in label parsing. Scrapes
repeat the same series (``name{labels}``) line after line and scrape after scrape, so
:class:`SeriesParser` hands each *distinct* series text to the library once and caches the result;
a sample line ``<series> <value> [<timestamp>]`` then costs a split and a number conversion by the
library's own number rule (:func:`prom_number`). Lines of any other shape, and comment lines, go to
the library as they are (comments once per distinct text).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from prometheus_client.parser import (  # the library's own tokenizer for HELP / TYPE lines
    _split_quoted,
    _unquote_unescape,
    text_string_to_metric_families,
)


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None  #: seconds since the epoch (the exposition carries milliseconds)


def parser_reason(exc: BaseException) -> str:
    """The reason to record when the library rejects a line."""
    detail = str(exc)
    return f"invalid exposition line: {type(exc).__name__}" + (f": {detail}" if detail else "")


def line_error(line: str) -> str | None:
    """Why the exposition parser rejects this one line on its own (``None``: it accepts it)."""
    try:
        for _ in text_string_to_metric_families(line + "\n"):
            pass
    except Exception as exc:  # the parser raises bare ValueError, IndexError, ...
        return parser_reason(exc)
    return None


def prom_number(token: str) -> float:
    """A sample value or timestamp read by the exposition parser's own rule: int, else float, and no
    underscores (which Python's int()/float() would accept)."""
    if "_" in token:
        raise ValueError(f"invalid value {token!r}")
    try:
        return int(token)
    except ValueError:
        return float(token)


def _tokens(text: str) -> list[str]:
    """``text`` split at spaces and tabs only, as the exposition parser splits a line (``str.split()``
    would also split at a no-break space, which the parser does not take for a separator)."""
    return [t for t in text.replace("\t", " ").split(" ") if t]


def split_sample_line(line: str) -> tuple[str, float, float | None] | None:
    """``(series, value, timestamp in seconds)`` of a stripped line ``<series> <value> [<ms>]``, the
    numbers read by :func:`prom_number`; ``None`` for any other shape."""
    brace = line.rfind("}")
    if brace >= 0:
        series, rest = line[: brace + 1], _tokens(line[brace + 1:])
    else:
        parts = _tokens(line)
        series, rest = parts[0], parts[1:]
    if len(rest) not in (1, 2):
        return None
    try:
        value = prom_number(rest[0])
        ts = prom_number(rest[1]) / 1000 if len(rest) == 2 else None
    except ValueError:
        return None
    return series, value, ts


class SeriesParser:
    """Reads sample lines, parsing each distinct series text with the library once."""

    def __init__(self) -> None:
        self._series: dict[str, tuple[str, dict[str, str]] | str | None] = {}
        self._comments: dict[str, str | None] = {}
        # Callers' own per-series work, kept as long as the parser (the samples of one series text
        # share one labels dict, which callers must not change).
        self.memo: dict[object, dict] = {}

    def split(self, line: str) -> Sample | str | None:
        """A :class:`Sample` for a stripped line ``<series> <value> [<ts>]`` whose series the library
        accepts on its own; the library's reason when it rejects the series; ``None`` for any other
        shape (the caller then hands the whole line to the library)."""
        parts = split_sample_line(line)
        if parts is None:
            return None
        series, value, ts = parts
        entry = self._series.get(series, False)
        if entry is False:
            entry = self._parse_series(series)
            self._series[series] = entry
        if entry is None or isinstance(entry, str):
            return entry
        return Sample(entry[0], entry[1], value, ts)

    @staticmethod
    def _parse_series(series: str) -> tuple[str, dict[str, str]] | str | None:
        try:
            samples = [s for f in text_string_to_metric_families(series + " 0\n") for s in f.samples]
        except Exception as exc:  # anything the parser raises
            return parser_reason(exc)
        # The series must be exactly name + labels (nothing left over for value/timestamp).
        if len(samples) == 1 and samples[0].value == 0 and samples[0].timestamp is None:
            return samples[0].name, samples[0].labels
        return None

    def comment_error(self, line: str) -> str | None:
        """:func:`line_error` of a comment line, cached by its text."""
        if line not in self._comments:
            self._comments[line] = line_error(line)
        return self._comments[line]

    def samples(self, text: str) -> Iterator[tuple[int, Sample | str]]:
        """``(line number, sample)`` for every sample of ``text``, or ``(line number, reason)`` for a
        line the library rejects. Blank and valid comment lines yield nothing.

        Sample names are the library's: it groups samples under the preceding ``# HELP`` /
        ``# TYPE`` family and renames the samples of a counter family declared without ``_total``
        to ``<name>_total``; :class:`_Families` follows the same rules."""
        families = _Families()
        for ln, raw in enumerate(text.split("\n"), 1):
            line = raw.strip()
            if not line:
                continue
            if line.startswith("#"):
                reason = self.comment_error(line)
                if reason is not None:
                    yield ln, reason
                else:
                    families.comment(line)
                continue
            fast = self.split(line)
            if fast is not None:
                yield ln, families.sample(fast) if isinstance(fast, Sample) else fast
                continue
            try:
                parsed = [s for f in text_string_to_metric_families(line + "\n") for s in f.samples]
            except Exception as exc:  # anything the parser raises
                yield ln, parser_reason(exc)
                continue
            for s in parsed:
                yield ln, families.sample(Sample(s.name, s.labels, s.value, s.timestamp))


class _Families:
    """The family a sample line belongs to, by the rules of ``prometheus_client.parser``'s
    ``text_fd_to_metric_families`` (pinned version): a HELP or TYPE line naming another metric starts
    a family; a TYPE line sets its type and the sample names it takes (histogram ``_bucket`` /
    ``_sum`` / ``_count`` ...); a sample with any other name ends it."""

    _SUFFIXES = {"counter": [""], "gauge": [""], "summary": ["_count", "_sum", ""],
                 "histogram": ["_count", "_sum", "_bucket"]}

    def __init__(self) -> None:
        self.name = ""
        self.typ = "untyped"
        self.allowed: list[str] = []

    def comment(self, line: str) -> None:
        parts = _split_quoted(line, None, 3)
        if len(parts) < 3 or parts[1] not in ("HELP", "TYPE"):
            return
        name, _ = _unquote_unescape(parts[2])
        if parts[1] == "HELP":
            if name != self.name:
                self.name, self.typ, self.allowed = name, "untyped", [name]
            return
        if name != self.name:
            self.name = name
        self.typ = parts[3] if len(parts) == 4 else "untyped"
        self.allowed = [name + suffix for suffix in self._SUFFIXES.get(self.typ, [""])]

    def sample(self, s: Sample) -> Sample:
        if s.name not in self.allowed:
            self.name, self.typ, self.allowed = "", "untyped", []
            return s
        if self.typ == "counter" and not self.name.endswith("_total"):
            return s._replace(name=s.name + "_total")
        return s
