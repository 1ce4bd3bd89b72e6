"""A run killed with SIGKILL while writing a partition leaves the previous file intact."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pyarrow as pa

from gpu_pipeline.lib.schemas import QUARANTINE
from gpu_pipeline.lib.store import Store

WRITER = textwrap.dedent(
    """
    import sys, pyarrow as pa
    from gpu_pipeline.lib import store as store_mod
    from gpu_pipeline.lib.schemas import QUARANTINE
    from gpu_pipeline.lib.store import Store

    # Slow the write down so the parent can kill it mid-way: write the temp file in small pieces.
    import os, tempfile
    def slow_atomic_write_bytes(target, data):
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "wb") as fh:
            print("WRITING", flush=True)
            for i in range(0, len(data), 4096):
                fh.write(data[i:i + 4096]); fh.flush()
                import time; time.sleep(0.01)
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    store_mod.atomic_write_bytes = slow_atomic_write_bytes
    n = 200_000
    t = pa.Table.from_pydict({"source_table": ["new"] * n, "reason": [f"r{i}" for i in range(n)],
                              "row_json": ["{}"] * n})
    Store(sys.argv[1]).write_partition(QUARANTINE, "2025-08-06", t)
    print("DONE", flush=True)
    """
)


def test_sigkill_mid_write_keeps_the_previous_partition(data_root, tmp_path):
    store = Store(data_root)

    store.write_partition(QUARANTINE, "2025-08-06", pa.Table.from_pydict(
        {"source_table": ["old"] * 3, "reason": ["a", "b", "c"], "row_json": ["{}"] * 3}))
    path = store.partition_file(QUARANTINE, "2025-08-06")
    before = path.read_bytes()

    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    proc = subprocess.Popen([sys.executable, str(script), str(data_root)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "WRITING"
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    # the previous partition is byte-for-byte intact and readable
    assert path.read_bytes() == before
    assert store.read_table(QUARANTINE, "2025-08-06").column("source_table").to_pylist() == ["old"] * 3
    assert [p.name for p in path.parent.glob(".*.tmp")]  # the killed writer's temp file
    # the re-run succeeds and replaces it, and removes the killed writer's temp file
    store.write_partition(QUARANTINE, "2025-08-06", pa.Table.from_pydict(
        {"source_table": ["new"], "reason": ["x"], "row_json": ["{}"]}))
    assert store.read_table(QUARANTINE, "2025-08-06").column("source_table").to_pylist() == ["new"]
    assert store.partition_days(QUARANTINE) == ["2025-08-06"]
    assert sorted(p.name for p in path.parent.iterdir()) == [".lock", "part-0.parquet"]
