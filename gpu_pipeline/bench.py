"""``gpu-pipeline bench``: how fast the daily pipeline is, measured on simulated clusters.

For each cluster size (``--gpus``, default 100 and 1,000 GPUs) and ``--days`` days (default 7, the range the targets are stated for):

1. simulate the pool into a scratch directory (5-minute slot snapshots, adstash job documents,
   GPU telemetry, Kueue scrapes), with the same generator as ``gpu-pipeline demo``;
2. materialize every daily asset for the days as ONE range run through Dagster (``run_pipeline``,
   the same job and tags as the nightly schedule and ``gpu-pipeline materialize``), in a child
   process so that the peak RSS reported for a size is that size's own; per step (an asset, or a
   multi-asset and all its tables), the wall seconds come from the run's event log
   (STEP_START -> STEP_SUCCESS), rows out from each materialization's ``dagster/row_count``, rows in
   from its ``rows_in`` metadata where the asset reports one, else from the row counts of its
   upstream assets in the same run;
3. on the last day of the range, on the same clean Parquet files: the state table and the
   allocation report computed by the pipeline's library (what the assets call) vs
   :mod:`gpu_pipeline.lib.baseline` (the original tool's pandas approach; its output is checked
   equal to the pipeline's), and the pipeline's metric SQL vs a bare DuckDB scan + GROUP BY over the
   same Parquet columns (the limit no pipeline can beat).

Then, once per invocation: one day read out of a monthly SQLite archive of realistic size
(``--sqlite-rows``, default 5 million rows, about 1 GB; built by the simulator) with the pipeline's
``condor_archive.read_window`` (building the file's time index, as a nightly run does; and the next
day with the index in memory, as a range run does), and Elasticsearch extraction throughput (``es_source.fetch_jobs``,
the real ``elasticsearch`` client, against the local stand-in server of the test suite).

Results: a table on stdout and JSON (``--out``, default ``bench.json``); the figures, the targets
of the benchmark issue with pass / fail, a linear fit of wall seconds against GPUs x days, and
``notes`` for everything that departs from the issue's setup (e.g. a coarser telemetry cadence
where 30-second telemetry for a size would not fit the disk or time budget).

Timings are wall-clock on whatever else the machine is doing; the machine is described in the JSON.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import datetime as dt
import importlib.util
import json
import math
import os
import platform
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from gpu_pipeline.lib.db import ENV_BLOCK_MEMORY, ENV_MEMORY_LIMIT, ENV_TEMP_DIR, ENV_THREADS

__all__ = [
    "DEFAULT_DAYS",
    "DEFAULT_GPUS",
    "BenchConfig",
    "add_arguments",
    "choose_telemetry_interval",
    "compare_with_pipeline",
    "config_from_args",
    "format_report",
    "linear_fit",
    "main_bench",
    "run_bench",
]

DEFAULT_GPUS: tuple[int, ...] = (100, 1000)
DEFAULT_DAYS = 7  # the targets are per day of a 7-day range run
#: First simulated day (a Monday); fixed so that every run of the benchmark simulates the same pool.
START = dt.date(2025, 8, 4)
SIM_TZ = "America/Chicago"  # the demo's zone: partitions are local days, as for an operator in it
SEED = 7
TELEMETRY_INTERVAL_S = 30
#: Cadences tried, in order, when 30-second telemetry is too much for a size.
TELEMETRY_STEPS_S = (30, 60, 120, 300, 600, 900, 1800, 3600)
#: Samples per size above which the cadence is lowered (so is it where the disk is short): 1,000 GPUs
#: x 7 days (20.2 million samples, ~19 GB of text) and 10,000 GPUs for a day (28.8 million, ~27 GB)
#: run at the issue's 30 s; larger sizes coarsen, with the cost at 30 s estimated on a slice.
MAX_TELEMETRY_SAMPLES = 30_000_000
#: Samples of the slice a coarsened size's 30-second telemetry is measured on (~0.5 GB of text).
SLICE_SAMPLES = 600_000
#: Bytes of telemetry text per sample (measured on the simulator: DCGM text and nvidia-smi CSV).
TELEMETRY_BYTES_PER_SAMPLE = 950
KUEUE_INTERVAL_S = 900
SQLITE_ROWS = 5_000_000
#: Slot-snapshot rows per GPU-day the simulator writes (5-minute snapshots, primary + backfill rows).
ROWS_PER_GPU_DAY = 551
SQLITE_MONTH = (dt.date(2025, 8, 1), dt.date(2025, 8, 31))
SQLITE_DAY = dt.date(2025, 8, 15)
ES_DOCS = 50_000
ES_PAGE_SIZE = 10_000
ES_INDEX = "adstash-ospool-job-history"
BASELINE_MAX_GPUS = 1000
REPEATS = 5
#: Rounds of the telemetry-format comparison (a 10,000-GPU day's text takes a minute a round).
FORMAT_ROUNDS = 2
PLOT_PREFIX = "plots/"
TELEMETRY_ASSETS = ("raw/gpu_telemetry", "clean/gpu_samples")
MIB = 1024 * 1024
# DuckDB's buffer memory in the measured run (the process's database, all its connections together;
# sorts and joins beyond it spill to disk), the setting the README recommends for pools of thousands
# of GPUs.
DUCKDB_MEMORY_LIMIT = "1GB"


@dataclass(frozen=True)
class BenchConfig:
    gpus: tuple[int, ...] = DEFAULT_GPUS
    days: int = DEFAULT_DAYS
    out: str = "bench.json"
    work_dir: str | None = None  #: keep the scratch data here (and reuse simulations that match)
    telemetry_interval_s: int = TELEMETRY_INTERVAL_S
    max_telemetry_samples: int = MAX_TELEMETRY_SAMPLES
    sqlite_rows: int = SQLITE_ROWS
    es_docs: int = ES_DOCS
    es_page_size: int = ES_PAGE_SIZE
    baseline_max_gpus: int = BASELINE_MAX_GPUS
    repeats: int = REPEATS
    profile: bool = False  #: run each size's pipeline under pyinstrument (timings then include its cost)
    compare_zstd: bool = False  #: the telemetry formats also from the day's text compressed with zstd
    duckdb_memory_limit: str = DUCKDB_MEMORY_LIMIT  #: the run's GPU_PIPELINE_DUCKDB_MEMORY_LIMIT ("" = none)
    seed: int = SEED
    start: dt.date = START

    def validate(self) -> None:
        if not self.gpus or any(g < 1 for g in self.gpus):
            raise ValueError(f"--gpus needs positive sizes, got {self.gpus}")
        if self.days < 1:
            raise ValueError(f"--days must be >= 1, got {self.days}")
        if self.telemetry_interval_s < 0:
            raise ValueError("--telemetry-interval must be >= 0")
        if self.repeats < 1:
            raise ValueError("--repeats must be >= 1")
        if not 1 <= self.es_page_size <= 10_000:
            raise ValueError("--es-page-size must be in 1..10000")
        if self.profile and importlib.util.find_spec("pyinstrument") is None:
            raise ValueError("--profile needs pyinstrument: pip install -e '.[profile]'")


def _gpus_list(value: str | Iterable[int]) -> tuple[int, ...]:
    if isinstance(value, str):
        try:
            return tuple(int(v) for v in value.replace(" ", "").split(",") if v)
        except ValueError as exc:
            raise ValueError(f"--gpus takes a comma-separated list of integers, got {value!r}") from exc
    return tuple(int(v) for v in value)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """A :class:`BenchConfig` from parsed ``gpu-pipeline bench`` arguments (absent ones: defaults)."""
    d = BenchConfig()
    get = lambda name, default: default if getattr(args, name, None) is None else getattr(args, name)  # noqa: E731
    return BenchConfig(
        gpus=_gpus_list(get("gpus", d.gpus)),
        days=int(get("days", d.days)),
        out=str(get("out", d.out)),
        work_dir=get("work_dir", d.work_dir),
        telemetry_interval_s=int(get("telemetry_interval", d.telemetry_interval_s)),
        max_telemetry_samples=int(get("max_telemetry_samples", d.max_telemetry_samples)),
        sqlite_rows=int(get("sqlite_rows", d.sqlite_rows)),
        es_docs=int(get("es_docs", d.es_docs)),
        es_page_size=int(get("es_page_size", d.es_page_size)),
        baseline_max_gpus=int(get("baseline_max_gpus", d.baseline_max_gpus)),
        repeats=int(get("repeats", d.repeats)),
        profile=bool(get("profile", d.profile)),
        compare_zstd=bool(get("compare_zstd", d.compare_zstd)),
        duckdb_memory_limit=str(get("duckdb_memory_limit", d.duckdb_memory_limit)),
        seed=int(get("seed", d.seed)),
    )


# -- small helpers -------------------------------------------------------------------------------


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def _best_of(n: int, fn: Callable[[], Any]) -> tuple[float, list[float], Any]:
    runs, value = [], None
    for _ in range(n):
        s, value = _timed(fn)
        runs.append(s)
    return min(runs), runs, value


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else round(float(x), nd)


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def _days(start: dt.date, n: int) -> list[dt.date]:
    return [start + dt.timedelta(days=i) for i in range(n)]


def _machine() -> dict[str, Any]:
    import duckdb
    import pandas as pd
    import pyarrow as pa

    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    except (ValueError, OSError, AttributeError):
        mem = None
    try:
        from importlib.metadata import version

        dagster_version = version("dagster")
    except Exception:  # noqa: BLE001
        dagster_version = None
    return {
        "cpus": os.cpu_count(),
        "memory_gib": _r(mem, 1),
        "load_average_1m_at_start": _r(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "dagster": dagster_version,
        "duckdb": duckdb.__version__,
        "pandas": pd.__version__,
        "pyarrow": pa.__version__,
    }


# -- simulation ----------------------------------------------------------------------------------


def choose_telemetry_interval(
    gpus: int, days: int, requested_s: int, max_samples: int, free_bytes: int | None = None
) -> tuple[int, str | None]:
    """The telemetry cadence for a size: ``requested_s`` unless its sample count exceeds
    ``max_samples`` or its files would not fit in ``free_bytes`` (with 1 GiB to spare); then the
    first coarser step of :data:`TELEMETRY_STEPS_S` that fits. Returns (seconds, reason or None)."""
    if requested_s == 0:
        return 0, None
    candidates = [requested_s] + [s for s in TELEMETRY_STEPS_S if s > requested_s]
    for step in candidates:
        samples = gpus * days * 86400 // step
        need = samples * TELEMETRY_BYTES_PER_SAMPLE * 1.2 + 1024**3
        if samples <= max_samples and (free_bytes is None or need <= free_bytes):
            if step == requested_s:
                return step, None
            full = gpus * days * 86400 // requested_s
            return step, (
                f"{gpus} GPUs x {days} day(s): telemetry every {step} s instead of {requested_s} s "
                f"({full:,} samples, ~{full * TELEMETRY_BYTES_PER_SAMPLE / 1024**3:.1f} GiB of text at "
                f"{requested_s} s exceed the benchmark's budget of {max_samples:,} samples per size"
                + ("" if free_bytes is None else f" or the {free_bytes / 1024**3:.0f} GiB free")
                + "); the telemetry steps' cost at "
                f"{requested_s} s is measured on a slice of the GPUs and scaled to all of them"
            )
    step = candidates[-1]
    return step, f"{gpus} GPUs x {days} day(s): telemetry at the coarsest step tried ({step} s); still over budget"


def _simulate(dest: Path, sim_cfg: Any, reuse: bool) -> tuple[dict, float, bool]:
    """Run the simulator into ``dest`` (reusing an identical earlier run when ``reuse``)."""
    from gpu_pipeline.lib.simulate import simulate

    marker = dest / "bench-sim.json"
    key = {k: (v.isoformat() if isinstance(v, dt.date) else v) for k, v in asdict(sim_cfg).items()}
    if reuse and marker.is_file():
        saved = json.loads(marker.read_text())
        if saved.get("config") == key and (dest / "truth" / "summary.json").is_file():
            return saved["summary"], saved["wall_s"], True
    wall, summary = _timed(lambda: simulate(dest, sim_cfg))
    summary = {k: v for k, v in summary.items() if k not in ("files", "telemetry_samples_by_file")}
    marker.write_text(json.dumps({"config": key, "summary": summary, "wall_s": wall}, default=str))
    return summary, wall, False


# -- the Dagster run (child process) -------------------------------------------------------------


def bench_env(base: Path, start: dt.date) -> dict[str, str]:
    """The environment of the pipeline run: the demo's (``cli.demo_env``) on ``base``, without the
    Terapixel render farm (not part of the simulated pool)."""
    from gpu_pipeline.cli import demo_env

    env = demo_env(base, start)
    env.pop("GPU_PIPELINE_TERAPIXEL_DIR", None)
    return env


#: The variables that set up the process's DuckDB (:func:`gpu_pipeline.lib.db.connect`).
DUCKDB_VARIABLES = (ENV_MEMORY_LIMIT, ENV_THREADS, ENV_BLOCK_MEMORY, ENV_TEMP_DIR)


def _child_env(base: Path, start: dt.date, duckdb_memory_limit: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_PIPELINE_", "DAGSTER_"))}
    env.update(bench_env(base, start))
    if os.environ.get(ENV_THREADS):  # the operator's cap on DuckDB's threads holds for the measured run too
        env[ENV_THREADS] = os.environ[ENV_THREADS]
    if duckdb_memory_limit:
        env[ENV_MEMORY_LIMIT] = duckdb_memory_limit
    return env


@contextlib.contextmanager
def run_settings(child_env: dict[str, str]) -> Iterator[None]:
    """The measured run's DuckDB settings (``child_env``: the run's environment, :func:`_child_env`):
    its memory limit and the threads that follow from it, its block memory and spill folder, for the
    library calls this process times beside the run. The ratios and the telemetry comparisons run
    under the limits the run had, not under DuckDB's defaults (all of the machine's memory, one thread
    a core) or the operator's own settings, which the run does not take."""
    from gpu_pipeline.lib.envutil import scoped_env

    with contextlib.ExitStack() as stack:
        for name in DUCKDB_VARIABLES:
            stack.enter_context(scoped_env(name, child_env.get(name)))
        yield


