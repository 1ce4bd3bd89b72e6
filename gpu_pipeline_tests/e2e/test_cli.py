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
