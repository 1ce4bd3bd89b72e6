"""Compare pipeline output with the simulator's ground truth."""

from __future__ import annotations

from pathlib import Path

import duckdb


def state_agreement(
    data_root: Path, truth_dir: Path, at_snapshot: bool = False
) -> tuple[int, int, list[tuple[str, str, int]]]:
    """(buckets compared, buckets agreeing, confusion rows) for metrics/gpu_states vs truth intervals.

    The truth state of a bucket is the true state at the bucket's start, or with ``at_snapshot`` at
    the instant of the snapshot the state was taken from (the bucket start when there was none).
    """
    t = "coalesce(st.snapshot_utc, st.bucket_start_utc)" if at_snapshot else "st.bucket_start_utc"
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    rows = con.sql(
        f"""
        SELECT st.state AS got, coalesce(tr.state, 'missing') AS truth, count(*) AS n
        FROM read_parquet(?) st
        LEFT JOIN read_parquet(?) tr
          ON tr.gpu_id = st.gpu_id AND {t} >= tr.start_utc AND {t} < tr.end_utc
        GROUP BY ALL ORDER BY n DESC
        """,
        params=[str(data_root / "metrics" / "gpu_states" / "*" / "*.parquet"),
                str(truth_dir / "gpu_state_intervals.parquet")],
    ).fetchall()
    total = sum(n for _, _, n in rows)
    agree = sum(n for got, truth, n in rows if got == truth)
    return total, agree, rows
