"""The benchmark's baseline: the original reporting tool's approach, in pandas.

The scripts that operators ran before this pipeline (CHTC's GPU reports: ``usage_stats.py``,
``gpu_utils.filter_df`` and the timeline-heatmap script) work like this:

1. load the whole window into one pandas DataFrame (``pd.read_sql_query("SELECT * FROM gpu_state
   WHERE timestamp BETWEEN ? AND ?")`` on each monthly SQLite file, then ``pd.to_datetime``);
2. floor every timestamp to its bucket (``df["timestamp"].dt.floor("15min")``, 5 minutes for the
   heatmap);
3. loop over the sorted buckets; in each, select the bucket's rows with a boolean mask over the
   whole frame (``bucket_df = df[df["bucket"] == bucket]``);
4. classify rows with boolean masks on ``Name`` (contains "backfill"), ``PrioritizedProjects``
   (empty or not) and ``State``; resolve a GPU named by several rows with a ``_rank`` column set
   through ``df.loc[mask, "_rank"] = k``, ``sort_values`` and ``drop_duplicates("AssignedGPUs")``;
5. per tier and device, count ``AssignedGPUs.dropna().unique()`` of the Claimed rows and of all
   Claimed-or-Unclaimed rows; the percentage of a bucket is ``claimed / total * 100``; the daily
   figure is the plain mean of the per-bucket percentages (a Python ``sum(list) / len(list)``).

This module does exactly that, with the *definitions* of DESIGN.md 5.1-5.2 (5-minute buckets, the
rank order claimed primary > claimed backfill > unclaimed primary > other primary > unclaimed
backfill, carry-forward of the latest earlier snapshot into an empty bucket, GPUs seen during the
day, per-GPU device, the TOTAL tier that counts each GPU once, the ``ALL`` device), so that its
output equals the pipeline's and the benchmark compares two implementations of one computation.

Where it departs from the tool, it is in the baseline's favour, so the comparison is not against a
strawman:

- the tool re-filtered the whole frame for every (tier, device, bucket) triple (its by-device report
  nests the bucket loop inside the tier and device loops); by default the bucket is selected once
  here and the tier / device masks run on the bucket's columns only (``loop_order="tool"`` keeps
  the tool's nesting, for the benchmark's second figure);
- the tool classified rows with ``df.apply(classify, axis=1)`` (one Python call per row); here the
  classification is vectorized (``numpy.select`` on the same masks).

Pure pandas / numpy / sqlite3: no DuckDB, no Arrow compute, no Dagster.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import sqlite3
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd

__all__ = [
    "BUCKET",
    "CLEAN_TO_ORIGINAL",
    "allocation_baseline",
    "from_clean",
    "load_clean_parquet",
    "load_sqlite_window",
    "states_baseline",
]

BUCKET = dt.timedelta(minutes=5)
STALE_FACTOR = 1.5
RUN_AGREE = 1.5  # gaps within this factor of their median agree on a cadence (as the states SQL)
# Snapshot times at most this far apart, and at most this share of the 90th-percentile gap, are the
# parts of one snapshot (the pipeline's rule, states.SNAPSHOT_PARTS_*).
PARTS_MAX_US, PARTS_SHARE = 60_000_000, 0.1
LOOKBACK = dt.timedelta(hours=1)
TIERS = ("priority", "shared", "backfill")
TOTAL_TIER = "TOTAL"
ALL_DEVICES = "ALL"
UNKNOWN_DEVICE = "unknown"
ALLOCATION_TIERS = (*TIERS, TOTAL_TIER)

#: clean/slot_snapshots column -> the original archive's column name
CLEAN_TO_ORIGINAL = {
    "snapshot_utc": "timestamp",
    "host": "Machine",
    "slot_name": "Name",
    "gpu_id": "AssignedGPUs",
    "slot_state": "State",
    "device_name": "GPUs_DeviceName",
    "prioritized_projects": "PrioritizedProjects",
    "gpu_usage_pct": "GPUsAverageUsage",
    "remote_owner": "RemoteOwner",
    "global_job_id": "GlobalJobId",
}
_COLUMNS = list(CLEAN_TO_ORIGINAL.values())
_FILE_RE = re.compile(r"^gpu_state_(\d{4})-(\d{2})\.db$")


# -- loading (step 1) -------------------------------------------------------------------------


def from_clean(df: pd.DataFrame) -> pd.DataFrame:
    """A clean-table DataFrame renamed to the archive's column names (what the tool works on).

    ``GPUsAverageUsage`` then holds the clean table's percent, not the archive's 0-1 fraction."""
    out = df[list(CLEAN_TO_ORIGINAL)].rename(columns=CLEAN_TO_ORIGINAL)
    out["timestamp"] = pd.to_datetime(out["timestamp"], utc=True)
    out["PrioritizedProjects"] = out["PrioritizedProjects"].fillna("")
    return out.reset_index(drop=True)


def load_clean_parquet(paths: list[str | Path]) -> pd.DataFrame:
    """The day's rows from the pipeline's own clean Parquet files, with pandas (same files as the
    pipeline reads), renamed to the original column names."""
    frames = [pd.read_parquet(p, columns=list(CLEAN_TO_ORIGINAL)) for p in paths]
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in _COLUMNS})
    return from_clean(pd.concat(frames, ignore_index=True))


def load_sqlite_window(
    archive_dir: str | Path, start_utc: dt.datetime, end_utc: dt.datetime, source_tz: str = "UTC"
) -> pd.DataFrame:
    """The tool's loader: ``SELECT * ... WHERE timestamp BETWEEN ? AND ?`` on every monthly file
    the (local) window touches, ``pd.to_datetime``, concatenated and sorted; here also localized
    to UTC so that it can be compared with the pipeline's tables. Like the tool, it does not
    resolve the repeated hour of a daylight-saving fall-back: those rows are dropped. No GPU-id
    normalization, quarantine or de-duplication either (the pipeline's clean step does those)."""
    zone = ZoneInfo(source_tz)
    lo = start_utc.astimezone(zone).replace(tzinfo=None) - dt.timedelta(seconds=1)
    hi = end_utc.astimezone(zone).replace(tzinfo=None)
    months = set()
    cur = dt.date(lo.year, lo.month, 1)
    while cur <= dt.date(hi.year, hi.month, 1):
        months.add(f"{cur:%Y-%m}")
        cur = (cur + dt.timedelta(days=32)).replace(day=1)
    frames = []
    for path in sorted(Path(archive_dir).iterdir()):
        m = _FILE_RE.match(path.name)
        if not m or f"{m.group(1)}-{m.group(2)}" not in months:
            continue
        con = sqlite3.connect(path)
        try:
            df = pd.read_sql_query(
                "SELECT * FROM gpu_state WHERE timestamp BETWEEN ? AND ? ORDER BY timestamp",
                con,
                params=[lo.strftime("%Y-%m-%d %H:%M:%S.%f"), hi.strftime("%Y-%m-%d %H:%M:%S.%f")],
            )
        finally:
            con.close()
        if len(df):
            frames.append(df)
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in _COLUMNS})
    df = pd.concat(frames, ignore_index=True)
    df["timestamp"] = (
        pd.to_datetime(df["timestamp"]).dt.tz_localize(zone, ambiguous="NaT", nonexistent="NaT").dt.tz_convert("UTC")
    )
    df = df[(df["timestamp"] >= start_utc) & (df["timestamp"] < end_utc)]
    for col in _COLUMNS:
        if col not in df.columns:
            df[col] = None
    df["PrioritizedProjects"] = df["PrioritizedProjects"].fillna("")
    # GPUsAverageUsage is a 0-1 fraction in the archive; the clean table (and its renamed column
    # here) holds percent.
    usage = pd.to_numeric(df["GPUsAverageUsage"], errors="coerce")
    df["GPUsAverageUsage"] = (usage * 100.0).where(usage.between(0, 1))
    return df[_COLUMNS].sort_values("timestamp", kind="stable").reset_index(drop=True)