def _duckdb_settings() -> dict[str, Any]:
    """The memory limit and threads a connection made now gets."""
    from gpu_pipeline.lib.db import connect

    con = connect()
    try:
        limit, threads = con.execute("SELECT current_setting('memory_limit'), current_setting('threads')").fetchone()
    finally:
        con.close()
    return {"duckdb_memory_limit": limit, "duckdb_threads": int(threads)}


def _md_value(v: Any) -> Any:
    return getattr(v, "value", v)


def _run_summary(instance: Any, asset_graph: Any) -> dict[str, Any]:
    """Per-step wall seconds and rows from the event log of the instance's (only) run."""
    records = instance.get_run_records(limit=1)
    if not records:
        return {"runs_in_instance": 0, "steps": []}
    run = records[0].dagster_run
    starts: dict[str, float] = {}
    ends: dict[str, tuple[float, str]] = {}
    step_starts: dict[str, int] = {}
    worker_starts: dict[str, float] = {}
    assets_of: dict[str, dict[str, dict[str, Any]]] = {}
    failed_checks: list[str] = []
    run_start = run_end = None
    for rec in instance.all_logs(run.run_id):
        if not rec.is_dagster_event:
            continue
        ev = rec.dagster_event
        et = ev.event_type_value
        if et in ("RUN_START", "PIPELINE_START"):
            run_start = rec.timestamp
        elif et in ("RUN_SUCCESS", "RUN_FAILURE", "PIPELINE_SUCCESS", "PIPELINE_FAILURE"):
            run_end = rec.timestamp
        elif et == "STEP_WORKER_STARTING":
            worker_starts.setdefault(rec.step_key, rec.timestamp)
        elif et == "STEP_START":
            starts.setdefault(rec.step_key, rec.timestamp)
            step_starts[rec.step_key] = step_starts.get(rec.step_key, 0) + 1
        elif et in ("STEP_SUCCESS", "STEP_FAILURE"):
            ends[rec.step_key] = (rec.timestamp, "success" if et == "STEP_SUCCESS" else "failure")
        elif et == "ASSET_MATERIALIZATION":
            mat = ev.event_specific_data.materialization
            key = mat.asset_key.to_user_string()
            md = {k: _md_value(v) for k, v in mat.metadata.items()}
            # One event per day of the range, each with that day's figures: summed.
            totals = assets_of.setdefault(rec.step_key, {}).setdefault(key, {"rows_out": None, "rows_in": None})
            for name, field in (("rows_out", "dagster/row_count"), ("rows_in", "rows_in")):
                if md.get(field) is not None:
                    totals[name] = (totals[name] or 0) + md[field]
        elif et == "ASSET_CHECK_EVALUATION":
            data = ev.event_specific_data
            if not getattr(data, "passed", True):
                failed_checks.append(f"{data.asset_key.to_user_string()}:{data.check_name}")

    rows_out_by_asset = {k: v["rows_out"] for a in assets_of.values() for k, v in a.items()}
    steps = []
    for step_key, t0 in sorted(starts.items(), key=lambda kv: kv[1]):
        t1, status = ends.get(step_key, (None, "unfinished"))
        assets = assets_of.get(step_key, {})
        counted = [int(v["rows_out"]) for v in assets.values() if v["rows_out"] is not None]
        rows_out = sum(counted) if counted else None
        reported_in = [v["rows_in"] for v in assets.values() if v["rows_in"] is not None]
        if reported_in:
            rows_in, rows_in_source = int(max(reported_in)), "metadata rows_in"
        else:
            parents: set[str] = set()
            for key in assets:
                node = asset_graph.get(_asset_key(key)) if asset_graph is not None else None
                if node is not None:
                    parents |= {p.to_user_string() for p in node.parent_keys}
            parents -= set(assets)
            known = [rows_out_by_asset[p] for p in parents if rows_out_by_asset.get(p) is not None]
            if known:
                rows_in, rows_in_source = int(sum(known)), "upstream rows (" + ", ".join(sorted(parents)) + ")"
            else:
                rows_in, rows_in_source = None, "source files" if not parents else None
        steps.append(
            {
                "step": step_key,
                "assets": {k: v["rows_out"] for k, v in sorted(assets.items())},
                "status": status,
                "started_at": t0,
                "wall_s": None if t1 is None else t1 - t0,
                "worker_start_s": (t0 - worker_starts[step_key]) if step_key in worker_starts else None,
                "step_starts": step_starts.get(step_key, 0),
                "rows_in": rows_in,
                "rows_in_source": rows_in_source,
                "rows_out": rows_out,
            }
        )
    return {
        "run_id": run.run_id,
        "status": str(run.status.value),
        "runs_in_instance": len(instance.get_run_records()),
        "run_wall_s": (run_end - run_start) if run_start and run_end else None,
        "steps": steps,
        "failed_checks": sorted(set(failed_checks)),
    }


class _RssSampler:
    """Samples the resident set size of this process plus its live child processes (the plot
    helper) every ``interval`` s (Linux ``/proc``), so that the peak of the whole run -- and of each
    step -- counts every process working at that moment; and with it the CPU time they have used
    (user + system: this process's own, its reaped children's, and its live descendants'), so that a
    step's CPU seconds can be told from its wall seconds. On a shared two-core machine the wall of a
    step moves with the disk and the neighbours; its CPU time much less."""

    CHILDREN_EVERY = 10

    def __init__(self, interval: float = 0.05):
        import threading

        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self.cpu_samples: list[tuple[float, float]] = []  # (time, CPU seconds so far), never decreasing
        self._stop = threading.Event()
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _statm(self, pid: str) -> int:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * self._page

    def _children(self, pid: str) -> list[str]:
        kids: list[str] = []
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as fh:
                    kids += fh.read().split()
        except OSError:  # the process (or a thread) ended meanwhile
            pass
        return kids

    def _descendants(self) -> list[str]:
        found: list[str] = []
        pending = self._children("self")
        while pending:
            pid = pending.pop()
            found.append(pid)
            pending += self._children(pid)
        return found

    @staticmethod
    def _tree_sum(read: Callable[[str], int], descendants: list[str]) -> int | None:
        """``read`` of this process plus that of each descendant still there; None when this
        process's own cannot be read."""
        try:
            total = read("self")
        except (OSError, ValueError, IndexError):
            return None
        for pid in descendants:
            try:
                total += read(pid)
            except (OSError, ValueError, IndexError):  # ended meanwhile
                continue
        return total

    def _rss(self, descendants: list[str]) -> int | None:
        return self._tree_sum(self._statm, descendants)

    def _cpu_ticks(self, pid: str) -> int:
        """A process's CPU ticks: its own (utime + stime) and those of its children it has waited
        for (cutime + cstime). Each ended process is so counted once, in its live parent, whoever
        that is in the tree; a live one by itself."""
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()  # from field 3 (the state) on: utime is field 14
        return int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])

    def _cpu(self, descendants: list[str]) -> float | None:
        ticks = self._tree_sum(self._cpu_ticks, descendants)
        return None if ticks is None else ticks / self._tick

    def _run(self) -> None:
        # The process tree is walked every CHILDREN_EVERY samples only: listing the children of each
        # of the run's ~50 threads every 50 ms took ~3 % of a core, from the run it measures.
        descendants: list[str] = []
        tick = 0
        while not self._stop.is_set():
            if tick % self.CHILDREN_EVERY == 0:
                descendants = self._descendants()
            tick += 1
            rss = self._rss(descendants)
            if rss is None:
                return
            now = time.time()
            self.samples.append((now, rss))
            cpu = self._cpu(descendants)
            if cpu is not None:
                # a child that ended but is not yet waited for drops out of the sum until it is:
                # the series is kept from going back
                last = self.cpu_samples[-1][1] if self.cpu_samples else cpu
                self.cpu_samples.append((now, max(cpu, last)))
            self._stop.wait(self.interval)

    def peak(self) -> int | None:
        return max((rss for _, rss in self.samples), default=None)

    def current(self) -> int | None:
        """The resident set size of this process now (its children not counted)."""
        return self._rss([])

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def cpu_at(self, t: float) -> float | None:
        """CPU seconds used by ``t``, interpolated between the samples either side of it (the first
        or last sample outside their span); None without samples."""
        samples = self.cpu_samples
        if not samples:
            return None
        i = bisect.bisect_left(samples, (t, -math.inf))
        if i == 0:
            return samples[0][1]
        if i == len(samples):
            return samples[-1][1]
        (ta, ca), (tb, cb) = samples[i - 1], samples[i]
        return ca if tb <= ta else ca + (cb - ca) * (t - ta) / (tb - ta)

    def cpu_between(self, t0: float, t1: float) -> float | None:
        """CPU seconds used from ``t0`` to ``t1`` (to the sampling interval's resolution)."""
        a, b = self.cpu_at(t0), self.cpu_at(t1)
        return None if a is None or b is None else max(0.0, b - a)

    def peak_between(self, t0: float, t1: float) -> int | None:
        """The largest sample taken from ``t0`` to ``t1``; for a span shorter than the sampling
        interval, which may hold none, the larger of the samples just before and just after it."""
        inside = [rss for t, rss in self.samples if t0 <= t <= t1]
        if inside:
            return max(inside)
        before = [rss for t, rss in self.samples if t < t0][-1:]
        after = [rss for t, rss in self.samples if t > t1][:1]
        return max(before + after) if before or after else None


