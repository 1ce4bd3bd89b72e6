"""Days that read their neighbours, and the sensor that re-runs a day when a neighbour it read changed.

Some assets of day D read other days' partitions (:data:`NEIGHBOUR_READS`): the GPU states and
the allocation read the clean slot snapshots of D-1 (the first bucket carries the last snapshot
before midnight), availability and evictions read D-1, the availability summary up to a week back,
the demand the job records of the 14 days before, the Terapixel task runs' GPU means the samples of
D+1 (a run past midnight), efficiency the samples, states and job records of
D-1 and D+1 (a segment or held-idle run across midnight is judged on its whole length), the
availability duration plots the periods of the week before (the whole periods that end in D). Dagster
knows only the same-day dependencies: declaring these (partition mappings with offsets) made a range
backfill one run per asset over a widened range instead of one run. So Dagster does not mark D
stale when a neighbour is re-materialized.

``neighbour_days_rerun`` (a sensor, stopped by default) does it instead. On each tick it reads the
materializations recorded since its cursor of every asset that a neighbour reads. For each one, of
asset U on day P, and each asset A that reads U at an offset k (A on day P - k reads U on P), it
compares A's latest materialization of day P - k with U's: when U's came after the start of the
step that made A's (or, in the same run, after A's own record), that day of A read the U that was
replaced, or may have (a run of another day can replace U while A's step is going), and the
sensor asks for one run of A and everything downstream of it, on that day. Days of A never
materialized are left alone (nothing to refresh). The re-runs go on
from day to day as far as the reads do (the sensor does not compare contents): a re-run of the
states of D makes D+1's availability and evictions stale, and the next tick re-runs those; a
re-run of D's availability periods makes the week after's summaries stale (a summary reads a week
of periods); nothing reads those in turn, so it ends there.

- A range run that writes U and then A for the same days leaves nothing stale: A's records come
  after U's. Only the records of finished runs are taken (the cursor stops before the first record
  of a run still going), so a range run in progress is never raced. A run that hangs would hold
  the cursor: the sensor's runs, like the schedules', carry ``dagster/max_runtime``
  (:func:`gpu_pipeline.defs.jobs.max_runtime_tags`), and the daemon's run monitoring ends them.
- Nightly runs: efficiency of D is computed before D+1's telemetry exists; the next night's run
  writes D+1's samples, and the sensor re-runs D's efficiency (and its plots) with the hour after
  midnight.
- The first tick only sets the cursor at the latest record: turning the sensor on does not re-run
  the history.
- Each run request has a run key of the day and the newest record that made it stale, so a tick
  evaluated twice asks once; runs of one day queue behind each other (the run queue's limit of
  one run per partition, ``dagster.yaml``).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping

import dagster as dg

from gpu_pipeline.defs import jobs as _jobs  # the module: its job is collected once, from there
from gpu_pipeline.defs.clean.gpu_samples import KEY as SAMPLES_KEY
from gpu_pipeline.defs.clean.jobs import KEY as JOBS_KEY
from gpu_pipeline.defs.clean.slot_snapshots import KEY as SLOTS_KEY
from gpu_pipeline.defs.clean.task_runs import MEANS_KEY as TASK_MEANS_KEY
from gpu_pipeline.defs.metrics.allocation import BUCKETS_KEY, DAILY_KEY
from gpu_pipeline.defs.metrics.availability import LOOKBACK_DAYS, PERIODS_KEY, SUMMARY_KEY
from gpu_pipeline.defs.metrics.demand import CAP_KEY, TOP_KEY
from gpu_pipeline.defs.metrics.efficiency import KEYS as EFFICIENCY_KEYS
from gpu_pipeline.defs.metrics.evictions import EVICTIONS_KEY, RATES_KEY
from gpu_pipeline.defs.metrics.gpu_states import KEY as STATES_KEY
from gpu_pipeline.defs.partitions import daily_partitions
from gpu_pipeline.lib.demand import JOBS_LOOKBACK_DAYS
from gpu_pipeline.lib.envutil import whole_number_env

_EVICTIONS_READ = {STATES_KEY: (-1,), JOBS_KEY: (-1,), SLOTS_KEY: (-1,)}
_EFFICIENCY_READ = {SAMPLES_KEY: (-1, 1), STATES_KEY: (-1, 1), JOBS_KEY: (-1, 1)}
_DEMAND_READ = {JOBS_KEY: tuple(range(-JOBS_LOOKBACK_DAYS, 0))}

#: asset A -> {asset U: offsets k}: A's partition of day D reads U's partitions of days D + k (k != 0;
#: the same day's reads are Dagster's declared dependencies). A test materializes each asset and
#: checks that these are exactly the other days it reads.
NEIGHBOUR_READS: dict[dg.AssetKey, dict[dg.AssetKey, tuple[int, ...]]] = {
    STATES_KEY: {SLOTS_KEY: (-1,)},
    BUCKETS_KEY: {SLOTS_KEY: (-1,)},
    DAILY_KEY: {SLOTS_KEY: (-1,)},
    PERIODS_KEY: {STATES_KEY: (-1,)},
    # the summary computes its own day's periods from the states of the day and the day before
    SUMMARY_KEY: {PERIODS_KEY: tuple(range(-LOOKBACK_DAYS, 0)), STATES_KEY: (-1,)},
    EVICTIONS_KEY: _EVICTIONS_READ,
    RATES_KEY: _EVICTIONS_READ,
    **{key: _EFFICIENCY_READ for key in EFFICIENCY_KEYS},
    CAP_KEY: _DEMAND_READ,
    TOP_KEY: _DEMAND_READ,
    # a task run that goes on past midnight: its means read the next day's samples
    TASK_MEANS_KEY: {SAMPLES_KEY: (1,)},
    # the duration plots draw the whole periods that end in the day, as the summary counts them
    **{dg.AssetKey(["plots", name]): {PERIODS_KEY: tuple(range(-LOOKBACK_DAYS, 0))}
       for name in ("availability_durations", "time_to_claim")},
}
#: The reads of :data:`NEIGHBOUR_READS` made only on a day that needs them (the sensor watches them all).
READ_WHEN_NEEDED: dict[dg.AssetKey, dict[dg.AssetKey, tuple[int, ...]]] = {TASK_MEANS_KEY: {SAMPLES_KEY: (1,)}}

#: how many records of each watched asset one tick reads at most (the rest on the next ticks)
RECORDS_PER_TICK = 2_000
#: seconds between the sensor's ticks at least (read when the definitions load)
ENV_INTERVAL = "GPU_PIPELINE_NEIGHBOUR_SENSOR_INTERVAL_S"


def readers_of(reads: Mapping[dg.AssetKey, Mapping[dg.AssetKey, tuple[int, ...]]] = NEIGHBOUR_READS,
               ) -> dict[dg.AssetKey, list[tuple[dg.AssetKey, int]]]:
    """Asset U -> [(asset A, offset k)]: A's partition of day D reads U's of D + k."""
    out: dict[dg.AssetKey, list[tuple[dg.AssetKey, int]]] = {}
    for reader, upstream in reads.items():
        for key, offsets in upstream.items():
            out.setdefault(key, []).extend((reader, k) for k in offsets)
    return out


def _shift(day: str, days: int) -> str:
    return (dt.date.fromisoformat(day) + dt.timedelta(days=days)).isoformat()


def _cursor(text: str | None) -> int | None:
    return None if not text else int(json.loads(text)["after_storage_id"])


def _dump(storage_id: int) -> str:
    return json.dumps({"after_storage_id": storage_id})


def _new_records(instance: dg.DagsterInstance, keys: Iterable[dg.AssetKey], after: int) -> list:
    """The materializations of ``keys`` after storage id ``after``, in storage order, as far as they
    are read completely (an asset with more than a tick's worth bounds the others)."""
    records, horizon = [], None
    for key in keys:
        got = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, after_storage_id=after), limit=RECORDS_PER_TICK, ascending=True)
        records.extend(got.records)
        if got.has_more and got.records:
            last = got.records[-1].storage_id
            horizon = last if horizon is None else min(horizon, last)
    records.sort(key=lambda r: r.storage_id)
    return [r for r in records if horizon is None or r.storage_id <= horizon]


