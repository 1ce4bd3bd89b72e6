"""lib/db.connect: each connection its own session (UTC), with the limits from the arguments or the environment."""

import pyarrow as pa
import pytest

from gpu_pipeline.lib.db import ENV_MEMORY_LIMIT, ENV_THREADS, connect


def _setting(con, name):
    return con.execute(f"SELECT current_setting('{name}')").fetchone()[0]


def test_connections_do_not_share_their_session():
    a, b = connect(), connect()
    a.execute("CREATE TEMP TABLE only_a AS SELECT 1 AS x")
    a.register("arrow_a", pa.table({"x": [1, 2]}))
    a.execute("SET TimeZone = 'America/Chicago'")
    for name in ("only_a", "arrow_a"):
        with pytest.raises(Exception, match="does not exist"):
            b.execute(f"SELECT * FROM {name}")
    assert a.execute("SELECT count(*) FROM arrow_a").fetchone()[0] == 2
    assert _setting(b, "TimeZone") in ("UTC", "Etc/UTC")
    a.close()
    c = connect()  # a closed connection leaves nothing behind
    assert _setting(c, "TimeZone") in ("UTC", "Etc/UTC")
    with pytest.raises(Exception, match="does not exist"):
        c.execute("SELECT * FROM only_a")
    assert b.execute("SELECT 41 + 1").fetchone()[0] == 42
    b.close()
    c.close()


def test_limits_come_from_the_arguments_or_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GPU_PIPELINE_DUCKDB_TEMP_DIR", str(tmp_path / "spill"))
    monkeypatch.setenv(ENV_MEMORY_LIMIT, "300MB")
    monkeypatch.setenv(ENV_THREADS, "1")
    con = connect()
    assert _setting(con, "memory_limit") == "286.1 MiB" and _setting(con, "threads") == 1
    assert (tmp_path / "spill").is_dir()
    other = connect(threads=2, memory_limit="500MB")
    assert _setting(other, "memory_limit") == "476.8 MiB" and _setting(other, "threads") == 2
    assert _setting(connect(), "memory_limit") == "286.1 MiB"  # the environment again
    monkeypatch.delenv(ENV_MEMORY_LIMIT)
    monkeypatch.delenv(ENV_THREADS)
    assert _setting(connect(), "memory_limit") != "286.1 MiB"
