"""``gpu-pipeline`` command line: simulate, demo, materialize, sql, ui.

Dagster definitions read the partition start date and time zone from the environment when they
load, so every command that runs the pipeline sets the environment first and imports
``gpu_pipeline.definitions`` afterwards.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shlex
import shutil
import sys
from pathlib import Path
from zoneinfo import ZoneInfo

from gpu_pipeline.lib.envutil import DATA_ROOT_VAR, data_root

# The instance template lives at the top of the checkout (installs are editable: see README).
INSTANCE_TEMPLATE = Path(__file__).resolve().parent.parent / "dagster.yaml"
DEMO_TZ = "America/Chicago"
DEMO_GPUS = 80
DEMO_DAYS = 7
DEMO_TELEMETRY_S = 60
DEMO_KUEUE_S = 900

ENV_DEFAULTS = {
    "GPU_PIPELINE_SOURCE_TZ": "UTC",
    "GPU_PIPELINE_EXCLUDED_HOSTS": "",
}


def _date(s: str) -> dt.date:
    try:
        return dt.date.fromisoformat(s)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{s!r} is not a date (YYYY-MM-DD)") from exc


def _positive(s: str) -> float:
    try:
        value = float(s)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{s!r} is not a number of seconds > 0")
    return value


def _count(s: str) -> int:
    try:
        value = int(s)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{s!r} is not a whole number >= 1")
    return value


def _apply_env_defaults() -> None:
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


def prepare_dagster_home(home: Path) -> Path:
    """Create ``home`` with the instance template ``dagster.yaml`` unless one exists, and create the
    instance's storage once, under a lock: two commands that are the first to use a fresh SQLite
    instance would otherwise race creating its tables ("table alembic_version already exists")."""
    import fcntl

    home = home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    if not target.exists():
        shutil.copyfile(INSTANCE_TEMPLATE, target)
    marker = home / ".gpu-pipeline-initialized"
    if not marker.exists():
        with open(home / ".gpu-pipeline-init.lock", "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            if not marker.exists():
                import dagster as dg

                from gpu_pipeline.lib.envutil import scoped_env

                # The template names its storage directory by $DAGSTER_HOME (see dagster.yaml).
                with scoped_env("DAGSTER_HOME", str(home)), dg.DagsterInstance.from_config(str(home)) as instance:
                    instance.get_run_records(limit=1)
                marker.touch()
    return home


def run_pipeline(start: dt.date, end: dt.date, instance=None) -> bool:  # noqa: ANN001
    """Materialize every daily asset for [start, end] as ONE range run (same job as the schedule)."""
    import dagster as dg

    from gpu_pipeline.definitions import defs

    job = defs().resolve_job_def("daily_pipeline")
    if instance is None:
        instance = dg.DagsterInstance.get() if os.environ.get("DAGSTER_HOME") else dg.DagsterInstance.ephemeral()
    tags = {
        "dagster/asset_partition_range_start": start.isoformat(),
        "dagster/asset_partition_range_end": end.isoformat(),
        "gpu_pipeline/launched_by": "cli",
    }
    # Dagster's console logger at INFO: the assets' own notes and warnings, the run's start, end and
    # failures, without a DEBUG line per event (about 400 for a demo week) burying them
    run_config = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}
    result = job.execute_in_process(instance=instance, tags=tags, raise_on_error=False, run_config=run_config)
    for line in _failed_checks(result.get_asset_check_evaluations()):
        print(line)
    return result.success


#: The words of the metadata keys that name what a check fails on (shown first)
_FAILING_WORDS = ("below", "without", "violation", "missing", "duplicate", "bad", "failed", "set_aside", "several")


def _failed_checks(evaluations) -> list[str]:  # noqa: ANN001
    """A line per failed asset check with its figures (the metadata a check fails on: the days, the
    coverage, the violations), so that a console run says why, not only which check. What the check
    fails on comes first; a count by day shows only the days that have some, a share or flag by day
    the worst days first (a run's healthy days hid the bad one behind the line's cut)."""
    lines = []
    for ev in evaluations:
        if ev.passed:
            continue
        telling, others = [], []
        for key, value in (ev.metadata or {}).items():
            shown = getattr(value, "value", value)
            if key == "stops_downstream" or shown is None or shown == "" or shown == [] or shown == {}:
                continue
            if isinstance(shown, dict) and shown:
                values = list(shown.values())
                if all(isinstance(v, int) and not isinstance(v, bool) for v in values) and any(values):
                    shown = {k: v for k, v in shown.items() if v}  # counts: the days that have some
                elif all(isinstance(v, int | float) for v in values):  # shares, flags: the worst first
                    shown = dict(sorted(shown.items(), key=lambda kv: (float(kv[1]), kv[0])))
            text = json.dumps(shown, default=str) if isinstance(shown, dict | list) else str(shown)
            text = " ".join(text.split())  # one line
            first = any(word in key for word in _FAILING_WORDS)
            (telling if first else others).append(f"{key}={text if len(text) <= 160 else text[:157] + '...'}")
        figures = telling + others
        severity = getattr(ev.severity, "value", ev.severity)
        lines.append(f"check failed ({severity}): {ev.asset_key.to_user_string()} {ev.check_name}"
                     + (f": {'; '.join(figures[:4])}" if figures else ""))
    return lines


def cmd_simulate(args: argparse.Namespace) -> int:
    from gpu_pipeline.lib.simulate import SimConfig, simulate

    cfg = SimConfig(
        start=args.start,
        end=args.end,
        gpus=args.gpus,
        seed=args.seed,
        cadence_minutes=args.cadence_minutes,
        timezone=args.timezone,
        telemetry_interval_s=args.telemetry_interval,
        kueue_interval_s=args.kueue_interval,
    )
    summary = simulate(Path(args.out), cfg)
    for key, value in summary.items():
        if key != "files":
            print(f"{key}: {value}")
    return 0


def demo_days(today: dt.date | None = None, tz: str = DEMO_TZ) -> tuple[dt.date, dt.date]:
    """The last ``DEMO_DAYS`` complete days in ``tz``."""
    today = today or dt.datetime.now(ZoneInfo(tz)).date()
    return today - dt.timedelta(days=DEMO_DAYS), today - dt.timedelta(days=1)


def demo_env(base: Path, start: dt.date) -> dict[str, str]:
    """The demo's environment; a source directory that does not exist under ``base/sources`` is
    left out (that source is off)."""
    env = {
        "DAGSTER_HOME": str(base / "dagster_home"),
        "GPU_PIPELINE_DATA_ROOT": str(base / "data"),
        "GPU_PIPELINE_CONDOR_ARCHIVE": str(base / "sources" / "condor"),
        "GPU_PIPELINE_SOURCE_TZ": DEMO_TZ,
        "GPU_PIPELINE_TIMEZONE": DEMO_TZ,
        "GPU_PIPELINE_START_DATE": start.isoformat(),
        "GPU_PIPELINE_EXCLUDED_HOSTS": "",
        "GPU_PIPELINE_JOBS_DIR": str(base / "sources" / "jobs"),
        "GPU_PIPELINE_TELEMETRY_DIR": str(base / "sources" / "telemetry"),
        "GPU_PIPELINE_TELEMETRY_TZ": DEMO_TZ,
        "GPU_PIPELINE_KUEUE_DIR": str(base / "sources" / "kueue"),
        "GPU_PIPELINE_TERAPIXEL_DIR": str(base / "sources" / "terapixel"),
    }
    optional = ("GPU_PIPELINE_JOBS_DIR", "GPU_PIPELINE_TELEMETRY_DIR", "GPU_PIPELINE_KUEUE_DIR",
                "GPU_PIPELINE_TERAPIXEL_DIR")
    return {k: v for k, v in env.items() if k not in optional or Path(v).is_dir()}


#: The first line of the ``.env`` a demo writes: a ``.env`` without it is not replaced.
DEMO_ENV_MARK = "# written by gpu-pipeline demo: the whole configuration of this demo directory"


def _demo_dir_error(base: Path) -> str | None:
    """Why ``base`` cannot take a demo (its ``.env`` or data are not a demo's), or None. A ``.env``
    is a demo's when it has the demo's first line, or (written before that line was) when its slot
    archive is the demo's simulated one under ``base``."""
    env_file = base / ".env"
    if env_file.exists():
        from dotenv import dotenv_values

        text = env_file.read_text(errors="replace")
        archive = dotenv_values(env_file).get("GPU_PIPELINE_CONDOR_ARCHIVE") or ""
        if not text.startswith(DEMO_ENV_MARK) and Path(archive) != base / "sources" / "condor":
            return (f"{env_file} exists and is not a demo's (it points the pipeline at "
                    f"{archive or 'another archive'}): the demo would replace it and write its simulated days "
                    "into that data root; give another --dir, or --force")
    elif (base / "data").is_dir() and any((base / "data").iterdir()):
        return (f"{base / 'data'} holds tables and {base} has no demo .env: the demo would replace their days "
                "with simulated ones; give another --dir, or --force")
    return None


def _command() -> str:
    """How to call this command again: ``gpu-pipeline`` where the shell finds this installation's under
    that name, else its path (the README's first command installs into a virtualenv it does not
    activate: ``gpu-pipeline`` alone was "command not found")."""
    exe = Path(sys.executable).with_name("gpu-pipeline")
    found = shutil.which("gpu-pipeline")
    if exe.is_file() and (found is None or Path(found).resolve() != exe.resolve()):
        return shlex.quote(str(exe))
    return "gpu-pipeline"


def _next_steps(base: Path) -> list[str]:
    """What the demo prints after its run: commands on its folder, quoted for a POSIX shell (a folder
    name with a space, a quote or a ``#`` pastes back as it is)."""
    where, cmd = shlex.quote(str(base)), _command()
    return ["Open the Dagster UI on these runs and assets:",
            f"  {cmd} ui --dir {where}        (then browse http://127.0.0.1:3000)",
            "Query the tables:",
            f"  {cmd} sql --dir {where} \"SELECT state, count(*) FROM metrics.gpu_states GROUP BY 1\""]


def _env_line(key: str, value: str) -> str:
    """``KEY='value'``, quoted so that python-dotenv (the commands' and Dagster's reader) gives the
    value back as it is: a `` #`` in a folder name began a comment."""
    return f"{key}='" + value.replace("\\", "\\\\").replace("'", "\\'") + "'\n"


def cmd_demo(args: argparse.Namespace) -> int:
    from gpu_pipeline.lib.simulate import SimConfig, simulate

    base = Path(args.dir).resolve()
    if "${" in str(base) or "\n" in str(base):
        print(f"error: {base}: a folder name with '${{' or a line break cannot be written into a .env file "
              "(python-dotenv expands ${...} even in quotes)", file=sys.stderr)
        return 2
    if not args.force and (error := _demo_dir_error(base)):
        print(f"error: {error}", file=sys.stderr)
        return 2
    start, end = demo_days()
    print(f"Simulating {args.gpus} GPUs for {start} .. {end} ({DEMO_TZ}) into {base / 'sources'}")
    simulate(
        base / "sources",
        SimConfig(start=start, end=end, gpus=args.gpus, seed=args.seed, timezone=DEMO_TZ,
                  telemetry_interval_s=DEMO_TELEMETRY_S, kueue_interval_s=DEMO_KUEUE_S),
    )
    # A small Terapixel-style render farm on the last day (4 hosts, 2 s telemetry, task events):
    # a second kind of cluster, outside the HTCondor pool, read by the same telemetry path.
    from gpu_pipeline.lib.terapixel import write_terapixel_sample
    from gpu_pipeline.lib.timeutil import day_window

    write_terapixel_sample(base / "sources" / "terapixel", day_window(end, DEMO_TZ)[0], hosts=4, hours=24, seed=args.seed)
    env = demo_env(base, start)
    prepare_dagster_home(Path(env["DAGSTER_HOME"]))
    _use_only(env)
    (base / ".env").write_text(DEMO_ENV_MARK + "\n" + "".join(_env_line(k, v) for k, v in env.items()))
    print(f"Materializing every daily asset for {start} .. {end} through Dagster (one range run)")
    ok = run_pipeline(start, end)
    _print_outputs(Path(env["GPU_PIPELINE_DATA_ROOT"]))
    print()
    print("\n".join(_next_steps(base)))
    if not ok:
        print("The run FAILED; see the run's logs in the UI.", file=sys.stderr)
    return 0 if ok else 1


def _print_outputs(root: Path) -> None:
    print(f"\nWrote under {root}:")
    for layer in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        for table in sorted(p for p in layer.iterdir() if p.is_dir()):
            parts = sorted(table.glob("date=*"))
            print(f"  {layer.name}/{table.name}: {len(parts)} day(s)")


def _use_only(env: dict[str, str]) -> None:
    """Set ``env`` and unset every other ``GPU_PIPELINE_`` variable: a demo directory's settings
    are the whole configuration (a shell's ``GPU_PIPELINE_ES_HOSTS`` pointed the demo's run at a
    real Elasticsearch instead of its job files)."""
    dropped = sorted(k for k in os.environ if k.startswith("GPU_PIPELINE_") and k not in env)
    for key in dropped:
        del os.environ[key]
    if dropped:
        print(f"ignoring {', '.join(dropped)} from the environment: the demo directory configures this run",
              file=sys.stderr)
    os.environ.update(env)


def _load_env(dir_: str | None, defaults: bool = True) -> None:
    from dotenv import dotenv_values, load_dotenv

    if dir_:
        env_file = Path(dir_) / ".env"
        if not env_file.is_file():
            raise SystemExit(f"{env_file}: not found (run `gpu-pipeline demo --dir {shlex.quote(str(dir_))}` first)")
        _use_only({k: v or "" for k, v in dotenv_values(env_file).items()})
    else:  # over the shell's variables, as Dagster's own commands (dagster dev, the daemon) read it
        load_dotenv(Path.cwd() / ".env", override=True)
    if defaults:
        _apply_env_defaults()


def _dagster_home() -> str:
    """``DAGSTER_HOME``, else ``./.dagster_home``: the instance the commands of this folder use."""
    return (os.environ.get("DAGSTER_HOME") or "").strip() or str(Path.cwd() / ".dagster_home")


def _default_dagster_home() -> None:
    """``DAGSTER_HOME``, prepared from the template; unset, ``./.dagster_home`` (git-ignored): the
    runs, schedules and backfills are kept there instead of in an instance that ends with the command."""
    if not os.environ.get("DAGSTER_HOME"):
        os.environ["DAGSTER_HOME"] = _dagster_home()
        print(f"DAGSTER_HOME not set: using {os.environ['DAGSTER_HOME']}", file=sys.stderr)
    prepare_dagster_home(Path(os.environ["DAGSTER_HOME"]))


def _partition_range_error(start_day: dt.date, end_day: dt.date) -> str | None:
    """Why ``start .. end`` is not a range of the daily partitions (from GPU_PIPELINE_START_DATE to
    the last complete day in the partition time zone), or None."""
    from gpu_pipeline.defs.partitions import daily_partitions

    start, end = start_day.isoformat(), end_day.isoformat()
    keys = daily_partitions.get_partition_keys()
    if not keys:
        return "no complete day in the partitions yet (GPU_PIPELINE_START_DATE is today or later)"
    if end < start:
        return "--end is before --start"
    if start < keys[0] or end > keys[-1]:
        return (f"{start} .. {end} is outside the daily partitions {keys[0]} .. {keys[-1]} "
                "(GPU_PIPELINE_START_DATE to the last complete day in GPU_PIPELINE_TIMEZONE)")
    return None


def cmd_materialize(args: argparse.Namespace) -> int:
    _load_env(args.dir)
    if not (os.environ.get("GPU_PIPELINE_CONDOR_ARCHIVE") or "").strip():
        print("error: set GPU_PIPELINE_CONDOR_ARCHIVE (environment or .env); see README 'Pointing it at real data'",
              file=sys.stderr)
        return 2
    end = args.end or args.start
    error = _partition_range_error(args.start, end)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    _default_dagster_home()
    if not (os.environ.get(DATA_ROOT_VAR) or "").strip():  # the default the definitions take
        print(f"{DATA_ROOT_VAR} not set: writing under {data_root()}", file=sys.stderr)
    if (os.environ.get("GPU_PIPELINE_EXECUTOR") or "").strip() == "multiprocess":
        print("note: materialize runs the steps one after another in this process; GPU_PIPELINE_EXECUTOR "
              "applies to the runs the daemon and the UI launch", file=sys.stderr)
    ok = run_pipeline(args.start, end)
    print(f"daily_pipeline {args.start} .. {end}: {'SUCCESS' if ok else 'FAILURE'}")
    return 0 if ok else 1


def cmd_sql(args: argparse.Namespace) -> int:
    _load_env(args.dir)
    import duckdb

    from gpu_pipeline.lib.store import Store, connect, create_catalog, empty_tables

    # unset, the root the runs of this folder take: DAGSTER_HOME's, ./.dagster_home when that is unset too
    root = args.data_root or data_root({**os.environ, "DAGSTER_HOME": _dagster_home()})
    if not Path(str(root).removeprefix("file://")).expanduser().is_dir():
        how = ("" if args.data_root or (os.environ.get(DATA_ROOT_VAR) or "").strip() else
               f" ({DATA_ROOT_VAR} is set neither in the environment nor in a .env of this folder: run in the "
               "folder whose .env configures the pipeline, or give --dir DIR or --data-root PATH)")
        print(f"error: {root}: no such data root{how}", file=sys.stderr)
        return 2
    store = Store(root)
    if args.catalog:
        con = duckdb.connect(args.catalog)
        views = create_catalog(con, store)
        con.close()
        # the spec table is copied into the file (a table); the others are views over the Parquet files
        print(f"wrote {args.catalog} with {', '.join(views)} (views over the Parquet files; reference.gpu_specs "
              "a table)")
        if empty := empty_tables(store):
            print(f"note: no partition yet, so empty in this file until it is written again: {', '.join(empty)}",
                  file=sys.stderr)
        return 0
    con = connect()
    views = create_catalog(con, store)
    query = args.query or sys.stdin.read()
    if not query.strip():
        print("views: " + ", ".join(views))
        return 0
    try:
        rel = con.sql(query)
    except duckdb.Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if rel is None:
        return 0
    df = rel.df()
    import pandas as pd

    with pd.option_context("display.max_rows", args.max_rows, "display.width", 200, "display.max_columns", 50):
        print(df.to_string(max_rows=args.max_rows) if args.max_rows else df.to_string())
    return 0


def _import_dumps(args: argparse.Namespace) -> int:
    """``collect condor --from-file``: each saved dump one snapshot of the archive, at --snapshot-time, else
    the ads' own time, else the file's modification time (``condor_collector.import_dump``)."""
    from gpu_pipeline.lib.condor_archive import ArchiveError
    from gpu_pipeline.lib.condor_collector import ArchiveWriteError, import_dump

    when = None
    if args.snapshot_time:
        try:
            when = dt.datetime.fromisoformat(args.snapshot_time)
        except ValueError:
            print(f"error: --snapshot-time {args.snapshot_time!r} is not an ISO 8601 time", file=sys.stderr)
            return 2
        if when.tzinfo is None:
            print(f"error: --snapshot-time {args.snapshot_time!r} has no UTC offset (e.g. 2025-08-05T10:00:00+00:00)",
                  file=sys.stderr)
            return 2
        if len(args.from_file) > 1:
            print("error: --snapshot-time names one instant: give one --from-file with it", file=sys.stderr)
            return 2
    if args.collector:
        print("error: give --collector or --from-file, not both", file=sys.stderr)
        return 2
    names = list(dict.fromkeys(str(Path(n).resolve()) for n in args.from_file))
    if len(names) < len(args.from_file):
        print("note: a file given twice is imported once", file=sys.stderr)
    failures = 0
    for name in names:
        try:
            r = import_dump(name, Path(args.out), args.archive_tz, when)
        except (ArchiveWriteError, ArchiveError) as exc:  # the archive cannot be written: as the live collector, exit 4
            print(f"error: {exc}", file=sys.stderr)
            return 4
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            failures += 1
            continue
        print(f"{name}: {r.slots} slot(s), {r.rows} row(s) at {r.snapshot_time.isoformat()} -> {r.path}"
              + (f" ({r.skipped_ads} malformed ad(s) skipped)" if r.skipped_ads else ""))
    return 1 if failures else 0


def cmd_ui(args: argparse.Namespace) -> int:
    _load_env(args.dir)
    _default_dagster_home()
    dagster = shutil.which("dagster") or str(Path(sys.executable).with_name("dagster"))
    workspace = INSTANCE_TEMPLATE.with_name("workspace.yaml")
    argv = [dagster, "dev", "-w", str(workspace), "-h", args.host, "-p", str(args.port)]
    if args.dir:
        # dagster dev reads the .env of its working folder over the environment: run it in the demo
        # folder, whose .env is the demo's, not in one whose .env points at production data
        os.chdir(Path(args.dir).resolve())
    print(" ".join(argv))
    os.execv(argv[0], argv)
    return 0  # pragma: no cover


def cmd_collect_condor(args: argparse.Namespace) -> int:
    import logging
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    from gpu_pipeline.lib.condor_collector import collect_loop

    if args.archive_tz is None:  # the zone the pipeline reads the archive in
        _load_env(None, defaults=False)  # (unset, the message says so)
        given = (os.environ.get("GPU_PIPELINE_SOURCE_TZ") or "").strip()
        args.archive_tz = given or "UTC"
        print(f"archive time zone: {args.archive_tz} "
              f"({'GPU_PIPELINE_SOURCE_TZ' if given else 'GPU_PIPELINE_SOURCE_TZ unset: UTC'})", file=sys.stderr)
    try:
        ZoneInfo(args.archive_tz)
    except (ZoneInfoNotFoundError, ValueError):
        print(f"error: --archive-tz {args.archive_tz!r} is not a time zone (e.g. America/Chicago, UTC)",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.from_file:
        return _import_dumps(args)
    if not args.collector:
        print("error: collect condor needs --collector HOST, or --from-file DUMP", file=sys.stderr)
        return 2
    result = collect_loop(
        args.collector,
        Path(args.out),
        archive_tz=args.archive_tz,
        timeout_s=args.timeout,
        interval_s=args.interval,
        iterations=1 if args.once else args.iterations,
    )
    print(
        f"collect condor: {result.successes} snapshot(s) written, {result.failures} failure(s)"
        + (f"; stopped: {result.stopped_reason}" if result.stopped_reason else "")
    )
    return result.exit_code


def cmd_collect_nvml(args: argparse.Namespace) -> int:
    import logging

    from gpu_pipeline.lib.nvml_sampler import main_collect_nvml

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    return main_collect_nvml(Path(args.out), args.interval, args.iterations, flush_every=args.flush_every)


def cmd_bench(args: argparse.Namespace) -> int:
    from gpu_pipeline.bench import main_bench

    return main_bench(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu-pipeline", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("simulate", help="write a simulated cluster's raw sources and ground truth")
    s.add_argument("--start", type=_date, required=True)
    s.add_argument("--end", type=_date, required=True)
    s.add_argument("--gpus", type=int, default=DEMO_GPUS)
    s.add_argument("--out", required=True)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--cadence-minutes", type=float, default=5.0)
    s.add_argument("--timezone", default=DEMO_TZ, help="collector's local time zone")
    s.add_argument("--telemetry-interval", type=int, default=30, help="seconds; 0 disables telemetry")
    s.add_argument("--kueue-interval", type=int, default=0, help="seconds between Kueue scrapes; 0: none")
    s.set_defaults(func=cmd_simulate)

    d = sub.add_parser("demo", help="simulate a small cluster and run the whole pipeline on it")
    d.add_argument("--dir", default="gpu-pipeline-demo")
    d.add_argument("--gpus", type=int, default=DEMO_GPUS)
    d.add_argument("--seed", type=int, default=7)
    d.add_argument("--force", action="store_true",
                   help="replace DIR/.env and DIR/data even when they are not a demo's")
    d.set_defaults(func=cmd_demo)

    m = sub.add_parser("materialize", help="run every daily asset for a day range (one Dagster run)")
    m.add_argument("--start", type=_date, required=True)
    m.add_argument("--end", type=_date)
    m.add_argument("--dir", help="use the .env of a demo directory")
    m.set_defaults(func=cmd_materialize)

    q = sub.add_parser("sql", help="query the tables with DuckDB (views <layer>.<table>)")
    q.add_argument("query", nargs="?")
    q.add_argument("--dir", help="use the .env of a demo directory")
    q.add_argument("--data-root")
    q.add_argument("--catalog", help="write a DuckDB database file with the views instead of querying")
    q.add_argument("--max-rows", type=int, default=60)
    q.set_defaults(func=cmd_sql)

    c = sub.add_parser("collect", help="live collectors: HTCondor slot snapshots, NVML GPU samples")
    csub = c.add_subparsers(dest="source", required=True)
    cc = csub.add_parser("condor", help="append collector snapshots to the monthly gpu_state archive")
    cc.add_argument("--collector", help="HOST[:PORT] of the HTCondor collector")
    cc.add_argument("--from-file", action="append", metavar="DUMP",
                    help="instead of a collector: a saved `condor_status -long` or `condor_status -json` dump, "
                    "appended as one snapshot (repeatable)")
    cc.add_argument("--snapshot-time", help="with one --from-file: when the dump was taken, ISO 8601 with a UTC "
                    "offset (default: the ads' LastHeardFrom / MyCurrentTime, else the file's modification time)")
    cc.add_argument("--out", required=True, help="archive directory (gpu_state_YYYY-MM.db files)")
    cc.add_argument("--interval", type=_positive, default=300.0, help="seconds between snapshots")
    cc.add_argument("--iterations", type=_count, help="stop after N snapshots (default: run until stopped)")
    cc.add_argument("--once", action="store_true", help="take one snapshot and exit (for cron)")
    cc.add_argument("--timeout", type=_positive, default=20.0, help="collector query timeout, seconds")
    cc.add_argument("--archive-tz", help="time zone of the archive's timestamps and months; it must be the one "
                    "the pipeline reads the archive in (default: GPU_PIPELINE_SOURCE_TZ, from the environment or "
                    "./.env, else UTC)")
    cc.set_defaults(func=cmd_collect_condor)
    cn = csub.add_parser("nvml", help="sample every local GPU with NVML into daily Parquet files")
    cn.add_argument("--out", required=True)
    cn.add_argument("--interval", type=_positive, default=30.0, help="seconds between samples")
    cn.add_argument("--iterations", type=_count)
    cn.add_argument("--flush-every", type=_count, default=10, help="rewrite the day file every N samples")
    cn.set_defaults(func=cmd_collect_nvml)

    from gpu_pipeline.bench import add_arguments as bench_arguments

    b = sub.add_parser("bench", help="benchmark the pipeline on simulated clusters of growing size")
    bench_arguments(b)
    b.set_defaults(func=cmd_bench)

    u = sub.add_parser("ui", help="start the Dagster UI (dagster dev) on the configured data")
    u.add_argument("--dir", help="use the .env of a demo directory")
    u.add_argument("--host", default="127.0.0.1")
    u.add_argument("--port", type=int, default=3000)
    u.set_defaults(func=cmd_ui)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