def stale_days(instance: dg.DagsterInstance, after: int,
               reads: Mapping[dg.AssetKey, Mapping[dg.AssetKey, tuple[int, ...]]] = NEIGHBOUR_READS,
               ) -> tuple[dict[str, dict[dg.AssetKey, int]], int]:
    """({day: {asset: storage id of the newest record it missed}}, the new cursor): what the
    materializations after ``after`` made stale, from finished runs only. One query per watched
    asset for the records, one per reading asset for its days' latest materializations."""
    readers = readers_of(reads)
    finished: dict[str, bool] = {}
    taken, cursor = [], after
    for record in _new_records(instance, readers, after):
        if record.run_id not in finished:
            run = instance.get_run_by_id(record.run_id)
            finished[record.run_id] = run is None or run.is_finished
        if not finished[record.run_id]:
            break  # its later records, and everything after them, wait for the next tick
        cursor = record.storage_id
        if record.partition_key is not None:
            taken.append(record)
    wanted: dict[dg.AssetKey, set[str]] = {}
    for record in taken:
        for reader, k in readers[record.asset_key]:
            wanted.setdefault(reader, set()).add(_shift(record.partition_key, -k))
    step_starts: dict[str, dict[str | None, float]] = {}  # per run, read once for all readers
    latest = {reader: _latest_reads(instance, reader, days, step_starts) for reader, days in wanted.items()}
    stale: dict[str, dict[dg.AssetKey, int]] = {}
    for record in taken:
        for reader, k in readers[record.asset_key]:
            target = _shift(record.partition_key, -k)
            mine = latest[reader].get(target)
            if mine is None:
                continue
            run_id, written, read_from = mine
            # In one run the reader's step comes after the step that wrote what it reads (the range
            # run's order): its record after that one's is enough. Another run's write counts from
            # the start of the reader's step, by time: a run that replaced the partition while the
            # reader's step was going (runs of other days run side by side) may have come after its
            # read. (By time, not storage id: with the SQLite event log a run's own events are
            # numbered in that run's database, from 1, and cannot be compared with the index's.)
            if (written < record.storage_id if run_id == record.run_id
                    else read_from < record.event_log_entry.timestamp):  # that day read the replaced partition
                day = stale.setdefault(target, {})
                day[reader] = max(record.storage_id, day.get(reader, 0))
    return stale, cursor