def _asset_key(user_string: str) -> Any:
    import dagster as dg

    return dg.AssetKey(user_string.split("/"))


def _cpu_used() -> float:
    """CPU seconds (user + system) of this process and of its children waited for, so far."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _child_main(argv: list[str]) -> int:
    """``python -m gpu_pipeline.bench _pipeline BASE START END OUT_JSON [--profile FILE]``: one range
    run through Dagster with the environment already set; writes its figures to OUT_JSON."""
    start, end, out = dt.date.fromisoformat(argv[1]), dt.date.fromisoformat(argv[2]), Path(argv[3])
    profile_to = Path(argv[5]) if len(argv) > 5 and argv[4] == "--profile" else None
    from gpu_pipeline.cli import prepare_dagster_home, run_pipeline

    prepare_dagster_home(Path(os.environ["DAGSTER_HOME"]))
    profiler = None
    if profile_to is not None:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.005)
        profiler.start()
    cpu_before = _cpu_used()
    with _RssSampler() as sampler:
        wall, ok = _timed(lambda: run_pipeline(start, end))
    cpu = _cpu_used() - cpu_before  # misses helpers still alive at the end: the sampler has them
    if len(sampler.cpu_samples) > 1:
        cpu = max(cpu, sampler.cpu_samples[-1][1] - sampler.cpu_samples[0][1])
    self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    children_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    if profiler is not None:
        profiler.stop()
        profile_to.write_text(profiler.output_text(unicode=False, color=False, show_all=False))

    import dagster as dg

    from gpu_pipeline.definitions import defs

    try:
        graph = defs().resolve_asset_graph()
    except Exception:  # noqa: BLE001 - the figures matter more than the rows-in attribution
        graph = None
    with dg.DagsterInstance.get() as instance:
        summary = _run_summary(instance, graph)
    for step in summary["steps"]:
        if step.get("wall_s") is not None:
            peak = sampler.peak_between(step["started_at"], step["started_at"] + step["wall_s"])
            step["peak_rss_mib"] = None if peak is None else peak / MIB
            step["cpu_s"] = sampler.cpu_between(step["started_at"], step["started_at"] + step["wall_s"])
    from gpu_pipeline.lib import db

    con = db.connect()  # the settings the run's DuckDB had: the same environment, the same rule
    duckdb_threads, duckdb_memory = con.execute(
        "SELECT current_setting('threads'), current_setting('memory_limit')").fetchone()
    con.close()
    summary.update(
        duckdb_threads=int(duckdb_threads),
        duckdb_memory_limit=duckdb_memory,
        success=bool(ok),
        call_wall_s=wall,
        call_cpu_s=cpu,
        peak_rss_bytes={"self": self_rss, "children": children_rss, "process_tree": sampler.peak() or 0},
    )
    out.write_text(json.dumps(summary, default=str))
    return 0 if ok else 1


def _run_pipeline_child(base: Path, start: dt.date, end: dt.date, profile_to: Path | None,
                        duckdb_memory_limit: str = DUCKDB_MEMORY_LIMIT) -> dict[str, Any]:
    out = base / "bench-run.json"
    log = base / "bench-run.log"
    out.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "gpu_pipeline.bench", "_pipeline", str(base), start.isoformat(), end.isoformat(),
            str(out)]
    if profile_to is not None:
        argv += ["--profile", str(profile_to)]
    with open(log, "wb") as fh:
        wall, proc = _timed(lambda: subprocess.run(argv, env=_child_env(base, start, duckdb_memory_limit), stdout=fh, stderr=subprocess.STDOUT,
                                                   check=False))
    if not out.is_file():
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the pipeline run for {base} wrote no figures (exit {proc.returncode}):\n{tail}")
    summary = json.loads(out.read_text())
    summary["process_wall_s"] = wall
    summary["log"] = str(log)
    return summary


# -- the same computation three ways: pipeline, baseline, bare scan --------------------------------


def _bare_queries(files: list[str], start: dt.datetime, end: dt.datetime) -> dict[str, str]:
    """The bound for the metric SQL: each table's columns that the pipeline's query reads, over the rows
    it reads (the window and the hour before it, as the states and allocation read them for the first
    bucket's carried snapshot), in one scan and one GROUP BY, without the bucket assignment, the
    carry, the dropout reasons or the output's order. The states' scan gives each (bucket, GPU) its
    winner's key (DESIGN 5.1's rank, then the latest snapshot) and counts every other column the
    state SQL reads, so that each is read and decoded as there; it does not carry the winner's
    columns through the aggregation (``arg_max`` of them all takes longer than the pipeline's way:
    winners by row, their columns read back)."""
    from gpu_pipeline.lib.allocation import ALLOCATION_COLUMNS
    from gpu_pipeline.lib.states import LOOKBACK, STATE_COLUMNS

    lookback_s = int(LOOKBACK.total_seconds())
    window = (f"snapshot_utc >= CAST($start AS TIMESTAMPTZ) - INTERVAL {lookback_s} SECOND "
              "AND snapshot_utc < CAST($end AS TIMESTAMPTZ)")
    bucket = "(epoch_us(snapshot_utc) - epoch_us(CAST($start AS TIMESTAMPTZ))) // 300000000"
    # DESIGN 5.1's rank: claimed primary > claimed backfill > unclaimed primary > other primary state >
    # unclaimed backfill; the latest snapshot within a rank (the rank above 2^51 us, 71 years)
    rank = """CASE WHEN NOT is_backfill_slot AND slot_state = 'Claimed' THEN 5
                   WHEN is_backfill_slot AND slot_state = 'Claimed' THEN 4
                   WHEN NOT is_backfill_slot AND slot_state = 'Unclaimed' THEN 3
                   WHEN NOT is_backfill_slot THEN 2
                   WHEN slot_state = 'Unclaimed' THEN 1 ELSE 0 END"""
    key = f"({rank})::BIGINT * {1 << 51} + epoch_us(snapshot_utc)"
    counted = ", ".join(f"count({c}) AS n_{c}" for c in STATE_COLUMNS if c not in ("gpu_id", "snapshot_utc"))
    return {
        # state: the winner's key per (bucket, GPU), every column the state reads read
        "states": f"""
            SELECT {bucket} AS b, gpu_id, max({key}) AS winner_key, {counted}
            FROM (SELECT {", ".join(STATE_COLUMNS)} FROM read_parquet($files)) WHERE {window} GROUP BY ALL""",
        # allocation: unique claimed / capacity GPUs per (bucket, tier, device)
        "allocation": f"""
            SELECT {bucket} AS b, tier, device_name,
                   count(DISTINCT gpu_id) FILTER (WHERE slot_state = 'Claimed') AS claimed,
                   count(DISTINCT gpu_id) FILTER (WHERE slot_state IN ('Claimed', 'Unclaimed')) AS total
            FROM (SELECT {", ".join(ALLOCATION_COLUMNS)} FROM read_parquet($files)) WHERE {window} GROUP BY ALL""",
    }


def _bare_scan_fns(files: list[str], start: dt.datetime, end: dt.datetime) -> dict[str, Callable[[], int]]:
    """The bare scans, by name: each returns its row count."""
    from gpu_pipeline.lib.store import connect

    def scan(sql: str) -> Callable[[], int]:
        def go() -> int:
            con = connect()
            try:
                return con.sql(sql, params={"files": files, "start": start, "end": end}).to_arrow_table().num_rows
            finally:
                con.close()
        return go

    return {name: scan(sql) for name, sql in _bare_queries(files, start, end).items()}


def _best_interleaved(n: int, fns: dict[str, Callable[[], Any]]) -> dict[str, tuple[float, list[float], Any]]:
    """Best of ``n`` rounds for each function, a round running each once in turn: a change of the
    machine's load during the measurement falls on all of them alike, not on whichever ran last."""
    runs: dict[str, list[float]] = {name: [] for name in fns}
    values: dict[str, Any] = {}
    for _ in range(n):
        for name, fn in fns.items():
            s, values[name] = _timed(fn)
            runs[name].append(s)
    return {name: (min(r), r, values[name]) for name, r in runs.items()}


def compare_with_pipeline(
    pipe_states: Any, pipe_buckets: Any, pipe_daily: Any, base_states: Any, base_buckets: Any, base_daily: Any,
    tol: float = 1e-9,
) -> dict[str, Any]:
    """Mismatch counts between the pipeline's tables (Arrow or pandas) and the baseline's (pandas):
    per (bucket, GPU) state columns, per (bucket, tier, device) counts and pct, and the daily
    report. ``equal`` is true when every count is 0."""
    import numpy as np
    import pandas as pd

    def pdf(t: Any) -> pd.DataFrame:
        return t.to_pandas() if hasattr(t, "to_pandas") and not isinstance(t, pd.DataFrame) else t

    def obj(s: pd.Series) -> pd.Series:
        return s.astype(object).where(s.notna(), None)

    res: dict[str, Any] = {}
    ps, bs = pdf(pipe_states), pdf(base_states)
    key = ["bucket_start_utc", "gpu_id"]
    m = ps.merge(bs, on=key, how="outer", suffixes=("_p", "_b"), indicator=True)
    res["state_rows"] = {"pipeline": len(ps), "baseline": len(bs), "unmatched": int((m["_merge"] != "both").sum())}
    both = m[m["_merge"] == "both"]
    for col in ("host", "device_name", "state", "tier", "slot_name", "slot_state", "global_job_id", "remote_owner",
                "snapshot_utc", "na_reason", "n_slot_rows"):
        a, b = obj(both[f"{col}_p"]), obj(both[f"{col}_b"])
        same = (a == b) | (a.isna() & b.isna())
        res[f"state_{col}_mismatches"] = int((~same).sum())
    a, b = both["gpu_usage_pct_p"].astype(float).to_numpy(), both["gpu_usage_pct_b"].astype(float).to_numpy()
    res["state_gpu_usage_pct_mismatches"] = int((~np.isclose(a, b, rtol=0, atol=tol, equal_nan=True)).sum())

    pb, bb = pdf(pipe_buckets), pdf(base_buckets)
    key = ["bucket_start_utc", "tier", "device_name"]
    m = pb.merge(bb, on=key, how="outer", suffixes=("_p", "_b"), indicator=True)
    res["allocation_rows"] = {"pipeline": len(pb), "baseline": len(bb), "unmatched": int((m["_merge"] != "both").sum())}
    both = m[m["_merge"] == "both"]
    for col in ("claimed_gpus", "total_gpus"):
        res[f"allocation_{col}_mismatches"] = int((both[f"{col}_p"].astype(int) != both[f"{col}_b"].astype(int)).sum())
    a, b = both["allocation_pct_p"].astype(float).to_numpy(), both["allocation_pct_b"].astype(float).to_numpy()
    res["allocation_pct_mismatches"] = int((~np.isclose(a, b, rtol=0, atol=tol, equal_nan=True)).sum())

    pd_, bd = pdf(pipe_daily), pdf(base_daily)
    m = pd_.merge(bd, on=["tier", "device_name"], how="outer", suffixes=("_p", "_b"), indicator=True)
    res["daily_rows"] = {"pipeline": len(pd_), "baseline": len(bd), "unmatched": int((m["_merge"] != "both").sum())}
    both = m[m["_merge"] == "both"]
    bad = 0
    for col in ("allocation_pct", "avg_claimed_gpus", "avg_total_gpus"):
        a, b = both[f"{col}_p"].astype(float).to_numpy(), both[f"{col}_b"].astype(float).to_numpy()
        bad += int((~np.isclose(a, b, rtol=0, atol=tol, equal_nan=True)).sum())
    for col in ("buckets", "buckets_with_capacity", "buckets_expected"):
        bad += int((both[f"{col}_p"].astype(int) != both[f"{col}_b"].astype(int)).sum())
    res["daily_mismatches"] = bad
    counts = [v for k, v in res.items() if k.endswith("_mismatches")]
    counts += [v["unmatched"] + abs(v["pipeline"] - v["baseline"]) for k, v in res.items() if k.endswith("_rows")]
    res["equal"] = not any(counts)
    return res


