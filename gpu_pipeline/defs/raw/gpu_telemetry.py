"""Raw layer: GPU telemetry samples of each day from every configured source."""


import dagster as dg

from gpu_pipeline.defs.common import (
    DayOutcome,
    daily_table_asset,
    gate_check,
    kept_days,
    log_kept,
    materialize_result,
    run_days,
    table_key,
    window,
)
from gpu_pipeline.defs.resources import (
    DEFAULT_TELEMETRY_MIN_COVERAGE_PCT,
    MIN_COVERAGE_VAR,
    DataStoreResource,
    TelemetryResource,
)
from gpu_pipeline.lib.coverage import partition_coverage
from gpu_pipeline.lib.coverage_table import TELEMETRY_SERIES, TELEMETRY_TIME
from gpu_pipeline.lib.samples import RawStream, write_raw_samples
from gpu_pipeline.lib.schemas import QUARANTINE_GPU_TELEMETRY
from gpu_pipeline.lib.schemas import RAW_GPU_TELEMETRY as SPEC

KEY = table_key(SPEC)
HAS_SAMPLES = dg.AssetCheckSpec(
    "has_samples", asset=KEY, blocking=True,
    description="When a telemetry directory is configured, every day of the run has samples.",
)
COVERAGE = dg.AssetCheckSpec(
    "coverage", asset=KEY, blocking=True,
    description=f"Series covered >= {MIN_COVERAGE_VAR} % (default {DEFAULT_TELEMETRY_MIN_COVERAGE_PCT}) on average: "
                "each GPU's samples against those expected from its source's observed cadence.",
)


#: Reader counters of values read as null, in the day's metadata
VALUE_COUNTERS = ("nan_values", "blank_values")
#: Reader counters of samples read and not kept (without a line of their own set aside): in the day's
#: metadata, summed over the readers, and a warning when any is not 0 -- a sample without a GPU UUID
#: label, a row whose UUID is no GPU's, two samples of one GPU, metric and time (the first kept:
#: ``duplicate_samples`` of the same series, ``conflicting_samples`` of another, e.g. a GPU that two
#: pods' series name), and the warnings of a Prometheus response (possibly partial data). A file read
#: by several days (an undated rotation, a local day's log under UTC days) is counted by each.
DROP_COUNTERS = ("samples_without_uuid", "rows_bad_uuid", "conflicting_samples", "duplicate_samples", "warnings")
#: Reader counters of lines set aside as a whole layout, in the day's metadata: an nvidia-smi query
#: without the timestamp field (its lines are in the quarantine)
LAYOUT_COUNTERS = ("layouts_without_time",)
#: Prometheus reader counters, in the day's metadata: a step too coarse for the scrape interval (1: raw
#: samples two scrapes shared a grid step lost, a warning in the run's log) and the chunks read in
#: halves for ``--query.max-samples``
PROMETHEUS_COUNTERS = ("step_too_coarse", "max_samples_splits")
#: Reader counters of time, in the day's metadata: exporter samples without a timestamp, timed by their
#: file's modification time, and rows of the files read that fall outside the day (a scrape file copied
#: without its modification time is read at the copy's: a warning when both are there and the day has
#: no sample)
TIME_COUNTERS = ("samples_default_time", "rows_outside_window")