def _latest_reads(instance: dg.DagsterInstance, reader: dg.AssetKey, days: Iterable[str],
                  starts: dict[str, dict[str | None, float]]) -> dict[str, tuple[str, int, float]]:
    """Day -> (run id, storage id, and the time its step started) of ``reader``'s latest
    materialization of that day; the start is the materialization's own time where the run's
    events do not give it (a materialization reported outside a run). ``starts``: the runs' step
    starts read so far (run id -> step key -> time), added to."""
    ids = instance.get_latest_storage_id_by_partition(
        reader, dg.DagsterEventType.ASSET_MATERIALIZATION, partitions=set(days))
    if not ids:
        return {}
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=reader, storage_ids=list(ids.values())), limit=len(ids)).records
    out = {}
    for r in records:
        if r.run_id not in starts:
            starts[r.run_id] = {e.event_log_entry.step_key: e.event_log_entry.timestamp
                                for e in instance.get_records_for_run(
                                    r.run_id, of_type=dg.DagsterEventType.STEP_START).records}
        step = r.event_log_entry.step_key
        out[r.partition_key] = (r.run_id, r.storage_id, starts[r.run_id].get(step, r.event_log_entry.timestamp))
    return out


def _latest_storage_id(instance: dg.DagsterInstance, keys: Iterable[dg.AssetKey]) -> int:
    ids = [r.storage_id for key in keys for r in instance.fetch_materializations(key, limit=1).records]
    return max(ids, default=0)


@dg.sensor(
    name="neighbour_days_rerun",
    job=_jobs.daily_pipeline,
    minimum_interval_seconds=whole_number_env(ENV_INTERVAL, 300, "seconds", "the daemon's own tick, 30 s") or None,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description=(
        "Re-materializes a day whose neighbouring day's input was re-materialized after it (the states and "
        "the allocation read the day before's slot snapshots, availability and evictions the day before, "
        "the demand the job records of the 14 days before, the task runs' GPU means the next day's samples, "
        "efficiency the days either side): the stale assets "
        "and everything downstream of them, one run per day. Reads only finished runs' records; its first "
        "tick only sets the cursor."
    ),
)
def neighbour_days_rerun(context: dg.SensorEvaluationContext):
    instance = context.instance
    after = _cursor(context.cursor)
    if after is None:
        start = _latest_storage_id(instance, readers_of())
        context.update_cursor(_dump(start))
        return dg.SkipReason(f"started: watching the materializations after record {start}")
    stale, cursor = stale_days(instance, after)
    context.update_cursor(_dump(cursor))
    if not stale:
        return dg.SkipReason("no day read a neighbour that changed after it")
    graph = context.repository_def.asset_graph
    requests = []
    for day in sorted(stale):
        if not daily_partitions.has_partition_key(day):
            continue
        selection = dg.AssetSelection.assets(*stale[day]).downstream()
        keys = selection.resolve(graph)
        # the data checks of those assets, not the freshness checks (without a list, Dagster's subset of
        # the job takes every check of the assets, the freshness checks included)
        checks = (selection - _jobs.FRESHNESS_SELECTION).resolve_checks(graph)
        newest = max(stale[day].values())
        requests.append(dg.RunRequest(
            run_key=f"neighbours-{day}-{newest}",
            partition_key=day,
            asset_selection=sorted(keys, key=lambda k: k.to_user_string()),
            asset_check_keys=sorted(checks, key=lambda k: k.to_user_string()),
            tags={**_jobs.max_runtime_tags(), "gpu_pipeline/reason": "neighbour-day-changed",
                  "gpu_pipeline/stale": ",".join(sorted(k.to_user_string() for k in stale[day]))},
        ))
    return requests or dg.SkipReason("the stale days are outside the partitions")