def _ratios(base: Path, day: dt.date, cfg: BenchConfig, gpus: int) -> dict[str, Any]:
    from gpu_pipeline.lib import baseline
    from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS
    from gpu_pipeline.lib.store import Store
    from gpu_pipeline.lib.timeutil import day_window

    store = Store(base / "data")
    d, prev = day.isoformat(), (day - dt.timedelta(days=1)).isoformat()
    start, end = day_window(day, SIM_TZ)
    files = store.files(CLEAN_SLOT_SNAPSHOTS, [prev, d])
    # the rows the states and allocation read: the day's and the hour before it (LOOKBACK), of the
    # two days' files
    out: dict[str, Any] = {"day": d, "clean_files": len(files), "file_rows": _parquet_rows(files),
                           "input_rows": _rows_read(files, start, end), **_duckdb_settings()}

    # The pipeline: exactly the library calls the gpu_states and allocation assets make.
    def states_only() -> Any:
        from gpu_pipeline.lib.states import states_for_day

        return states_for_day(store, d, start, end)

    def allocation_only() -> Any:
        from gpu_pipeline.lib.allocation import allocation_for_day

        return allocation_for_day(store, d, start, end)

    bare_fns = _bare_scan_fns(files, start, end)
    timed = _best_interleaved(cfg.repeats, {"states": states_only, "allocation": allocation_only,
                                            **{f"bare_{k}": fn for k, fn in bare_fns.items()}})
    s_best, s_runs, states = timed["states"]
    a_best, a_runs, (buckets, daily) = timed["allocation"]
    pipeline = {"states_s": s_best, "allocation_s": a_best, "seconds": s_best + a_best,
                "states_runs_s": s_runs, "allocation_runs_s": a_runs,
                "rows_out": {"gpu_states": states.num_rows, "allocation_buckets": buckets.num_rows,
                             "allocation_daily": daily.num_rows}}
    out["pipeline"] = pipeline

    # The limit: a bare scan + GROUP BY over the same Parquet columns.
    bare: dict[str, Any] = {}
    for name in bare_fns:
        best, runs, rows = timed[f"bare_{name}"]
        bare[name] = {"seconds": best, "runs_s": runs, "rows": rows}
    bare["seconds"] = bare["states"]["seconds"] + bare["allocation"]["seconds"]
    bare["interleaved"] = True
    out["bare_scan"] = bare
    out["pipeline_vs_bare_scan"] = {
        "states": _ratio(s_best, bare["states"]["seconds"]),
        "allocation": _ratio(a_best, bare["allocation"]["seconds"]),
        "states_plus_allocation": _ratio(pipeline["seconds"], bare["seconds"]),
    }

    # The baseline: the original tool's pandas approach, on the same files.
    if gpus > cfg.baseline_max_gpus:
        out["baseline"] = {"skipped": f"{gpus} GPUs > --baseline-max-gpus {cfg.baseline_max_gpus}"}
        return out
    load_s, df = _timed(lambda: baseline.load_clean_parquet(files))
    st_s, b_states = _timed(lambda: baseline.states_baseline(df, start, end))
    al_s, (b_buckets, b_daily) = _timed(lambda: baseline.allocation_baseline(df, start, end))
    total = load_s + st_s + al_s
    out["baseline"] = {"load_s": load_s, "states_s": st_s, "allocation_s": al_s, "seconds": total,
                       "rows_out": {"gpu_states": len(b_states), "allocation_buckets": len(b_buckets),
                                    "allocation_daily": len(b_daily)}}
    sqlite_dir = base / "sources" / "condor"
    if sqlite_dir.is_dir():
        sq_s, sq_df = _timed(lambda: baseline.load_sqlite_window(sqlite_dir, start - baseline.LOOKBACK, end, SIM_TZ))
        out["baseline"]["sqlite_load_s"] = sq_s
        out["baseline"]["sqlite_rows"] = len(sq_df)
        del sq_df
    out["baseline_vs_pipeline_speedup"] = _ratio(total, pipeline["seconds"])
    out["equal_to_pipeline"] = compare_with_pipeline(states, buckets, daily, b_states, b_buckets, b_daily)
    # The same, with the tool's literal loop nesting for the allocation (tier -> device -> bucket).
    tool_s, (t_buckets, _) = _timed(lambda: baseline.allocation_baseline(df, start, end, loop_order="tool"))
    tool_total = load_s + st_s + tool_s
    out["baseline"]["allocation_tool_loop_order_s"] = tool_s
    out["baseline"]["seconds_tool_loop_order"] = tool_total
    out["baseline"]["tool_loop_order_equal"] = bool(
        t_buckets[["tier", "device_name", "claimed_gpus", "total_gpus"]].equals(
            b_buckets[["tier", "device_name", "claimed_gpus", "total_gpus"]]))
    out["baseline_tool_loop_order_vs_pipeline_speedup"] = _ratio(tool_total, pipeline["seconds"])
    return out


def _rows_read(files: list[str], start: dt.datetime, end: dt.datetime) -> int:
    """Clean slot rows of ``files`` from the states' LOOKBACK before ``start`` to ``end``."""
    from gpu_pipeline.lib.states import LOOKBACK
    from gpu_pipeline.lib.store import connect

    if not files:
        return 0
    con = connect()
    try:
        return con.execute("SELECT count(*) FROM read_parquet(?) WHERE snapshot_utc >= ? AND snapshot_utc < ?",
                           [files, start - LOOKBACK, end]).fetchone()[0]
    finally:
        con.close()


def peak_rss_mib(pipeline: dict[str, Any]) -> float:
    """The run's peak: of the process alone (``ru_maxrss``) or of the process tree (sampled: the run
    process plus its helper processes at the same moment), whichever is higher. ``children`` is left
    out: the kernel's figure for a spawned child counts the copy of the parent it was forked from."""
    rss = pipeline["peak_rss_mib"]
    return max(rss["self"], rss.get("process_tree", 0.0))


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else a / b


def _parquet_rows(files: list[str]) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


# -- one cluster size --------------------------------------------------------------------------------


def space_for(base: Path) -> int:
    """Bytes a size's simulation may take under ``base``: the disk's free space and what ``base``
    already holds (an earlier run's simulation, reused or replaced). Free space alone made a
    second run coarsen the telemetry its own earlier simulation had fitted."""
    held = sum(os.lstat(os.path.join(folder, name)).st_size for folder, _, names in os.walk(base) for name in names)
    return shutil.disk_usage(base).free + held