# -- shared preamble (steps 2 and 4's masks) ----------------------------------------------------


def _prepare(df: pd.DataFrame, start_utc: dt.datetime, end_utc: dt.datetime) -> pd.DataFrame:
    df = df[(df["timestamp"] >= start_utc - LOOKBACK) & (df["timestamp"] < end_utc)].copy()
    is_backfill = df["Name"].str.contains("backfill", case=False, na=False)
    prioritized = df["PrioritizedProjects"].fillna("").str.strip() != ""
    df["_tier"] = np.where(is_backfill, "backfill", np.where(prioritized, "priority", "shared"))
    df["_backfill"] = is_backfill
    # The tool's ranking, extended to DESIGN.md 5.1's order.
    df["_rank"] = 0
    df.loc[(df["State"] == "Claimed") & ~is_backfill, "_rank"] = 5
    df.loc[(df["State"] == "Claimed") & is_backfill, "_rank"] = 4
    df.loc[(df["State"] == "Unclaimed") & ~is_backfill, "_rank"] = 3
    df.loc[(df["State"] != "Claimed") & (df["State"] != "Unclaimed") & ~is_backfill, "_rank"] = 2
    df.loc[(df["State"] == "Unclaimed") & is_backfill, "_rank"] = 1
    # The tool floors with ``dt.floor("5min")``; counting from the window start is the same on a
    # 5-minute grid and stays right for a day that starts off the grid.
    start = pd.Timestamp(start_utc)
    # a snapshot written in parts seconds apart is known by its first part (states.snapshot_firsts)
    epoch0 = pd.Timestamp(0, tz="UTC")
    t_us = ((df["timestamp"] - epoch0) // pd.Timedelta(microseconds=1)).to_numpy(dtype=np.int64)
    times = np.unique(t_us)
    gaps = np.diff(times)
    part_gap = min(PARTS_MAX_US, PARTS_SHARE * float(np.quantile(gaps, 0.9))) if len(gaps) else 0.0
    new_snapshot = np.concatenate(([True], gaps > part_gap))
    first_us = times[new_snapshot][np.cumsum(new_snapshot) - 1][np.searchsorted(times, t_us)]
    df["_first"] = epoch0 + pd.to_timedelta(first_us, unit="us")
    df["bucket"] = start + ((df["_first"] - start) // BUCKET) * BUCKET
    # Text columns as NumPy object arrays, as pandas 2 (the tool's pandas) returned them: pandas 3's
    # Arrow-backed ``str`` dtype costs more per call on the small per-bucket masks below.
    for col in df.columns:
        if pd.api.types.is_string_dtype(df[col]) or df[col].dtype == object:
            df[col] = df[col].astype(object).where(df[col].notna(), None)
    return df


def _round_half_away(x: float) -> int:
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


class _Buckets:
    """Which rows feed each bucket: its own snapshots, else the latest earlier snapshot if younger
    than the larger of ``STALE_FACTOR`` x the cadence in force after it (the median of the five
    gaps between snapshots around the one that follows it, where most of them are within
    ``RUN_AGREE`` of it; else, or where it has none, the day's median) and
    2 x cadence - half a bucket, as the pipeline's states take them (a snapshot written in parts
    by its first part's time, carried with every part)."""

    def __init__(self, df: pd.DataFrame, start_utc: dt.datetime, end_utc: dt.datetime):
        self.df = df
        self.start = pd.Timestamp(start_utc)
        self.day = df[df["_first"] >= self.start]
        self.snaps = pd.DatetimeIndex(df["_first"].unique()).sort_values()  # the snapshots' first parts
        gaps = np.asarray((self.snaps[1:] - self.snaps[:-1]) / pd.Timedelta(microseconds=1), dtype=float)
        day_cadence = float(np.median(gaps[gaps > 0])) if (gaps > 0).any() else BUCKET / dt.timedelta(microseconds=1)
        bucket_us = BUCKET // dt.timedelta(microseconds=1)
        # gap k lies between snapshots k and k + 1; snapshot i's window: gaps i - 2 .. i + 2
        self.stale = []
        for i in range(len(self.snaps)):
            near = gaps[max(0, i - 2):i + 3]
            local = float(np.median(near)) if len(near) else math.nan
            agree = int(np.sum((near <= RUN_AGREE * local) & (near * RUN_AGREE >= local))) if len(near) else 0
            cadence_us = local if agree * 2 > len(near) else day_cadence
            self.stale.append(pd.Timedelta(microseconds=max(_round_half_away(cadence_us * STALE_FACTOR),
                                                            _round_half_away(2 * cadence_us) - bucket_us // 2)))
        self.buckets = pd.date_range(start_utc, end_utc, freq=BUCKET, inclusive="left")

    def rows(self, bucket: pd.Timestamp) -> pd.DataFrame | None:
        bucket_df = self.day[self.day["bucket"] == bucket]
        if len(bucket_df):
            return bucket_df
        i = int(self.snaps.searchsorted(bucket)) - 1  # the latest snapshot before the bucket
        if i < 0 or self.snaps[i] < bucket - self.stale[i]:
            return None
        return self.df[self.df["_first"] == self.snaps[i]]  # every part of it


def _gpu_table(day: pd.DataFrame) -> pd.DataFrame:
    """GPUs seen during the day: host of the latest row, device of the latest row naming one."""
    latest = day.sort_values("timestamp", kind="stable").drop_duplicates("AssignedGPUs", keep="last")
    named = day[day["GPUs_DeviceName"].notna()]
    devices = named.sort_values("timestamp", kind="stable").drop_duplicates("AssignedGPUs", keep="last")
    out = latest[["AssignedGPUs", "Machine"]].merge(
        devices[["AssignedGPUs", "GPUs_DeviceName"]], on="AssignedGPUs", how="left"
    )
    return out.rename(columns={"AssignedGPUs": "gpu_id", "Machine": "host", "GPUs_DeviceName": "device_name"})


# -- 5.1: per-GPU state per bucket ---------------------------------------------------------------


def states_baseline(df: pd.DataFrame, start_utc: dt.datetime, end_utc: dt.datetime) -> pd.DataFrame:
    """The 5-minute state table of [start_utc, end_utc) from original-column rows (include the hour
    before ``start_utc``). Columns and order as ``metrics/gpu_states``."""
    df = _prepare(df, start_utc, end_utc)
    sel = _Buckets(df, start_utc, end_utc)
    gpus = _gpu_table(sel.day)
    pieces = []
    for bucket in sel.buckets:
        bucket_df = sel.rows(bucket)
        if bucket_df is None:
            piece = gpus.copy()
            piece["bucket_start_utc"] = bucket
            piece["state"] = "na"
            piece["n_slot_rows"] = 0
            piece["na_reason"] = "no_snapshot"
            pieces.append(piece)
            continue
        n_rows = bucket_df["AssignedGPUs"].value_counts().rename("n_slot_rows")
        winners = bucket_df.sort_values(
            ["AssignedGPUs", "_rank", "timestamp", "Name"], ascending=[True, False, False, False]
        ).drop_duplicates(subset=["AssignedGPUs"], keep="first")
        winners = winners.join(n_rows, on="AssignedGPUs")
        rank, tier = winners["_rank"], winners["_tier"]
        winners["state"] = np.select(
            [
                (rank == 5) & (tier == "priority"),
                rank == 5,
                rank == 4,
                (rank == 3) & (tier == "priority"),
                rank == 3,
                rank == 1,
            ],
            ["busy_prioritized", "busy_shared", "busy_backfill", "idle_prioritized", "idle_shared", "idle_backfill"],
            default="na",
        )
        other = rank.isin([0, 2])
        busy = rank.isin([4, 5])
        winners["tier"] = tier.where(~other, None)
        winners["global_job_id"] = winners["GlobalJobId"].where(busy, None)
        winners["remote_owner"] = winners["RemoteOwner"].where(busy, None)
        winners["na_reason"] = winners["State"].where(other, None)
        winners = winners.rename(
            columns={
                "AssignedGPUs": "gpu_id",
                "Name": "slot_name",
                "State": "slot_state",
                "GPUsAverageUsage": "gpu_usage_pct",
                "timestamp": "snapshot_utc",
            }
        )[["gpu_id", "state", "tier", "slot_name", "slot_state", "global_job_id", "remote_owner",
           "gpu_usage_pct", "snapshot_utc", "n_slot_rows", "na_reason"]]
        piece = gpus.merge(winners, on="gpu_id", how="left")
        piece["bucket_start_utc"] = bucket
        missing = piece["state"].isna()
        piece.loc[missing, "state"] = "na"
        piece.loc[missing, "na_reason"] = "dropout"
        piece["n_slot_rows"] = piece["n_slot_rows"].fillna(0)
        pieces.append(piece)
    columns = ["bucket_start_utc", "gpu_id", "host", "device_name", "state", "tier", "slot_name", "slot_state",
               "global_job_id", "remote_owner", "gpu_usage_pct", "snapshot_utc", "n_slot_rows", "na_reason"]
    if not pieces or gpus.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
    out = pd.concat(pieces, ignore_index=True)
    for col in columns:
        if col not in out.columns:
            out[col] = None
    out["n_slot_rows"] = out["n_slot_rows"].astype("int32")
    return out[columns].sort_values(["host", "gpu_id", "bucket_start_utc"], kind="stable").reset_index(drop=True)


# -- 5.2: allocation by tier and device ----------------------------------------------------------


def _alloc_row(bucket: pd.Timestamp, tier: str, dev: str, claimed: int, total: int) -> dict:
    return {
        "bucket_start_utc": bucket,
        "tier": tier,
        "device_name": dev,
        "claimed_gpus": claimed,
        "total_gpus": total,
        "allocation_pct": (claimed / total) * 100 if total > 0 else None,
    }


def allocation_baseline(
    df: pd.DataFrame, start_utc: dt.datetime, end_utc: dt.datetime, loop_order: str = "bucket"
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-bucket rows, daily report) as ``metrics/allocation_buckets`` / ``allocation_daily``.

    ``loop_order="bucket"`` (default): one pass over the buckets, each bucket's rows selected once,
    then the tier and device masks on that bucket's columns -- the cheapest order the tool's
    approach allows. ``loop_order="tool"``: the nesting of the tool's by-device report (tier, then
    device, then bucket), the bucket re-selected from the whole window and the masks applied to
    whole frames on every iteration. Both give the same tables."""
    if loop_order not in ("bucket", "tool"):
        raise ValueError(f"loop_order must be 'bucket' or 'tool', got {loop_order!r}")
    df = _prepare(df, start_utc, end_utc)
    sel = _Buckets(df, start_utc, end_utc)
    gpus = _gpu_table(sel.day)
    gpu_dev = gpus.set_index("gpu_id")["device_name"].fillna(UNKNOWN_DEVICE)

    # Every (tier, device) with a row of any state during the day, each tier's ALL, TOTAL per device.
    day_dev = sel.day["AssignedGPUs"].map(gpu_dev)
    combos: dict[str, list[str]] = {}
    for tier in TIERS:
        combos[tier] = sorted(set(day_dev[sel.day["_tier"] == tier].dropna()))
    combos[TOTAL_TIER] = sorted(set(gpu_dev))

    bucket_rows = []
    if loop_order == "tool":
        by_key: dict[tuple, dict] = {}
        for tier in ALLOCATION_TIERS:
            for dev in [*combos[tier], ALL_DEVICES]:
                for bucket in sel.buckets:
                    bucket_df = sel.rows(bucket)
                    if bucket_df is None:
                        continue
                    device_df = bucket_df if dev == ALL_DEVICES else bucket_df[bucket_df["AssignedGPUs"].map(gpu_dev) == dev]
                    tier_df = device_df if tier == TOTAL_TIER else device_df[device_df["_tier"] == tier]
                    all_gpus_df = tier_df[tier_df["State"].isin(["Claimed", "Unclaimed"])
                                          & tier_df["AssignedGPUs"].isin(gpu_dev.index)]
                    total = len(set(all_gpus_df["AssignedGPUs"].dropna().unique()))
                    claimed_df = all_gpus_df[all_gpus_df["State"] == "Claimed"]
                    claimed = len(set(claimed_df["AssignedGPUs"].dropna().unique()))
                    by_key[(bucket, tier, dev)] = _alloc_row(bucket, tier, dev, claimed, total)
        for bucket in sel.buckets:
            for tier in ALLOCATION_TIERS:
                for dev in [*combos[tier], ALL_DEVICES]:
                    if (bucket, tier, dev) in by_key:
                        bucket_rows.append(by_key[(bucket, tier, dev)])
    else:
        for bucket in sel.buckets:
            bucket_df = sel.rows(bucket)
            if bucket_df is None:
                continue  # not covered: unknown, not zero (no rows)
            capacity = bucket_df[bucket_df["State"].isin(["Claimed", "Unclaimed"])]
            capacity = capacity[capacity["AssignedGPUs"].isin(gpu_dev.index)]
            # The masks work on the three columns they need, not on whole frames.
            ids, tiers = capacity["AssignedGPUs"], capacity["_tier"]
            claimed_mask = capacity["State"] == "Claimed"
            device = ids.map(gpu_dev)
            for tier in ALLOCATION_TIERS:
                tier_mask = pd.Series(True, index=ids.index) if tier == TOTAL_TIER else tiers == tier
                for dev in [*combos[tier], ALL_DEVICES]:
                    mask = tier_mask if dev == ALL_DEVICES else tier_mask & (device == dev)
                    total = len(ids[mask].dropna().unique())
                    claimed = len(ids[mask & claimed_mask].dropna().unique())
                    bucket_rows.append(_alloc_row(bucket, tier, dev, claimed, total))
    buckets = pd.DataFrame(
        bucket_rows,
        columns=["bucket_start_utc", "tier", "device_name", "claimed_gpus", "total_gpus", "allocation_pct"],
    )

    expected = -(-int((end_utc - start_utc) / dt.timedelta(microseconds=1)) // int(BUCKET / dt.timedelta(microseconds=1)))
    daily_rows = []
    for tier in ALLOCATION_TIERS:
        for dev in [*combos[tier], ALL_DEVICES]:
            pcts: list[float] = []
            claimed_sum = total_sum = covered = 0
            for row in bucket_rows:
                if row["tier"] != tier or row["device_name"] != dev:
                    continue
                covered += 1
                claimed_sum += row["claimed_gpus"]
                total_sum += row["total_gpus"]
                if row["total_gpus"] > 0:
                    pcts.append(row["allocation_pct"])
            if not covered:
                continue
            daily_rows.append(
                {
                    "day_start_utc": pd.Timestamp(start_utc),
                    "tier": tier,
                    "device_name": dev,
                    "allocation_pct": sum(pcts) / len(pcts) if pcts else None,
                    "avg_claimed_gpus": claimed_sum / covered,
                    "avg_total_gpus": total_sum / covered,
                    "buckets": covered,
                    "buckets_with_capacity": len(pcts),
                    "buckets_expected": expected,
                }
            )
    daily = pd.DataFrame(
        daily_rows,
        columns=["day_start_utc", "tier", "device_name", "allocation_pct", "avg_claimed_gpus", "avg_total_gpus",
                 "buckets", "buckets_with_capacity", "buckets_expected"],
    )
    return buckets, daily
