"""`gpu-pipeline materialize` and `sql` as a cron user would run them."""

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from gpu_pipeline_tests.defs.test_definitions import _hand_archive

EXE = str(Path(sys.executable).with_name("gpu-pipeline"))


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_PIPELINE_", "DAGSTER_"))}
    env.update(extra)
    return env


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
    for day in ("2025-08-05", "2025-08-06"):
        t = pq.read_table(tmp_path / "data" / "metrics" / "gpu_states" / f"date={day}" / "part-0.parquet")
        assert t.num_rows == 2 * 288
    assert (tmp_path / "home" / "dagster.yaml").is_file()

    out = subprocess.run([EXE, "sql", "SELECT count(*) AS n FROM clean.slot_snapshots"],
                         cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == str(2 * 288 * 3)


def test_materialize_without_configuration_is_a_clear_error(tmp_path):
    proc = subprocess.run([EXE, "materialize", "--start", "2025-08-05"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "GPU_PIPELINE_DATA_ROOT" in proc.stderr and "GPU_PIPELINE_CONDOR_ARCHIVE" in proc.stderr


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