def bench_size(gpus: int, cfg: BenchConfig, scratch: Path, notes: list[str], reuse: bool,
               profile_dir: Path | None) -> dict[str, Any]:
    from gpu_pipeline.lib.simulate import SimConfig

    base = scratch / f"gpus-{gpus}-days-{cfg.days}"
    base.mkdir(parents=True, exist_ok=True)
    start = cfg.start
    end = start + dt.timedelta(days=cfg.days - 1)
    interval, why = choose_telemetry_interval(gpus, cfg.days, cfg.telemetry_interval_s, cfg.max_telemetry_samples,
                                              space_for(base))
    if why:
        notes.append(why)
    sim_cfg = SimConfig(start=start, end=end, gpus=gpus, seed=cfg.seed, timezone=SIM_TZ,
                        telemetry_interval_s=interval, kueue_interval_s=KUEUE_INTERVAL_S)
    _log(f"[{gpus} GPUs] simulating {start} .. {end} (telemetry every {interval} s)")
    summary, sim_wall, reused = _simulate(base / "sources", sim_cfg, reuse)
    for sub in ("data", "dagster_home"):
        shutil.rmtree(base / sub, ignore_errors=True)

    _log(f"[{gpus} GPUs] materializing {cfg.days} day(s) as one Dagster range run")
    profile_to = (profile_dir / f"profile-gpus-{gpus}.txt") if profile_dir is not None else None
    result: dict[str, Any] = {
        "gpus": gpus,
        "days": cfg.days,
        "gpu_days": gpus * cfg.days,
        "start": start.isoformat(),
        "end": end.isoformat(),
        "partition_timezone": SIM_TZ,
        "telemetry_interval_s": interval,
        "kueue_interval_s": KUEUE_INTERVAL_S,
        "simulation": {
            "wall_s": sim_wall,
            "reused": reused,
            "hosts": summary.get("hosts"),
            "gpus": summary.get("gpus"),
            "slot_rows": summary.get("slot_rows"),
            "snapshots": summary.get("snapshots"),
            "job_documents": summary.get("job_documents"),
            "epoch_documents": summary.get("epoch_documents"),
            "telemetry_samples": summary.get("telemetry_samples"),
            "bytes": {sub: _dir_bytes(base / "sources" / sub) for sub in ("condor", "jobs", "telemetry", "kueue")},
        },
    }
    try:
        run = _run_pipeline_child(base, start, end, profile_to, cfg.duckdb_memory_limit)
    except RuntimeError as exc:
        notes.append(f"{gpus} GPUs: the pipeline run crashed before reporting; see pipeline.error")
        result["pipeline"] = {"success": False, "error": str(exc), "steps": [], "log": str(base / "bench-run.log")}
        return result
    steps = run.get("steps", [])
    for s in steps:
        wall = s["wall_s"]
        s["wall_per_day_s"] = None if wall is None else wall / cfg.days
        cpu = s.get("cpu_s")
        s["cpu_per_day_s"] = None if cpu is None else cpu / cfg.days
        s["cores"] = None if cpu is None or not wall else cpu / wall  # CPU seconds per wall second
        rows = s["rows_in"] if s["rows_in"] else s["rows_out"]
        s["rows_per_s"] = None if not wall or rows is None else rows / wall
    run_wall = run.get("run_wall_s") or run["call_wall_s"]
    plot_s = sum(s["wall_s"] or 0 for s in steps if any(k.startswith(PLOT_PREFIX) for k in s["assets"]))
    tele_s = sum(s["wall_s"] or 0 for s in steps if any(k in TELEMETRY_ASSETS for k in s["assets"]))
    steps_sum = sum(s["wall_s"] or 0 for s in steps)
    pipeline = {
        "success": run["success"],
        "status": run.get("status"),
        "call_wall_s": run["call_wall_s"],
        "call_cpu_s": run.get("call_cpu_s"),
        "duckdb_threads": run.get("duckdb_threads"),
        "duckdb_memory_limit": run.get("duckdb_memory_limit"),
        "cpu_per_day_s": None if run.get("call_cpu_s") is None else run["call_cpu_s"] / cfg.days,
        "cores": None if run.get("call_cpu_s") is None or not run["call_wall_s"] else run["call_cpu_s"] / run["call_wall_s"],
        "process_wall_s": run["process_wall_s"],
        "run_wall_s": run_wall,
        "steps_wall_sum_s": steps_sum,
        "orchestration_overhead_s": run_wall - steps_sum,
        "launch_overhead_s": run["call_wall_s"] - run_wall,
        "runs_in_instance": run.get("runs_in_instance"),
        "steps_count": len(steps),
        "step_starts_total": sum(s["step_starts"] for s in steps),
        "per_day_s": run_wall / cfg.days,
        "per_day_excl_plots_s": (run_wall - plot_s) / cfg.days,
        "telemetry_steps_per_day_s": tele_s / cfg.days,
        "peak_rss_mib": {k: v / MIB for k, v in run["peak_rss_bytes"].items()},
        "failed_checks": run.get("failed_checks", []),
        "steps": steps,
        "log": run["log"],
    }
    if interval and interval != cfg.telemetry_interval_s and cfg.telemetry_interval_s:
        with run_settings(_child_env(base, start, cfg.duckdb_memory_limit)):
            measured = bench_telemetry_slice(gpus, cfg, scratch, reuse)
        # the run's telemetry steps replaced by the measured per-day cost at the requested cadence
        extra = measured["per_day_scaled_s"] * cfg.days + measured["one_time_s"] - tele_s
        pipeline["at_requested_telemetry_estimate"] = {
            "telemetry_interval_s": cfg.telemetry_interval_s,
            "per_day_s": (run_wall + extra) / cfg.days,
            "per_day_excl_plots_s": (run_wall - plot_s + extra) / cfg.days,
            "telemetry_per_day_s": measured["per_day_scaled_s"],
            "slice": measured,
            "method": (f"telemetry steps' library calls measured on {measured['gpus']} of the {gpus} GPUs at "
                       f"{cfg.telemetry_interval_s} s for one day ({measured['samples']:,} samples, "
                       f"{measured['seconds']:.2f} s on a second run; the first run's {measured['one_time_s']:.2f} s "
                       f"more counted once per run), scaled x {measured['scale']:g}; the samples' other reader "
                       "(efficiency) is not scaled"),
        }
    if profile_to is not None:
        pipeline["profile"] = str(profile_to)
        notes.append(f"{gpus} GPUs: the run was profiled (pyinstrument); its timings include the profiler's cost")
    if not run["success"]:
        notes.append(f"{gpus} GPUs: the pipeline run FAILED; see {run['log']}")

    result["pipeline"] = pipeline
    if run["success"]:
        _log(f"[{gpus} GPUs] state + allocation: pipeline vs baseline vs bare scan on {end}")
        with run_settings(_child_env(base, start, cfg.duckdb_memory_limit)):
            result["ratios"] = _ratios(base, end, cfg, gpus)
            result["telemetry_formats"] = bench_telemetry_formats(base, end, cfg)
    return result


# -- telemetry at the requested cadence, on a slice of the cluster ----------------------------------


