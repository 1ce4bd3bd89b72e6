"""The cached series parser reads exactly what prometheus_client's whole-text parser reads."""

import datetime as dt
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_pipeline.lib.exposition import Sample, SeriesParser
from gpu_pipeline.lib.simulate import SimConfig, simulate

REAL = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "real"


def library_samples(text: str) -> list[Sample]:
    return [Sample(s.name, s.labels, s.value, s.timestamp)
            for f in text_string_to_metric_families(text) for s in f.samples]


def cached_samples(text: str, parser: SeriesParser) -> list[Sample]:
    out = []
    for ln, item in parser.samples(text):
        assert not isinstance(item, str), f"line {ln}: {item}"
        out.append(item)
    return out


def test_simulated_kueue_scrapes_read_like_the_library(tmp_path):
    simulate(tmp_path, SimConfig(start=dt.date(2025, 8, 4), end=dt.date(2025, 8, 4), gpus=40, seed=2,
                                 timezone="America/Chicago", telemetry_interval_s=0, kueue_interval_s=3600))
    files = sorted((tmp_path / "kueue").glob("*.prom"))
    assert len(files) >= 20
    parser = SeriesParser()  # shared across scrapes, like a day's worth of them
    for path in files:
        text = path.read_text()
        assert cached_samples(text, parser) == library_samples(text)


@pytest.mark.skipif(not (REAL / "dcgm-exporter").is_dir(), reason=f"real captures not found at {REAL}")
def test_real_dcgm_exporter_scrapes_read_like_the_library():
    files = [p for p in sorted((REAL / "dcgm-exporter").rglob("*")) if p.is_file() and p.suffix in (".prom", ".txt")]
    assert files
    for path in files:
        text = path.read_text(errors="replace")
        try:
            expected = library_samples(text)
        except Exception:  # a capture the library rejects as a whole is not a comparison case
            continue
        assert cached_samples(text, SeriesParser()) == expected, path.name


def test_odd_lines_go_to_the_library_and_rejections_carry_the_line_number():
    text = (
        "# HELP up Whether the target is up.\n# TYPE up gauge\n"
        'up{job="a",instance="b"} 1\n'
        'up{job="a",instance="b"}   +Inf\n'        # extra spaces, special value
        'up{job="a",instance="c",} 0 1700000000000\n'  # trailing comma, timestamp
        "up 1_0\n"                                 # underscores are not a number to the library
        'up{job="a" 1\n'                           # unclosed label set
    )
    items = list(SeriesParser().samples(text))
    samples = [i for _, i in items if isinstance(i, Sample)]
    assert samples == library_samples(text.rsplit("up 1_0", 1)[0])
    rejected = [(ln, reason) for ln, reason in items if isinstance(reason, str)]
    assert [ln for ln, _ in rejected] == [6, 7]
    assert all(r.startswith("invalid exposition line") for _, r in rejected)
