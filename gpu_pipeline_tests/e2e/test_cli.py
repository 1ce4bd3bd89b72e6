"""`gpu-pipeline materialize` and `sql` as a cron user would run them."""

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gpu_pipeline_tests.defs.test_definitions import _hand_archive

EXE = str(Path(sys.executable).with_name("gpu-pipeline"))


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_PIPELINE_", "DAGSTER_"))}
    env.update(extra)
    return env


def _materialize_one_day(tmp_path, env_lines: str) -> subprocess.CompletedProcess:
    """``materialize --start 2025-08-05`` in ``tmp_path`` over a hand-made archive of that day, its
    ``.env`` the archive, a Dagster home and ``env_lines``."""
    _hand_archive(tmp_path / "archive", ["2025-08-05"])
    (tmp_path / "home").mkdir()
    (tmp_path / ".env").write_text(env_lines + f"GPU_PIPELINE_CONDOR_ARCHIVE={tmp_path / 'archive'}\n"
                                   f"DAGSTER_HOME={tmp_path / 'home'}\nGPU_PIPELINE_START_DATE=2025-08-01\n")
    return subprocess.run([EXE, "materialize", "--start", "2025-08-05"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)


def test_materialize_a_range_from_a_dotenv_file(tmp_path):
    _hand_archive(tmp_path / "archive", ["2025-08-05", "2025-08-06"])
    (tmp_path / "home").mkdir()
    (tmp_path / ".env").write_text(
        f"GPU_PIPELINE_DATA_ROOT={tmp_path / 'data'}\n"
        f"GPU_PIPELINE_CONDOR_ARCHIVE={tmp_path / 'archive'}\n"
        f"DAGSTER_HOME={tmp_path / 'home'}\n"
        "GPU_PIPELINE_START_DATE=2025-08-01\n"
    )
    proc = subprocess.run([EXE, "materialize", "--start", "2025-08-05", "--end", "2025-08-06"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "2025-08-05 .. 2025-08-06: SUCCESS" in proc.stdout
    # the run's log at INFO: the assets' notes are there, no DEBUG line per event (about 400 for a demo week)
    log = proc.stdout + proc.stderr
    assert " - INFO - " in log and " - DEBUG - " not in log
    for day in ("2025-08-05", "2025-08-06"):
        t = pq.read_table(tmp_path / "data" / "metrics" / "gpu_states" / f"date={day}" / "part-0.parquet")
        assert t.num_rows == 2 * 288
    assert (tmp_path / "home" / "dagster.yaml").is_file()

    out = subprocess.run([EXE, "sql", "SELECT count(*) AS n FROM clean.slot_snapshots"],
                         cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == str(2 * 288 * 3)


def test_a_blank_data_root_is_the_default_one_not_the_working_folder(tmp_path):
    """A ``.env`` line ``GPU_PIPELINE_DATA_ROOT=`` is unset: the tables go under
    ``$DAGSTER_HOME/data`` (DESIGN 3), and ``sql`` finds them there. It resolved to ``''``, which
    the store read as the working folder: raw/, clean/, ... written beside the checkout."""
    proc = _materialize_one_day(tmp_path, "GPU_PIPELINE_DATA_ROOT=\n")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"GPU_PIPELINE_DATA_ROOT not set: writing under {tmp_path / 'home' / 'data'}" in proc.stderr
    assert pq.read_table(tmp_path / "home" / "data" / "metrics" / "gpu_states" / "date=2025-08-05"
                         / "part-0.parquet").num_rows == 2 * 288
    assert not (tmp_path / "raw").exists() and not (tmp_path / "metrics").exists()
    out = subprocess.run([EXE, "sql", "SELECT count(*) AS n FROM metrics.gpu_states"],
                         cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == str(2 * 288)


def test_materialize_without_configuration_is_a_clear_error(tmp_path):
    proc = subprocess.run([EXE, "materialize", "--start", "2025-08-05"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    # the data root has a default (DESIGN 3); the archive has none
    assert "set GPU_PIPELINE_CONDOR_ARCHIVE" in proc.stderr and "GPU_PIPELINE_DATA_ROOT" not in proc.stderr


def test_a_range_outside_the_partitions_is_one_line_and_nothing_is_written(tmp_path):
    """A day after the last complete day (or before GPU_PIPELINE_START_DATE) is refused before any
    run: one line naming the partitions' range, exit 2, no file written (a future day wrote 14
    files; a day before the start printed the steps' invariant errors)."""
    env = _env(GPU_PIPELINE_DATA_ROOT=str(tmp_path / "data"), GPU_PIPELINE_CONDOR_ARCHIVE=str(tmp_path),
               GPU_PIPELINE_START_DATE="2025-08-01")
    for start, end in (("2099-01-01", "2099-01-01"), ("2025-07-30", "2025-08-02"), ("2025-08-05", "2025-08-04")):
        proc = subprocess.run([EXE, "materialize", "--start", start, "--end", end], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("error: ") and ("2025-08-01 .. " in line or "before --start" in line)
    assert not (tmp_path / "data").exists() and not (tmp_path / ".dagster_home").exists()


def test_sql_errors_are_one_message(tmp_path):
    missing = subprocess.run([EXE, "sql", "--data-root", str(tmp_path / "nowhere"), "SELECT 1"], cwd=tmp_path,
                             env=_env(), capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no such data root" in missing.stderr
    assert "--dir DIR or --data-root" not in missing.stderr  # it was given: nothing to tell
    # run outside the folder whose .env configures the pipeline: the message says so
    (tmp_path / "elsewhere").mkdir()
    lost = subprocess.run([EXE, "sql", "SELECT 1"], cwd=tmp_path / "elsewhere", env=_env(), capture_output=True,
                          text=True, timeout=120)
    assert lost.returncode == 2 and "no such data root" in lost.stderr and "--dir DIR or --data-root" in lost.stderr
    (tmp_path / "data").mkdir()
    bad = subprocess.run([EXE, "sql", "--data-root", str(tmp_path / "data"), "SELEC 1"], cwd=tmp_path, env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stderr.startswith("error: Parser Error") and "Traceback" not in bad.stderr


def test_without_dagster_home_the_runs_are_kept_in_the_working_directory(tmp_path):
    """Unset, DAGSTER_HOME is ./.dagster_home, made from the template: the run is kept there (an
    ephemeral instance lost it, and `gpu-pipeline ui` lost its schedules and backfills)."""
    import dagster as dg

    _hand_archive(tmp_path / "archive", ["2025-08-05"])
    env = _env(GPU_PIPELINE_DATA_ROOT=str(tmp_path / "data"), GPU_PIPELINE_CONDOR_ARCHIVE=str(tmp_path / "archive"),
               GPU_PIPELINE_START_DATE="2025-08-01")
    proc = subprocess.run([EXE, "materialize", "--start", "2025-08-05"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    home = tmp_path / ".dagster_home"
    assert f"DAGSTER_HOME not set: using {home}" in proc.stderr
    assert (home / "dagster.yaml").read_text() == (Path(__file__).parents[2] / "dagster.yaml").read_text()
    old = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        with dg.DagsterInstance.get() as instance:
            assert len(instance.get_run_records()) == 1
    finally:
        if old is None:
            os.environ.pop("DAGSTER_HOME")
        else:
            os.environ["DAGSTER_HOME"] = old


def test_collect_condor_with_an_unknown_time_zone_is_a_usage_error(tmp_path):
    proc = subprocess.run([EXE, "collect", "condor", "--collector", "cm.example.edu", "--out", str(tmp_path / "a"),
                           "--archive-tz", "Amerca/Chicago", "--once"], env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "'Amerca/Chicago' is not a time zone" in proc.stderr and not (tmp_path / "a").exists()


def test_a_demo_directory_is_the_whole_configuration(tmp_path, monkeypatch, capsys):
    """Production settings in the shell do not leak into a run on a demo directory: its .env is all
    of the GPU_PIPELINE_ variables (an exported GPU_PIPELINE_ES_HOSTS sent the demo to that
    Elasticsearch instead of its job files)."""
    from gpu_pipeline import cli

    (tmp_path / ".env").write_text(f"GPU_PIPELINE_DATA_ROOT={tmp_path / 'data'}\nGPU_PIPELINE_JOBS_DIR={tmp_path}\n"
                                   f"DAGSTER_HOME={tmp_path / 'home'}\n")
    monkeypatch.setattr(os, "environ", dict(os.environ))  # this process's environment stays as it is
    monkeypatch.setenv("GPU_PIPELINE_ES_HOSTS", "https://es.prod.example:9200")
    monkeypatch.setenv("GPU_PIPELINE_DATA_ROOT", "/srv/prod/data")
    monkeypatch.setenv("PATH_UNRELATED", "kept")
    cli._load_env(str(tmp_path))
    assert "GPU_PIPELINE_ES_HOSTS" not in os.environ
    assert os.environ["GPU_PIPELINE_DATA_ROOT"] == str(tmp_path / "data")
    assert os.environ["GPU_PIPELINE_JOBS_DIR"] == str(tmp_path)
    assert os.environ["PATH_UNRELATED"] == "kept"
    assert "ignoring GPU_PIPELINE_ES_HOSTS" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--timeout", "0"], ["--timeout", "nan"], ["--interval", "-5"],
                                  ["--iterations", "0"]])
def test_collect_condor_with_a_bad_number_is_a_usage_error(tmp_path, args):
    """A zero timeout looped for ever (each try raised, and the loop retried it), a bad count exited 1
    (which says a snapshot was written): argparse refuses them, exit 2, nothing written."""
    proc = subprocess.run([EXE, "collect", "condor", "--collector", "127.0.0.1:9", "--out", str(tmp_path / "a"),
                           "--once", *args], env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"argument {args[0]}: {args[1]!r} is not" in proc.stderr and not (tmp_path / "a").exists()


def test_collect_condor_writes_the_archive_in_the_pipelines_source_zone(tmp_path):
    """Without --archive-tz the collector takes GPU_PIPELINE_SOURCE_TZ, the zone the pipeline reads the
    archive in (its own default of UTC shifted every snapshot by the zone's offset, without a word)."""
    (tmp_path / ".env").write_text("GPU_PIPELINE_SOURCE_TZ=America/Chicago\n")
    proc = subprocess.run([EXE, "collect", "condor", "--collector", "127.0.0.1:9", "--out", str(tmp_path / "a"),
                           "--once", "--timeout", "2"], env=_env(), capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 3  # nothing listening
    assert "archive time zone: America/Chicago (GPU_PIPELINE_SOURCE_TZ)" in proc.stderr


def test_a_dotenv_in_the_working_folder_wins_over_the_shell_as_in_dagster(tmp_path, monkeypatch):
    """The commands read ./.env as Dagster's own commands (dagster dev, the daemon) do: over the
    shell's variables, so a manual run and a scheduled one see the same settings."""
    from gpu_pipeline import cli

    (tmp_path / ".env").write_text(f"GPU_PIPELINE_DATA_ROOT={tmp_path / 'data'}\n")
    monkeypatch.setattr(os, "environ", dict(os.environ))
    monkeypatch.setenv("GPU_PIPELINE_DATA_ROOT", "/srv/elsewhere")
    monkeypatch.chdir(tmp_path)
    cli._load_env(None)
    assert os.environ["GPU_PIPELINE_DATA_ROOT"] == str(tmp_path / "data")


def test_the_ui_of_a_demo_directory_runs_in_it(tmp_path, monkeypatch):
    """dagster dev reads the .env of its working folder over the environment: `ui --dir DEMO` started
    from a folder whose .env points at production data wrote the demo's runs there. It now runs in
    the demo folder."""
    from gpu_pipeline import cli

    demo, elsewhere = tmp_path / "demo", tmp_path / "ops"
    demo.mkdir(), elsewhere.mkdir()
    (demo / ".env").write_text(cli._env_line("GPU_PIPELINE_DATA_ROOT", str(demo / "data"))
                               + cli._env_line("DAGSTER_HOME", str(demo / "home")))
    (elsewhere / ".env").write_text("GPU_PIPELINE_DATA_ROOT=/srv/prod/data\n")
    monkeypatch.setattr(os, "environ", dict(os.environ))
    monkeypatch.chdir(elsewhere)
    started = {}

    def execv(path, argv):
        started.update(cwd=os.getcwd(), argv=argv)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", execv)
    with pytest.raises(SystemExit):
        cli.main(["ui", "--dir", str(demo)])
    assert started["cwd"] == str(demo) and started["argv"][1] == "dev"
    assert os.environ["GPU_PIPELINE_DATA_ROOT"] == str(demo / "data")


def test_the_demo_keeps_a_folder_that_is_not_a_demos(tmp_path):
    """`demo --dir` over a folder with a production .env (or tables without a demo .env) replaced
    them without a word: it refuses, exit 2, and touches nothing; a demo's .env (with the demo's
    first line, or from before that line: its archive the demo's) is a demo's to replace."""
    from gpu_pipeline import cli

    prod = tmp_path / "prod"
    prod.mkdir()
    env = "GPU_PIPELINE_DATA_ROOT=/var/lib/gpu_pipeline/data\nGPU_PIPELINE_CONDOR_ARCHIVE=/var/lib/gpu_state\n"
    (prod / ".env").write_text(env)
    proc = subprocess.run([EXE, "demo", "--dir", str(prod), "--gpus", "8"], env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and "exists and is not a demo's" in proc.stderr
    assert (prod / ".env").read_text() == env and sorted(p.name for p in prod.iterdir()) == [".env"]
    tables = tmp_path / "tables"
    (tables / "data" / "metrics").mkdir(parents=True)
    assert "holds tables" in cli._demo_dir_error(tables)
    old_demo = tmp_path / "old_demo"
    old_demo.mkdir()
    (old_demo / ".env").write_text(f"GPU_PIPELINE_CONDOR_ARCHIVE={old_demo / 'sources' / 'condor'}\n")
    (old_demo / "data").mkdir()
    assert cli._demo_dir_error(old_demo) is None
    (old_demo / ".env").write_text(cli.DEMO_ENV_MARK + "\n" + cli._env_line("GPU_PIPELINE_CONDOR_ARCHIVE", "/x"))
    assert cli._demo_dir_error(old_demo) is None


def test_the_demos_dotenv_gives_its_values_back_as_they_are(tmp_path):
    """Values are quoted: a folder named `run #2` was cut at the ` #` (a comment to python-dotenv)."""
    from dotenv import dotenv_values

    from gpu_pipeline import cli

    values = {"A": str(tmp_path / "run #2" / "data"), "B": "it's a \\ path", "C": ""}
    (tmp_path / ".env").write_text("".join(cli._env_line(k, v) for k, v in values.items()))
    assert dotenv_values(tmp_path / ".env") == values


@pytest.mark.parametrize("name", ["demo 'q'", "demo #1", 'say "hi"', "plain"])
def test_the_demos_printed_commands_paste_back_into_a_shell(tmp_path, name):
    """The folder in the commands the demo prints was written as is: `--dir /x/demo 'q'` split into
    two words in a shell, and the query became an unrecognized argument."""
    import shlex

    from gpu_pipeline import cli

    base = tmp_path / name
    cmd = cli._command()
    ui, sql = (line.strip() for line in cli._next_steps(base) if line.startswith(f"  {cmd} "))
    assert shlex.split(ui)[1:4] == ["ui", "--dir", str(base)]
    assert shlex.split(sql)[1:] == ["sql", "--dir", str(base), "SELECT state, count(*) FROM metrics.gpu_states GROUP BY 1"]


def test_the_demos_printed_commands_name_the_installed_command_where_the_shell_would_not_find_it(monkeypatch):
    """The README's first command installs into a virtualenv it does not activate: the demo printed
    ``gpu-pipeline ui ...``, which such a shell does not find. Off the PATH the command is its path;
    on it, its name."""
    import shlex
    import sys
    from pathlib import Path

    from gpu_pipeline import cli

    exe = Path(sys.executable).with_name("gpu-pipeline")
    assert exe.is_file()
    monkeypatch.setenv("PATH", "/nonexistent")
    assert shlex.split(cli._command()) == [str(exe)]
    monkeypatch.setenv("PATH", str(exe.parent))
    assert cli._command() == "gpu-pipeline"


def test_the_readme_counts_the_spec_tables_models():
    """The README said 31 models when the table had 32."""
    from pathlib import Path

    from gpu_pipeline.lib.gpu_specs import spec_table

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert f"the spec table: {spec_table().num_rows} models" in readme


def test_materialize_says_why_a_check_failed(tmp_path):
    """A configured telemetry folder with nothing for the day: the run printed only which check
    failed (in Dagster's error), not the day or the figure it failed on."""
    (tmp_path / "telemetry").mkdir()
    proc = _materialize_one_day(tmp_path, f"GPU_PIPELINE_DATA_ROOT={tmp_path / 'data'}\n"
                                          f"GPU_PIPELINE_TELEMETRY_DIR={tmp_path / 'telemetry'}\n")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("check failed")]
    assert 'check failed (ERROR): raw/gpu_telemetry has_samples: days_without_samples=["2025-08-05"]' in lines
    assert any(ln.startswith("check failed (ERROR): raw/gpu_telemetry coverage: ") and "below_threshold=" in ln
               for ln in lines)


def test_a_failed_checks_line_shows_the_days_with_something_to_say_first():
    """A month's run: the per-day figure of every healthy day (0, 0.95) came first and the line's cut
    hid the bad day; a coverage of 0.0, what a check fails on, was dropped as empty."""
    import dagster as dg

    from gpu_pipeline import cli

    days = {f"2025-08-{d:02d}": 0 for d in range(1, 31)}
    ev = dg.AssetCheckEvaluation(
        asset_key=dg.AssetKey(["clean", "jobs"]), check_name="unique_run_key", passed=False,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={"coverage_by_day": dg.MetadataValue.json({**{d: 0.95 for d in days}, "2025-08-31": 0.42}),
                  "duplicates_by_day": dg.MetadataValue.json({**days, "2025-08-31": 3}),
                  "coverage": 0.0, "note": dg.MetadataValue.md("two\nlines")})
    (line,) = cli._failed_checks([ev])
    # what the check fails on first (the duplicates, only the day that has them), then the rest
    assert line.startswith('check failed (ERROR): clean/jobs unique_run_key: duplicates_by_day={"2025-08-31": 3}; '
                           "coverage_by_day=")
    assert "coverage=0.0" in line and "\n" not in line and '"2025-08-01": 0,' not in line
    # a figure whose every day is 0 (coverage 0 on the one day that failed) is shown whole
    ev2 = dg.AssetCheckEvaluation(asset_key=dg.AssetKey(["raw", "gpu_telemetry"]), check_name="coverage",
                                  passed=False, metadata={"below_threshold": dg.MetadataValue.json({"2025-08-05": 0.0})})
    assert cli._failed_checks([ev2]) == ['check failed (ERROR): raw/gpu_telemetry coverage: '
                                         'below_threshold={"2025-08-05": 0.0}']
    # shares by day: the worst first, a 0.0 (no data) kept
    assert 'coverage_by_day={"2025-08-31": 0.42, "2025-08-01": 0.95' in line
    ev3 = dg.AssetCheckEvaluation(asset_key=dg.AssetKey(["raw", "gpu_telemetry"]), check_name="coverage",
                                  passed=False, metadata={"below_threshold": dg.MetadataValue.json(
                                      {"2025-08-06": 0.5, "2025-08-05": 0.0})})
    assert cli._failed_checks([ev3]) == ['check failed (ERROR): raw/gpu_telemetry coverage: '
                                         'below_threshold={"2025-08-05": 0.0, "2025-08-06": 0.5}']