def bench_telemetry_slice(gpus: int, cfg: BenchConfig, scratch: Path, reuse: bool) -> dict[str, Any]:
    """One day of telemetry at the requested cadence for as many of the GPUs as the sample budget
    allows, through the library calls the telemetry assets make (raw read, clean, both partitions
    written); the per-day cost for ``gpus`` is that times ``gpus / slice`` (the work is per file and
    per sample, both in proportion to GPUs)."""
    from gpu_pipeline.lib.samples import RawStream, write_clean_samples, write_raw_samples
    from gpu_pipeline.lib.simulate import SimConfig
    from gpu_pipeline.lib.store import Store
    from gpu_pipeline.lib.timeutil import day_window

    per_gpu = 86400 // cfg.telemetry_interval_s
    n = max(1, min(gpus, min(cfg.max_telemetry_samples, SLICE_SAMPLES) // per_gpu))
    dest = scratch / f"telemetry-slice-{n}"
    _log(f"[{gpus} GPUs] telemetry at {cfg.telemetry_interval_s} s: one day of {n} GPUs")
    summary, _, _ = _simulate(dest / "sources", SimConfig(
        start=cfg.start, end=cfg.start, gpus=n, seed=cfg.seed, timezone=SIM_TZ,
        telemetry_interval_s=cfg.telemetry_interval_s, kueue_interval_s=0), reuse)
    start, end = day_window(cfg.start, SIM_TZ)
    shutil.rmtree(dest / "data", ignore_errors=True)
    store = Store(dest / "data")
    day = cfg.start.isoformat()

    def both() -> int:
        written = write_raw_samples(store, day, RawStream(dest / "sources" / "telemetry", start, end, SIM_TZ, 0))
        write_clean_samples(store, day)
        return written.rows

    # The first run pays the process's one-time costs (imports, Arrow kernels' first use, the series
    # caches); a range run pays them once, not per day, and they do not grow with GPUs: the per-day
    # cost is the second run's, and the difference is counted once per run.
    first_s, _ = _timed(both)
    seconds, samples = _timed(both)
    scale = gpus / n
    return {"gpus": n, "telemetry_interval_s": cfg.telemetry_interval_s, "samples": samples,
            "simulated_samples": summary.get("telemetry_samples"), "seconds": seconds, "first_seconds": first_s,
            "one_time_s": max(0.0, first_s - seconds), "scale": scale,
            "per_day_scaled_s": seconds * scale, "samples_per_s": samples / seconds if seconds else None}


# -- the same telemetry day from another source format --------------------------------------------


def write_as_sampler_files(raw_file: Path, root: Path) -> int:
    """The samples of a raw telemetry partition written again in the NVML sampler's layout and file
    format (``root/nvml/HOST/nvml-YYYY-MM-DD.parquet``, one file per host and UTC day, in time order,
    written as the sampler writes them; no ``source_file``, which the sampler does not set). Returns
    the number of files. One host-day is held at a time."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from gpu_pipeline.lib.db import connect
    from gpu_pipeline.lib.nvml_sampler import day_file, write_parquet_atomic
    from gpu_pipeline.lib.schemas import GPU_SAMPLES, conform

    shutil.rmtree(root, ignore_errors=True)
    con = connect()
    try:
        reader = con.sql("SELECT * REPLACE (NULL::VARCHAR AS source_file) FROM read_parquet($f, hive_partitioning = false) "
                         "ORDER BY host, sample_utc, gpu_id", params={"f": str(raw_file)}).arrow()
        held: list[pa.Table] = []
        key: tuple[str, str] | None = None
        files = 0

        def write() -> None:
            nonlocal files
            if held and key is not None:
                path = day_file(root, key[0], dt.date.fromisoformat(key[1]))
                path.parent.mkdir(parents=True, exist_ok=True)
                write_parquet_atomic(conform(pa.concat_tables(held), GPU_SAMPLES), path)
                files += 1

        for batch in reader:
            table = pa.Table.from_batches([batch])
            days = pc.strftime(table["sample_utc"], format="%Y-%m-%d")
            keys = pc.binary_join_element_wise(pc.fill_null(table["host"], ""), days, "/")
            bounds = [0, *(np.flatnonzero(pc.not_equal(keys[1:], keys[:-1]).to_numpy(zero_copy_only=False)) + 1),
                      table.num_rows]
            for a, b in zip(bounds[:-1], bounds[1:], strict=True):
                host, day = str(keys[a]).rsplit("/", 1)
                if (host, day) != key:
                    write()
                    held, key = [], (host, day)
                held.append(table.slice(a, b - a))
        write()
    finally:
        con.close()
    return files


def write_zstd_copy(root: Path, start: dt.datetime, end: dt.datetime, dest: Path) -> None:
    """The telemetry files a raw step of [start, end) reads under ``root``, each compressed with zstd
    into ``dest`` (``<kind>/<host>/<name>.zst``, as a log rotation would leave them), streamed a few
    MB at a time."""
    import pyarrow as pa

    from gpu_pipeline.lib.telemetry import TelemetryDir

    for kind, host, path, _ in TelemetryDir(root, start, end, SIM_TZ, margin_days=0).tasks:
        out = dest / kind / host / f"{path.name}.zst"
        out.parent.mkdir(parents=True, exist_ok=True)
        with path.open("rb") as src, pa.output_stream(str(out), compression="zstd") as sink:
            while chunk := src.read(4 << 20):
                sink.write(chunk)


def _drop_cached(root: Path) -> None:
    """The cached pages of every file under ``root`` dropped (this machine's page cache only), so
    that the next read comes from the disk, as a nightly run's first read of its files does."""
    from gpu_pipeline.lib.telemetry import drop_cached_pages

    for path in root.rglob("*"):
        if path.is_file():
            with path.open("rb") as fh:
                drop_cached_pages(fh.fileno())


def bench_telemetry_formats(base: Path, day: dt.date, cfg: BenchConfig) -> dict[str, Any]:
    """The raw telemetry step's library call on one day of the run, from the simulated exporter
    text and CSV logs, from the same samples in the NVML sampler's Parquet files, and with
    ``cfg.compare_zstd`` from the text compressed with zstd (as a log rotation leaves it): what
    parsing text costs against reading columnar files, and what compressed logs cost, measured on the
    same rows in the same process (best of :data:`FORMAT_ROUNDS` interleaved rounds at most; before
    each call the source files' pages are dropped from the page cache, so every call reads from the
    disk; memory: the largest RSS above the start)."""
    from gpu_pipeline.lib.samples import RawStream, write_raw_samples
    from gpu_pipeline.lib.schemas import RAW_GPU_TELEMETRY
    from gpu_pipeline.lib.store import Store
    from gpu_pipeline.lib.timeutil import day_window

    d = day.isoformat()
    source = Store(base / "data")
    if not source.has_partition(RAW_GPU_TELEMETRY, d):
        return {"skipped": f"no raw telemetry partition for {d}"}
    work = base / "telemetry-formats"
    sampler_root = work / "sampler-files"
    convert_s, files = _timed(lambda: write_as_sampler_files(source.partition_file(RAW_GPU_TELEMETRY, d), sampler_root))
    start, end = day_window(day, SIM_TZ)
    text_root = base / "sources" / "telemetry"
    roots = {"text": text_root, "sampler_parquet": sampler_root}
    compress_s = None
    if cfg.compare_zstd:
        zstd_root = work / "zstd-text"
        compress_s, _ = _timed(lambda: write_zstd_copy(text_root, start, end, zstd_root))
        roots["zstd_text"] = zstd_root
    peaks: dict[str, list[float]] = {name: [] for name in roots}

    def raw_step(name: str) -> Callable[[], int]:
        def go() -> int:
            _drop_cached(roots[name])
            store = Store(work / f"store-{name}")
            with _RssSampler() as rss:
                before = rss.current() or 0
                written = write_raw_samples(store, d, RawStream(roots[name], start, end, SIM_TZ, 0))
            peaks[name].append(((rss.peak() or before) - before) / MIB)
            return written.rows
        return go

    rounds = min(cfg.repeats, FORMAT_ROUNDS)
    _log(f"[telemetry formats] one day's raw telemetry step from {', '.join(roots)} ({rounds} rounds)")
    timed = _best_interleaved(rounds, {name: raw_step(name) for name in roots})
    out: dict[str, Any] = {"day": d, "sampler_files": files, "convert_s": convert_s, "compress_s": compress_s}
    for name, root in roots.items():
        best, runs, rows = timed[name]
        size = (RawStream(root, start, end, SIM_TZ, 0).reader.input_bytes if name == "text"  # the day's files
                else _dir_bytes(root))
        out[name] = {"seconds": best, "runs_s": runs, "rows": rows, "source_bytes": size,
                     "rss_growth_mib": max(peaks[name])}
    shutil.rmtree(work, ignore_errors=True)
    out["same_rows"] = len({timed[name][2] for name in roots}) == 1
    out["text_vs_parquet"] = _ratio(timed["text"][0], timed["sampler_parquet"][0])
    if "zstd_text" in roots:
        out["text_vs_zstd_text"] = _ratio(timed["text"][0], timed["zstd_text"][0])
    return out


# -- raw ingestion: the SQLite archive and Elasticsearch ---------------------------------------------


def bench_sqlite(cfg: BenchConfig, scratch: Path, reuse: bool) -> dict[str, Any]:
    """One day out of a monthly archive of ``cfg.sqlite_rows`` rows, with the pipeline's reader."""
    from gpu_pipeline.lib import baseline
    from gpu_pipeline.lib.condor_archive import forget_time_indexes, read_only_uri, read_window
    from gpu_pipeline.lib.simulate import SimConfig
    from gpu_pipeline.lib.timeutil import day_window

    first, last = SQLITE_MONTH
    n_days = (last - first).days + 1
    gpus = max(1, round(cfg.sqlite_rows / (n_days * ROWS_PER_GPU_DAY)))
    dest = scratch / "sqlite-archive"
    dest.mkdir(parents=True, exist_ok=True)
    _log(f"[sqlite] building a monthly archive: {gpus} GPUs x {n_days} days, no telemetry")
    summary, sim_wall, reused = _simulate(
        dest, SimConfig(start=first, end=last, gpus=gpus, seed=cfg.seed + 1, timezone=SIM_TZ, telemetry_interval_s=0),
        reuse,
    )
    archive = dest / "condor"
    files = sorted(archive.glob("gpu_state_*.db"))
    start, end = day_window(SQLITE_DAY, SIM_TZ)
    runs, rows = [], 0
    for _ in range(cfg.repeats):  # as a nightly run reads it: the file's time index is built first
        forget_time_indexes()
        s, read = _timed(lambda: read_window(archive, start, end, SIM_TZ))
        runs.append(s)
        rows = read.table.num_rows
        del read
    # as a range run reads its next day: the time index is in memory
    next_start, next_end = day_window(SQLITE_DAY + dt.timedelta(days=1), SIM_TZ)
    indexed_s, read = _timed(lambda: read_window(archive, next_start, next_end, SIM_TZ))
    indexed_rows = read.table.num_rows
    del read
    forget_time_indexes()
    pandas_s, df = _timed(lambda: baseline.load_sqlite_window(archive, start, end, SIM_TZ))
    pandas_rows = len(df)
    del df
    # The floor: SQLite itself scanning the whole table for the day's rows (no index), nothing returned.
    lo = start.astimezone(ZoneInfo(SIM_TZ)).strftime("%Y-%m-%d %H:%M:%S")
    hi = end.astimezone(ZoneInfo(SIM_TZ)).strftime("%Y-%m-%d %H:%M:%S")

    def bare() -> int:
        con = sqlite3.connect(read_only_uri(files[0]), uri=True)
        try:
            return con.execute('SELECT count(*) FROM gpu_state WHERE "timestamp" >= ? AND "timestamp" < ?',
                               (lo, hi)).fetchone()[0]
        finally:
            con.close()

    bare_s, _, bare_rows = _best_of(cfg.repeats, bare)
    median = statistics.median(runs)
    return {
        "archive_files": [f.name for f in files],
        "archive_bytes": sum(f.stat().st_size for f in files),
        "archive_rows": summary.get("slot_rows"),
        "simulated_gpus": gpus,
        "month_days": n_days,
        "build_s": sim_wall,
        "reused": reused,
        "day": SQLITE_DAY.isoformat(),
        "day_rows": rows,
        "read_window_s": median,
        "read_window_runs_s": runs,
        "read_window_indexed_s": indexed_s,
        "read_window_indexed_rows": indexed_rows,
        "rows_per_s": rows / median if median else None,
        "pandas_read_sql_s": pandas_s,
        "pandas_rows": pandas_rows,
        "bare_sqlite_count_s": bare_s,
        "bare_sqlite_rows": bare_rows,
        "vs_bare_sqlite_scan": _ratio(median, bare_s),
        "note": ("the archive was reused from an earlier run: the first read may come from disk (cold)" if reused
                 else "the archive was just written: it is likely in the page cache (warm reads)"),
    }


def _es_docs(jobs_dirs: list[Path], n: int) -> tuple[list[dict], int]:
    """``n`` adstash job documents: the simulator's, repeated with unique GlobalJobIds if needed."""
    source: list[dict] = []
    for d in jobs_dirs:
        for f in sorted(d.glob("jobs-*.ndjson")):
            with open(f) as fh:
                source.extend(json.loads(line) for line in fh if line.strip())
        if len(source) >= n:
            break
    if not source:
        return [], 0
    docs: list[dict] = []
    rep = 0
    while len(docs) < n:
        for doc in source:
            if len(docs) >= n:
                break
            copy = dict(doc)
            if rep:
                copy["GlobalJobId"] = f"{doc.get('GlobalJobId')}~{rep}"
            docs.append(copy)
        rep += 1
    return docs, len(source)


def bench_elasticsearch(cfg: BenchConfig, jobs_dirs: list[Path], notes: list[str]) -> dict[str, Any]:
    """Documents per second through ``es_source.fetch_jobs`` (the real client) against the stand-in."""
    try:
        from gpu_pipeline_tests.es_server import EsStandIn
    except ImportError as exc:  # an install without the test package
        return {"skipped": f"the local Elasticsearch stand-in (gpu_pipeline_tests.es_server) is not importable: {exc}"}
    from gpu_pipeline.lib.es_source import EsConfig, fetch_jobs

    docs, distinct = _es_docs(jobs_dirs, cfg.es_docs)
    if not docs:
        return {"skipped": "no simulated job documents to index"}
    if distinct < len(docs):
        notes.append(f"elasticsearch: {distinct:,} simulated job documents repeated (new GlobalJobIds) to {len(docs):,}")

    class TimedStandIn(EsStandIn):
        """The stand-in, counting the seconds it spends serving (it shares this process's GIL)."""

        server_s = 0.0

        def _handle(self, h: Any, method: str) -> None:
            t0 = time.perf_counter()
            try:
                super()._handle(h, method)
            finally:
                self.server_s += time.perf_counter() - t0

    times = [d["RecordTime"] for d in docs if isinstance(d.get("RecordTime"), int | float)]
    start = dt.datetime.fromtimestamp(min(times), dt.UTC)
    end = dt.datetime.fromtimestamp(max(times) + 1, dt.UTC)
    with TimedStandIn({ES_INDEX: docs}) as es:
        es_cfg = EsConfig(hosts=[es.url], index=ES_INDEX, page_size=cfg.es_page_size, request_timeout=300.0)
        wall, res = _timed(lambda: fetch_jobs(es_cfg, start, end))
        server_s = es.server_s
    client_s = max(wall - server_s, 1e-9)
    return {
        "documents_indexed": len(docs),
        "documents_fetched": len(res.docs),
        "total_reported": res.total,
        "pages": res.pages,
        "page_size": cfg.es_page_size,
        "retries": res.retries,
        "wall_s": wall,
        "docs_per_s": len(res.docs) / wall if wall else None,
        "standin_server_s": server_s,
        "client_side_s": client_s,
        "client_side_docs_per_s": len(res.docs) / client_s,
        "note": "the stand-in is pure Python: every page re-evaluates the query and re-sorts the whole point "
                "in time, so docs_per_s is bounded by it; client_side_docs_per_s is the wall minus the "
                "stand-in's serving time (the real client: HTTP, JSON decoding, paging)",
    }


# -- fit, targets, report ----------------------------------------------------------------------------


def linear_fit(points: list[tuple[float, float]]) -> dict[str, Any]:
    """Least squares ``y = intercept + slope * x`` with R^2 (needs 2 points; R^2 is 1 for 2)."""
    if len(points) < 2:
        return {"points": len(points), "fit": None}
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return {"points": n, "fit": None}
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for _, y in points)
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in points)
    return {
        "points": n,
        "intercept_s": intercept,
        "slope_s_per_gpu_day": slope,
        "r2": 1.0 - ss_res / ss_tot if ss_tot else 1.0,
        "residuals_s": [y - (intercept + slope * x) for x, y in points],
    }


def _fits(sizes: list[dict]) -> dict[str, Any]:
    ok = [s for s in sizes if s["pipeline"]["success"]]
    run = [(float(s["gpu_days"]), s["pipeline"]["run_wall_s"]) for s in ok]
    no_tele = [
        (float(s["gpu_days"]), sum(st["wall_s"] or 0 for st in s["pipeline"]["steps"]
                                   if not any(k in TELEMETRY_ASSETS for k in st["assets"])))
        for s in ok
    ]
    cadences = sorted({s["telemetry_interval_s"] for s in ok})
    out = {
        "x": "GPUs x days",
        "run_wall_s": linear_fit(run),
        "steps_excluding_telemetry_s": linear_fit(no_tele),
        "telemetry_intervals_s": cadences,
        "same_telemetry_cadence": len(cadences) <= 1,
        "note": "telemetry steps are fitted out separately because their cost follows the telemetry cadence, "
                "which can differ between sizes (see notes)",
    }
    fit = out["run_wall_s"]
    if "slope_s_per_gpu_day" in fit:
        if len(run) == 2:
            fit["note"] = "two sizes: the line passes through both points; add a third size to test linearity"
        if len(cadences) > 1:
            fit["note"] = (f"the sizes ran at different telemetry cadences ({', '.join(map(str, cadences))} s): "
                           "this line mixes them; linearity is judged on the steps other than telemetry")
    excl = out["steps_excluding_telemetry_s"]
    if "slope_s_per_gpu_day" in excl and 10_000 not in {s["gpus"] for s in ok}:
        # a range run of 10,000 GPUs as long as the measured ones (every size runs the same days): its
        # fixed cost spread over its days, plus 10,000 GPUs' cost a day (telemetry left out: its cost
        # follows the cadence, which differs between sizes)
        days = ok[0]["days"]
        value = excl["intercept_s"] / days + excl["slope_s_per_gpu_day"] * 10_000
        out["extrapolated_10000_gpus_per_day_excl_telemetry_s"] = value
        if excl["slope_s_per_gpu_day"] <= 0 or value <= 0:
            out["extrapolation_unusable"] = (
                f"the fit's slope is {excl['slope_s_per_gpu_day']:.3g} s per GPU-day: the sizes' walls do not "
                "grow with the GPUs (noise between close sizes, or too few); nothing can be read from it")
    return out


def _target(name: str, measured: float | None, limit: float, unit: str, better: str = "le", detail: str = "",
            judged: bool = True) -> dict:
    """A target's line; ``judged`` false: the figure is shown but says nothing of the target (it was
    measured on another workload than the target's), and ``passed`` is None."""
    if measured is None or not judged:
        passed = None
    else:
        passed = measured <= limit if better == "le" else measured >= limit
    return {"target": name, "measured": _r(measured, 3), "limit": limit, "unit": unit,
            "passed": passed, "detail": detail}


def _size_targets(s: dict[str, Any], excl_plots: float | None, with_plots: float, rss: float) -> list[dict]:
    """A size's time and memory targets, judged at the targets' telemetry cadence
    (:data:`TELEMETRY_INTERVAL_S`, the issue's 30 s): on the run where it ran at that cadence, else on
    its estimate at that cadence (a size the sample budget coarsened), whose peak RSS, measured on
    fewer samples, is shown but not judged; a run at another cadence without such an estimate (the
    bench asked for another, or none) is shown and not judged."""
    gpus, p = s["gpus"], s["pipeline"]
    label = f"{gpus:,} GPUs"
    plots = "with plots, " if excl_plots is not None else ""
    out = []
    if s["telemetry_interval_s"] == TELEMETRY_INTERVAL_S:
        at = f"{s['days']}-day range run, run wall incl. Dagster, telemetry every {s['telemetry_interval_s']} s"
        if excl_plots is not None:
            out.append(_target(f"{label}: every daily asset except plots, wall per day", p["per_day_excl_plots_s"],
                               excl_plots, "s", detail=at))
        out.append(_target(f"{label}: {plots}wall per day", p["per_day_s"], with_plots, "s", detail=at))
        out.append(_target(f"{label}: peak RSS", peak_rss_mib(p), rss, "MiB",
                           detail="this process and its helper processes together"))
        return out
    why = (f"the run had telemetry every {s['telemetry_interval_s']} s, not the targets' {TELEMETRY_INTERVAL_S} s")
    est = p.get("at_requested_telemetry_estimate") or {}
    if est.get("telemetry_interval_s") == TELEMETRY_INTERVAL_S:
        at = f"{TELEMETRY_INTERVAL_S} s telemetry (estimate)"
        detail = f"{why} (the sample budget, see notes); {est.get('method', '')}"
        if excl_plots is not None:
            out.append(_target(f"{label}: every daily asset except plots, wall per day at {at}",
                               est.get("per_day_excl_plots_s"), excl_plots, "s", detail=detail))
        out.append(_target(f"{label}: {plots}wall per day at {at}", est.get("per_day_s"), with_plots, "s",
                           detail=detail))
    else:
        detail = f"{why}: nothing here says what a day at {TELEMETRY_INTERVAL_S} s takes"
        if excl_plots is not None:
            out.append(_target(f"{label}: every daily asset except plots, wall per day (NOT JUDGED: telemetry every "
                               f"{s['telemetry_interval_s']} s)", p["per_day_excl_plots_s"], excl_plots, "s",
                               detail=detail, judged=False))
        out.append(_target(f"{label}: {plots}wall per day (NOT JUDGED: telemetry every {s['telemetry_interval_s']} s)",
                           p["per_day_s"], with_plots, "s", detail=detail, judged=False))
    out.append(_target(f"{label}: peak RSS (NOT JUDGED: fewer samples than the target's)", peak_rss_mib(p), rss,
                       "MiB", detail=f"{why}; memory at the targets' cadence is not estimated", judged=False))
    return out


def _targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    by = {s["gpus"]: s for s in result["sizes"] if s["pipeline"]["success"]}
    out = []
    s1k = by.get(1000)
    if s1k:
        out += _size_targets(s1k, 5, 8, 1024)
        r = s1k.get("ratios", {})
        # The baseline is the tool's approach: its loop nesting (tier -> device -> bucket). The
        # variant with the bucket selected once is faster than the tool and is reported beside it; the
        # bare scan is the most any pipeline can gain over it.
        bare_vs_cheapest = _ratio((r.get("baseline") or {}).get("seconds"), (r.get("bare_scan") or {}).get("seconds"))
        out.append(_target("1,000 GPUs: state + allocation, baseline (the tool's loop nesting) / pipeline",
                           r.get("baseline_tool_loop_order_vs_pipeline_speedup"), 100, "x", better="ge",
                           detail="against the baseline with its loops reordered in its favour (each bucket "
                                  f"selected once): {_fmt(r.get('baseline_vs_pipeline_speedup'), 1)}x; the bare "
                                  f"scan is {_fmt(bare_vs_cheapest, 1)}x faster than that variant, the bound for "
                                  "any pipeline"))
        ratio = (r.get("pipeline_vs_bare_scan") or {}).get("states_plus_allocation")
        out.append(_target("1,000 GPUs: metric SQL / bare DuckDB scan", ratio, 3, "x"))
    s10k = by.get(10_000)
    fit = result.get("linear_fit", {})
    if s10k:
        out += _size_targets(s10k, None, 60, 3072)
    elif "extrapolated_10000_gpus_per_day_excl_telemetry_s" in fit:
        # never judged: the target is the whole day, and the telemetry steps (half of a 1,000-GPU day's
        # CPU at 30 s) are left out of the line
        unusable = fit.get("extrapolation_unusable")
        out.append(_target("10,000 GPUs: wall per day without the telemetry steps (EXTRAPOLATED, not measured; "
                           "NOT JUDGED)", fit["extrapolated_10000_gpus_per_day_excl_telemetry_s"], 60, "s",
                           detail=unusable or "from the fit of the steps other than telemetry, for a range run as "
                                             "long as the measured ones; the target counts the whole day: run "
                                             "--gpus ...,10000 to measure it", judged=False))
    # linearity: the whole run's line where every size ran the same telemetry cadence, else the line of
    # the steps other than telemetry (the telemetry's cost follows its cadence)
    same = fit.get("same_telemetry_cadence", True)
    line = (fit.get("run_wall_s") if same else fit.get("steps_excluding_telemetry_s")) or {}
    if line.get("r2") is not None and line.get("points", 0) >= 3:
        out.append(_target("cost linear in GPUs x days (R^2 of the fit" +
                           ("" if same else ", steps other than telemetry: the sizes' telemetry cadences differ") + ")",
                           line["r2"], 0.98, "", better="ge"))
    sq = result.get("sqlite_archive") or {}
    if "read_window_s" in sq:
        out.append(_target(f"one day out of a {sq['archive_bytes'] / 1e9:.2f} GB monthly SQLite archive "
                           f"({sq['archive_rows']:,} rows)", sq["read_window_s"], 5, "s",
                           detail="median of " + ", ".join(f"{x:.2f}" for x in sq["read_window_runs_s"]) + " s, "
                                  "each building the file's time index; the next day with the index in memory "
                                  f"(a range run): {sq['read_window_indexed_s']:.2f} s; " + sq["note"]))
    for s in by.values():
        p = s["pipeline"]
        one_run = p.get("runs_in_instance") == 1 and p.get("step_starts_total") == p.get("steps_count")
        out.append({"target": f"{s['gpus']} GPUs: a {s['days']}-day range run is one run (one start per step)",
                    "measured": f"{p.get('runs_in_instance')} run(s), {p.get('step_starts_total')} step start(s) for "
                                f"{p.get('steps_count')} steps; overhead outside steps "
                                f"{p['orchestration_overhead_s']:.1f} s + launch {p['launch_overhead_s']:.1f} s",
                    "limit": "1 run", "unit": "", "passed": bool(one_run), "detail": ""})
    return out


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run the whole benchmark; returns the JSON-serialisable result."""
    cfg.validate()
    notes: list[str] = []
    keep = cfg.work_dir is not None
    scratch = Path(cfg.work_dir).resolve() if keep else Path(tempfile.mkdtemp(prefix="gpu-pipeline-bench-"))
    scratch.mkdir(parents=True, exist_ok=True)
    profile_dir = Path(cfg.out).resolve().parent if cfg.profile else None
    t0 = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "gpu-pipeline bench",
        "created_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": _machine(),
        "config": {k: (list(v) if isinstance(v, tuple) else v.isoformat() if isinstance(v, dt.date) else v)
                   for k, v in asdict(cfg).items()},
        "scratch_dir": str(scratch) if keep else None,
        "sizes": [],
    }
    try:
        for gpus in cfg.gpus:
            result["sizes"].append(bench_size(gpus, cfg, scratch, notes, reuse=keep, profile_dir=profile_dir))
        result["sqlite_archive"] = bench_sqlite(cfg, scratch, reuse=keep)
        _log("[elasticsearch] fetching job documents through the real client")
        jobs_dirs = [scratch / f"gpus-{g}-days-{cfg.days}" / "sources" / "jobs" for g in sorted(cfg.gpus, reverse=True)]
        result["elasticsearch"] = bench_elasticsearch(cfg, jobs_dirs, notes)
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)
            for s in result["sizes"]:
                s["pipeline"].pop("log", None)
    result["linear_fit"] = _fits(result["sizes"])
    result["notes"] = notes + [
        "wall seconds are measured on a shared machine; its load average at the start is in the JSON's "
        "machine.load_average_1m_at_start",
        "per-step walls come from the Dagster event log (STEP_START -> STEP_SUCCESS); a multi-asset is one step "
        "and its tables share that wall",
        "ratios are on the last day of the range; pipeline and bare-scan times are the best of "
        f"{cfg.repeats} interleaved rounds (each round runs the two pipeline calls and the two bare scans once), "
        "the baseline's is one run",
        "the Terapixel render farm of the demo is left out (not part of the simulated pool); Kueue scrapes "
        f"every {KUEUE_INTERVAL_S} s as in the demo",
    ]
    result["targets"] = _targets(result)
    result["total_wall_s"] = time.perf_counter() - t0
    return result


def _fmt(x: Any, nd: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


def format_report(result: dict[str, Any]) -> str:
    """The human-readable table of a result."""
    lines = []
    m = result["machine"]
    lines.append(f"gpu-pipeline bench -- {m['cpus']} CPUs, {m['memory_gib']} GiB, dagster {m['dagster']}, "
                 f"duckdb {m['duckdb']}, pandas {m['pandas']}")
    for s in result["sizes"]:
        p = s["pipeline"]
        sim = s["simulation"]
        if "run_wall_s" not in p:
            lines.append("")
            lines.append(f"== {s['gpus']:,} GPUs x {s['days']} day(s): the pipeline run FAILED before reporting:")
            lines.append("   " + p.get("error", "")[-1500:].replace("\n", "\n   "))
            continue
        lines.append("")
        lines.append(f"== {s['gpus']:,} GPUs x {s['days']} day(s) ({s['start']} .. {s['end']}, {s['partition_timezone']}); "
                     f"telemetry every {s['telemetry_interval_s']} s; {_fmt(sim['slot_rows'])} slot rows, "
                     f"{_fmt(sim['job_documents'])} job docs, {_fmt(sim['telemetry_samples'])} samples "
                     f"(simulated in {sim['wall_s']:.1f} s{', reused' if sim['reused'] else ''})")
        lines.append(f"   run {'SUCCESS' if p['success'] else 'FAILURE'}: {p['run_wall_s']:.1f} s run wall "
                     f"({p['per_day_s']:.1f} s/day, {p['per_day_excl_plots_s']:.1f} s/day without plots), "
                     f"{p['steps_count']} steps, overhead outside steps {p['orchestration_overhead_s']:.1f} s, "
                     f"launch {p['launch_overhead_s']:.1f} s, peak RSS {peak_rss_mib(p):,.0f} MiB (with helpers)"
                     + (f"; DuckDB {p['duckdb_threads']} thread(s), memory limit {p['duckdb_memory_limit']}"
                        if p.get("duckdb_threads") else ""))
        if p.get("call_cpu_s") is not None:
            lines.append(f"   CPU (user + system, with helpers): {p['call_cpu_s']:.1f} s ({p['cpu_per_day_s']:.1f} s/day), "
                         f"{_fmt(p['cores'])} of the {result['machine'].get('cpus')} cores on average over the call")
        est = p.get("at_requested_telemetry_estimate")
        if est:
            sl = est["slice"]
            lines.append(f"   at {est['telemetry_interval_s']} s telemetry (estimate): {est['per_day_s']:.1f} s/day, "
                         f"{est['per_day_excl_plots_s']:.1f} without plots; telemetry "
                         f"{est['telemetry_per_day_s']:.1f} s/day (measured on {sl['gpus']} GPUs: "
                         f"{_fmt(sl['samples'])} samples in {sl['seconds']:.2f} s (first run {sl['first_seconds']:.2f} s), "
                         f"x {sl['scale']:g})")
        if p["failed_checks"]:
            lines.append(f"   failed checks: {', '.join(p['failed_checks'])}")
        lines.append(f"   {'step':32s} {'s/day':>8s} {'wall s':>8s} {'CPU s/day':>9s} {'cores':>5s} {'rows in':>12s} "
                     f"{'rows out':>12s} {'rows/s':>11s} {'RSS MiB':>8s}")
        for st in sorted(p["steps"], key=lambda x: -(x["wall_s"] or 0)):
            lines.append(f"   {st['step'][:32]:32s} {_fmt(st['wall_per_day_s']):>8s} {_fmt(st['wall_s']):>8s} "
                         f"{_fmt(st.get('cpu_per_day_s')):>9s} {_fmt(st.get('cores')):>5s} "
                         f"{_fmt(st['rows_in']):>12s} {_fmt(st['rows_out']):>12s} {_fmt(st['rows_per_s'], 0):>11s} "
                         f"{_fmt(st.get('peak_rss_mib'), 0):>8s}")
        r = s.get("ratios")
        if r:
            pl, bare, bl = r["pipeline"], r["bare_scan"], r.get("baseline", {})
            lines.append(f"   state + allocation on {r['day']} ({_fmt(r['input_rows'])} clean rows read, of the day and the hour before): pipeline "
                         f"{pl['seconds']:.2f} s (states {pl['states_s']:.2f}, allocation {pl['allocation_s']:.2f}); "
                         f"bare scan {bare['seconds']:.2f} s -> {_fmt(r['pipeline_vs_bare_scan']['states_plus_allocation'])}x "
                         "the limit")
            if "seconds" in bl:
                eq = r["equal_to_pipeline"]["equal"]
                lines.append(f"   baseline (pandas, the original tool's approach): {bl['seconds']:.2f} s "
                             f"(load {bl['load_s']:.2f}, states {bl['states_s']:.2f}, allocation {bl['allocation_s']:.2f}) "
                             f"-> pipeline is {_fmt(r['baseline_vs_pipeline_speedup'], 1)}x faster; "
                             f"results {'EQUAL' if eq else 'DIFFER'}")
                if "seconds_tool_loop_order" in bl:
                    lines.append(f"   baseline with the tool's own loop nesting for the allocation: "
                                 f"{bl['seconds_tool_loop_order']:.2f} s -> "
                                 f"{_fmt(r['baseline_tool_loop_order_vs_pipeline_speedup'], 1)}x")
            elif bl:
                lines.append(f"   baseline: {bl.get('skipped')}")
        tf = s.get("telemetry_formats")
        if tf and "skipped" not in tf:
            tx, sp = tf["text"], tf["sampler_parquet"]
            lines.append(f"   raw telemetry step on {tf['day']}, same {_fmt(tx['rows'])} samples, read from disk: from exporter text + "
                         f"CSV ({tx['source_bytes'] / 1e9:.2f} GB) {tx['seconds']:.2f} s, +{tx['rss_growth_mib']:,.0f} MiB; "
                         f"from the NVML sampler's Parquet ({tf['sampler_files']} files, {sp['source_bytes'] / 1e6:.0f} MB) "
                         f"{sp['seconds']:.2f} s, +{sp['rss_growth_mib']:,.0f} MiB -> text costs "
                         f"{_fmt(tf['text_vs_parquet'])}x{'' if tf['same_rows'] else ' (ROW COUNTS DIFFER)'}")
            if "zstd_text" in tf:
                zt = tf["zstd_text"]
                lines.append(f"   the same text compressed with zstd ({zt['source_bytes'] / 1e6:.0f} MB, made in "
                             f"{tf['compress_s']:.1f} s): {zt['seconds']:.2f} s, +{zt['rss_growth_mib']:,.0f} MiB -> "
                             f"plain text costs {_fmt(tf['text_vs_zstd_text'])}x")
        elif tf:
            lines.append(f"   telemetry formats: skipped ({tf['skipped']})")
    sq = result.get("sqlite_archive")
    if sq:
        lines.append("")
        lines.append(f"== SQLite archive: {sq['archive_bytes'] / 1e9:.2f} GB, {_fmt(sq['archive_rows'])} rows; one day "
                     f"({_fmt(sq['day_rows'])} rows) with read_window: {sq['read_window_s']:.2f} s "
                     f"({_fmt(sq['rows_per_s'], 0)} rows/s; the next day with the time index in memory "
                     f"{sq['read_window_indexed_s']:.2f} s); pandas read_sql {sq['pandas_read_sql_s']:.2f} s; "
                     f"bare SQLite scan {sq['bare_sqlite_count_s']:.2f} s")
    es = result.get("elasticsearch")
    if es:
        lines.append("")
        if "skipped" in es:
            lines.append(f"== Elasticsearch: skipped ({es['skipped']})")
        else:
            lines.append(f"== Elasticsearch: {_fmt(es['documents_fetched'])} docs in {es['wall_s']:.2f} s "
                         f"({_fmt(es['docs_per_s'], 0)} docs/s; {es['pages']} pages of {es['page_size']}); "
                         f"client side {_fmt(es['client_side_docs_per_s'], 0)} docs/s")
    fit = result.get("linear_fit", {}).get("run_wall_s", {})
    if "slope_s_per_gpu_day" in fit:
        lines.append("")
        lines.append(f"== fit: run wall = {fit['intercept_s']:.1f} s + {fit['slope_s_per_gpu_day'] * 1000:.2f} s per "
                     f"1,000 GPU-days (R^2 {fit['r2']:.4f}, {fit['points']} points)")
        fx = result["linear_fit"]["steps_excluding_telemetry_s"]
        if "slope_s_per_gpu_day" in fx:
            lines.append(f"   steps without telemetry = {fx['intercept_s']:.1f} s + "
                         f"{fx['slope_s_per_gpu_day'] * 1000:.2f} s per 1,000 GPU-days")
        ex = result["linear_fit"].get("extrapolated_10000_gpus_per_day_excl_telemetry_s")
        if ex is not None:
            lines.append(f"   extrapolated 10,000 GPUs x 1 day without telemetry: {ex:.0f} s (not measured)")
    lines.append("")
    lines.append("== targets")
    for t in result.get("targets", []):
        mark = {True: "PASS", False: "FAIL", None: " -- "}[t["passed"]]
        lines.append(f"   [{mark}] {t['target']}: {_fmt(t['measured'])} {t['unit']} (limit {t['limit']} {t['unit']})"
                     + (f"\n          {t['detail']}" if t.get("detail") else ""))
    if result.get("notes"):
        lines.append("")
        lines.append("== notes")
        lines.extend(f"   - {n}" for n in result["notes"])
    return "\n".join(lines)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    return obj


def main_bench(args: argparse.Namespace) -> int:
    """``gpu-pipeline bench``: run, print the table, write the JSON. 0 when every run succeeded."""
    try:
        cfg = config_from_args(args)
        cfg.validate()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = run_bench(cfg)
    out = Path(cfg.out)
    if out.parent and not out.parent.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_jsonable(result), indent=1, default=str) + "\n")
    print(format_report(result))
    print(f"\nwrote {out}")
    return 0 if all(s["pipeline"]["success"] for s in result["sizes"]) else 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``bench`` arguments: ``gpu_pipeline.cli`` adds them to ``gpu-pipeline bench``, and
    ``python -m gpu_pipeline.bench`` parses them too. Only --gpus, --days and --out are the issue's;
    the others tune the run (the tests use them to stay small)."""
    p.add_argument("--gpus", default=",".join(str(g) for g in DEFAULT_GPUS),
                   help="comma-separated cluster sizes (e.g. 100,1000,10000)")
    p.add_argument("--days", type=int, default=DEFAULT_DAYS, help="days per size, materialized as one range run")
    p.add_argument("--out", default="bench.json", help="JSON results file")
    p.add_argument("--work-dir", help="keep the scratch data here and reuse simulations that match")
    p.add_argument("--telemetry-interval", type=int, default=TELEMETRY_INTERVAL_S,
                   help="telemetry seconds (coarsened per size when over --max-telemetry-samples)")
    p.add_argument("--max-telemetry-samples", type=int, default=MAX_TELEMETRY_SAMPLES)
    p.add_argument("--sqlite-rows", type=int, default=SQLITE_ROWS, help="rows of the monthly SQLite archive")
    p.add_argument("--es-docs", type=int, default=ES_DOCS, help="documents in the Elasticsearch stand-in")
    p.add_argument("--es-page-size", type=int, default=ES_PAGE_SIZE)
    p.add_argument("--baseline-max-gpus", type=int, default=BASELINE_MAX_GPUS,
                   help="skip the (slow) pandas baseline above this size")
    p.add_argument("--repeats", type=int, default=REPEATS)
    p.add_argument("--profile", action="store_true", help="profile each run with pyinstrument (next to --out)")
    p.add_argument("--compare-zstd", action="store_true",
                   help="also time the raw telemetry step on the last day's text compressed with zstd")
    p.add_argument("--duckdb-memory-limit", default=DUCKDB_MEMORY_LIMIT,
                   help="GPU_PIPELINE_DUCKDB_MEMORY_LIMIT of the measured run ('' for DuckDB's default); "
                        "GPU_PIPELINE_DUCKDB_THREADS, when set, holds for it too")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_pipeline":
        raise SystemExit(_child_main(sys.argv[2:]))
    parser = argparse.ArgumentParser(prog="python -m gpu_pipeline.bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    raise SystemExit(main_bench(parser.parse_args()))