@daily_table_asset(SPEC, kinds={"nvidia", "prometheus", "parquet"}, check_specs=[HAS_SAMPLES, COVERAGE])
def gpu_telemetry(
    context: dg.AssetExecutionContext, data_store: DataStoreResource, telemetry: TelemetryResource
) -> dg.MaterializeResult:
    store = data_store.store()
    covs: dict[str, float] = {}
    # (a bad setting fails before any day is read; without telemetry it is not read)
    threshold = telemetry.min_coverage() if telemetry.enabled else 0.0

    def one_day(day: str) -> DayOutcome:
        start, end = window(day)
        stream = RawStream(
            telemetry.path if telemetry.files_enabled else None,
            start,
            end,
            telemetry.source_timezone,
            telemetry.file_margin_days_value(),
            prometheus=telemetry.prometheus_config(),
            terapixel_dir=telemetry.terapixel_dir or None,
            nvidia_smi_fields=telemetry.nvidia_smi_fields_value(),
        )
        # the day's rows written a few files at a time, spilled and sorted by time slab when large; a
        # source that gives nothing for the day (no sample, no line set aside) keeps what an earlier
        # run wrote (and its quarantine)
        result = write_raw_samples(store, day, stream, keep_if_empty=telemetry.enabled)
        quarantine = stream.quarantine if stream.quarantine is not None else QUARANTINE_GPU_TELEMETRY.empty()
        if result.kept:
            log_kept(context, SPEC, day, "the telemetry sources give nothing for the day", result)
        else:
            # Lines the parsers could not read are kept with the reason (always written, so a re-run replaces).
            store.write_partition(QUARANTINE_GPU_TELEMETRY, day, quarantine)
        # kept with the file's digest: the coverage metric reads it back for the clean copy of these bytes
        cov = partition_coverage(store, SPEC, day, TELEMETRY_TIME, list(TELEMETRY_SERIES), start, end)
        covs[day] = cov.coverage
        # files in the host folders that are no telemetry file this reads (an .xz, a note): named,
        # not skipped unseen
        unread = int(stream.counters.get("files_not_recognized", 0))
        if unread:
            context.log.warning(f"{day}: {unread} file(s) in the telemetry host folders are not read "
                                "(not *.csv / *.prom, optionally .N, .gz or .zst)")
        metrics = {"samples": 0 if result.kept else result.rows, "lines_quarantined": quarantine.num_rows,
                   "files_not_recognized": unread}
        # values read as null, not as numbers: NaN (nvidia-smi's "nan W", an exporter's NaN) and DCGM's
        # "blank" sentinels, summed over the readers (their counters are "<kind>:<name>")
        for name in (*VALUE_COUNTERS, *DROP_COUNTERS, *LAYOUT_COUNTERS, *PROMETHEUS_COUNTERS, *TIME_COUNTERS):
            metrics[name] = int(sum(v for k, v in stream.counters.items()
                                    if k == name or k.endswith((f":{name}", f"_{name}"))))
        dropped = {name: metrics[name] for name in DROP_COUNTERS if metrics[name]}
        if dropped:
            context.log.warning(f"{day}: samples read and not kept (see the day's metadata): {dropped}")
        # (the margin days' files are read and fall outside the day on every healthy day: only a day
        # left without samples says a copy lost the times)
        if not metrics["samples"] and metrics["samples_default_time"] and metrics["rows_outside_window"]:
            context.log.warning(f"{day}: {metrics['samples_default_time']:,} exporter sample(s) without a timestamp "
                                "were timed by their file's modification time, and "
                                f"{metrics['rows_outside_window']:,} row(s) read fell outside the day: a scrape file "
                                "copied without its modification time (cp without -p, a download) is read at the "
                                "copy's time; keep the times (cp -p, rsync -t) or let the exporter stamp its samples")
        if metrics["step_too_coarse"]:
            context.log.warning(f"{day}: the Prometheus step is too coarse for the scrape interval: the raw "
                                "samples kept are a median "
                                f"{stream.counters.get('prometheus_raw_interval_ms', 0) / 1000:g} s apart (never "
                                "closer than the step, so the scrapes may be closer still), and a sample that "
                                "shared a step with the next one is lost; set GPU_PIPELINE_PROMETHEUS_STEP_S to at "
                                "most half the scrape interval, halving it until this warning stops")
        metrics.update(cov.as_metadata("telemetry"))
        return DayOutcome(day=day, result=result, metrics=metrics, details={"files": len(stream.files)})

    outcomes = run_days(context, one_day)
    empty = [o.day for o in outcomes if not o.metrics.get("samples")]
    low = {d: round(c, 4) for d, c in covs.items() if c < threshold}
    checks = [
        gate_check(HAS_SAMPLES, outcomes, "days_without_samples", empty, applies=telemetry.enabled,
                   days_kept_as_written_before=kept_days(outcomes)),
        gate_check(COVERAGE, outcomes, "below_threshold", low, applies=telemetry.enabled, coverage_by_day=covs,
                   min_coverage_pct=round(100 * threshold, 6)),
    ]
    return materialize_result(SPEC, outcomes, check_results=checks)
