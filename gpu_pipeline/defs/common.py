"""Shared helpers that keep the asset bodies thin: day windows, metadata, per-day error handling."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
import pyarrow as pa

from gpu_pipeline.defs.partitions import TIMEZONE, daily_backfill_policy, daily_partitions
from gpu_pipeline.lib.db import close_databases, release_memory
from gpu_pipeline.lib.memory import give_back, limit_heap_arenas
from gpu_pipeline.lib.schemas import TableSpec
from gpu_pipeline.lib.store import WriteResult
from gpu_pipeline.lib.timeutil import day_window


def column_schema(spec: TableSpec) -> dg.TableSchema:
    return dg.TableSchema(
        columns=[
            dg.TableColumn(name=f.name, type=str(f.type), description=desc or None)
            for f, desc in zip(spec.schema, spec.column_descriptions().values(), strict=True)
        ]
    )


def table_asset_metadata(spec: TableSpec) -> dict[str, Any]:
    """Definition-time metadata: the column schema and where the table lives."""
    return {
        "dagster/column_schema": column_schema(spec),
        "table_path": f"<data_root>/{spec.path}/date=YYYY-MM-DD/part-0.parquet",
        "schema_version": spec.version,
    }


def window(day: str) -> tuple[dt.datetime, dt.datetime]:
    return day_window(day, TIMEZONE)


@dataclass
class DayOutcome:
    day: str
    result: WriteResult | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def run_days(
    context: dg.AssetExecutionContext,
    fn: Callable[[str], DayOutcome],
) -> list[DayOutcome]:
    """Run ``fn`` for every day of the run's partition range (one asset).

    A failing day does not stop the others: they are written, then the step fails naming every
    failed day and its error (so the operator re-runs only those days).
    """
    key = context.asset_key
    per_key = run_days_multi(context, [key], lambda day: {key: fn(day)})
    return per_key[key]


def run_days_multi(
    context: dg.AssetExecutionContext,
    keys: list[dg.AssetKey],
    fn: Callable[[str], dict[dg.AssetKey, DayOutcome]],
) -> dict[dg.AssetKey, list[DayOutcome]]:
    """``run_days`` for a multi-asset: ``fn`` returns one outcome per asset key for the day (keys
    that the run did not select are dropped when the results are built: multi-assets are subsettable)."""
    limit_heap_arenas()  # before the step's threads allocate (lib.memory)
    outcomes: dict[dg.AssetKey, list[DayOutcome]] = {k: [] for k in keys}
    selected = set(context.selected_asset_keys)
    failed: list[tuple[str, str]] = []
    try:
        for day in context.partition_keys:
            by_key = _one_day(context, keys, fn, day, failed)
            for key, outcome in by_key.items():
                outcomes[key].append(outcome)
                if key in selected:
                    # Each day's materialization carries that day's own figures (row count, URI,
                    # KPIs), in a range run as in a one-day run; nothing of the other days.
                    context.add_asset_metadata(_day_metadata(outcome), asset_key=key, partition_key=day)
    finally:
        close_databases()  # the step's DuckDB block pages go back before the next step
        give_back()  # and what Arrow's pool and the C heap hold freed
    if failed:
        # The step fails, so Dagster records no materialization of the run's asset; the days that
        # were written are recorded one by one, so that the UI shows them materialized and a
        # re-run of the failed (or missing) partitions takes only the failed days.
        for key, days in outcomes.items():
            if key in selected:
                for o in days:
                    context.log_event(dg.AssetMaterialization(asset_key=key, partition=o.day,
                                                              metadata=_day_metadata(o)))
        lines = "; ".join(f"{d}: {e}" for d, e in failed)
        raise dg.Failure(
            description=f"{len(failed)} of {len(context.partition_keys)} day(s) failed: {lines}",
            metadata={"failed_days": [d for d, _ in failed]},
        )
    return outcomes


def _one_day(
    context: dg.AssetExecutionContext,
    keys: list[dg.AssetKey],
    fn: Callable[[str], dict[dg.AssetKey, DayOutcome]],
    day: str,
    failed: list[tuple[str, str]],
) -> dict[dg.AssetKey, DayOutcome]:
    """``fn(day)``'s outcomes for ``keys``; none when it failed, which is logged and added to ``failed``."""
    try:
        by_key = fn(day)
    except Exception as exc:  # noqa: BLE001 - reported by the caller with the day
        names = ", ".join(k.to_user_string() for k in keys)
        context.log.error(f"{names} {day}: {exc}")
        failed.append((day, f"{type(exc).__name__}: {exc}"))
        return {}
    finally:
        release_memory()  # what DuckDB freed for the day goes back (its block pages stay)
        give_back()
    return {key: by_key[key] for key in keys if by_key.get(key) is not None}


def _day_metadata(o: DayOutcome) -> dict[str, Any]:
    md: dict[str, Any] = {}
    if o.result is not None:
        if not o.result.path.endswith(".png"):
            md["dagster/row_count"] = o.result.rows
        md["dagster/uri"] = o.result.uri
        md["bytes"] = o.result.bytes
        if o.result.kept:  # the source gave nothing: the partition an earlier run wrote (write_unless_empty)
            md["kept_previous_partition"] = dg.MetadataValue.json({"rows": o.result.rows})
    for k, v in o.metrics.items():
        md[k] = float(v)
    for k, v in o.details.items():
        md[k] = dg.MetadataValue.json(v) if isinstance(v, Mapping | list) else v
    return md


def materialize_result(
    spec: TableSpec | None,
    outcomes: list[DayOutcome],
    check_results: list[dg.AssetCheckResult] | None = None,
    asset_key: dg.AssetKey | None = None,
) -> dg.MaterializeResult:
    """One MaterializeResult for the run. Each day's own figures are attached to that day's
    materialization by :func:`run_days_multi` (Dagster's partition-scoped asset metadata), so what
    is given here applies to every day of the run: the column schema and, in a range run, the number
    of days. A day's event thus stays the same size however long the range (a range's
    figures repeated in every day's event grew with the square of its length)."""
    md: dict[str, Any] = {}
    if len(outcomes) > 1:
        md["days"] = len(outcomes)
    if spec is not None:
        md["dagster/column_schema"] = column_schema(spec)
    return dg.MaterializeResult(asset_key=asset_key, metadata=md, check_results=check_results or [])


def table_key(spec: TableSpec) -> dg.AssetKey:
    return dg.AssetKey([spec.layer, spec.name])


def daily_tables_asset(name: str, specs: list[dg.AssetSpec], check_specs: list[dg.AssetCheckSpec] | None = None):
    """The decorator of a daily multi-asset writing several tables: subsettable, partitioned by day,
    one run per partition range."""
    return dg.multi_asset(
        can_subset=True,
        specs=specs,
        partitions_def=daily_partitions,
        backfill_policy=daily_backfill_policy,
        check_specs=check_specs or [],
        name=name,
    )


OWNERS = ["team:gpu-ops"]


def _table_fields(spec: TableSpec, deps: list[dg.AssetKey], kinds: set[str] | None,
                  description: str | None) -> dict[str, Any]:
    """What every daily table's asset declares: key, layer group, description, upstream tables,
    the daily partitions, kinds, owners and the column schema."""
    return {"key": table_key(spec), "group_name": spec.layer, "description": description or spec.description,
            "deps": deps, "partitions_def": daily_partitions, "kinds": kinds or {"duckdb", "parquet"},
            "owners": OWNERS, "metadata": table_asset_metadata(spec)}


def table_spec_asset(spec: TableSpec, deps: list[dg.AssetKey], kinds: set[str] | None = None) -> dg.AssetSpec:
    """The AssetSpec of a daily table produced inside a multi-asset."""
    return dg.AssetSpec(**_table_fields(spec, deps, kinds, None))


def daily_table_asset(spec: TableSpec, deps: list[dg.AssetKey] | None = None, kinds: set[str] | None = None,
                      check_specs: list[dg.AssetCheckSpec] | None = None, description: str | None = None):
    """The decorator of a daily asset writing one table (the fields of :func:`table_spec_asset`),
    one run per partition range."""
    return dg.asset(**_table_fields(spec, deps or [], kinds, description), backfill_policy=daily_backfill_policy,
                    check_specs=check_specs or [])


def outcome(day: str, result: WriteResult, table: pa.Table, **metrics: float) -> DayOutcome:
    return DayOutcome(day=day, result=result, metrics={"rows": float(table.num_rows), **metrics})


def empty_like(spec: TableSpec) -> pa.Table:
    return spec.empty()


class SelectedStore:
    """A store for a subsettable multi-asset: writes of the asset's tables (or plots) that the run
    did not select are skipped; everything else (quarantine tables, reads) goes through."""

    def __init__(self, store: Any, context: dg.AssetExecutionContext):
        self._store = store
        self._all = set(context.assets_def.node_keys_by_output_name.values())
        self._selected = set(context.selected_asset_keys)

    def _skip(self, key: dg.AssetKey) -> bool:
        return key in self._all and key not in self._selected

    def write_partition(self, spec: TableSpec, day: str, table: pa.Table) -> WriteResult | None:
        if self._skip(table_key(spec)):
            return None
        return self._store.write_partition(spec, day, table)

    def write_plot(self, name: str, day: str, png: bytes, variant: str | None = None) -> WriteResult | None:
        if self._skip(dg.AssetKey(["plots", name])):
            return None
        return self._store.write_plot(name, day, png, variant)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def write_unless_empty(context: dg.AssetExecutionContext, store: Any, spec: TableSpec, day: str, empty: bool,
                       write: Callable[[], WriteResult], what: str) -> WriteResult:
    """``write()`` the day's raw partition, unless the configured source gave nothing for the day
    (``empty``) and an earlier run wrote rows there: those are kept (:meth:`Store.kept_partition`), and
    the day's blocking check still fails, naming the day."""
    if empty and (kept := store.kept_partition(spec, day)) is not None:
        log_kept(context, spec, day, what, kept)
        return kept
    return write()


def log_kept(context: dg.AssetExecutionContext, spec: TableSpec, day: str, what: str, kept: WriteResult,
             instead: str = "an empty one") -> None:
    """The warning of a day whose partition an earlier run wrote is kept (its materialization says so
    too: ``kept_previous_partition``); ``instead``: what the run would have written."""
    context.log.warning(f"{day}: {what}; {spec.layer}/{spec.name} keeps the partition an earlier run wrote "
                        f"({kept.rows:,} rows) instead of replacing it with {instead}")


def kept_days(outcomes: list[DayOutcome]) -> list[str]:
    """The days whose partition was kept as an earlier run wrote it (:func:`write_unless_empty`)."""
    return [o.day for o in outcomes if o.result is not None and o.result.kept]


def gate_check(spec: dg.AssetCheckSpec, outcomes: list[DayOutcome], label: str,
               bad_days: list[str] | dict[str, Any], *, applies: bool = True, **metadata: Any
               ) -> dg.AssetCheckResult:
    """A blocking check over the run's days (``spec`` is declared ``blocking``): when it ``applies``,
    it fails when a day fails it (``bad_days``, a list or a dict by day, in the metadata as
    ``label``), with severity ERROR -- which stops downstream -- when every day of the run does, and
    WARN when only some do. One result stands for the whole range, so an ERROR for one bad day would
    stop every good day of a backfill downstream; a warned day goes on (an empty day gives empty
    tables and a "No data" figure)."""
    failed = applies and bool(bad_days)
    every_day = failed and len(bad_days) >= len(outcomes)
    md = {k: dg.MetadataValue.json(v) if isinstance(v, list | dict) else v
          for k, v in {**metadata, label: bad_days}.items()}
    md["stops_downstream"] = every_day
    return dg.AssetCheckResult(check_name=spec.name, asset_key=spec.asset_key, passed=not failed,
                               severity=dg.AssetCheckSeverity.ERROR if every_day else dg.AssetCheckSeverity.WARN,
                               metadata=md)


def violations_check(spec: dg.AssetCheckSpec, asset_key: dg.AssetKey, by_day: dict[str, Any],
                     label: str = "violations_by_day",
                     severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR) -> dg.AssetCheckResult:
    """A check that passes when no day has violations (a count, a list or a dict per day, in its
    metadata), failing with ``severity``."""
    return dg.AssetCheckResult(check_name=spec.name, asset_key=asset_key, passed=not any(by_day.values()),
                               severity=severity, metadata={label: dg.MetadataValue.json(by_day)})


def tables_results(context: dg.AssetExecutionContext, outcomes: dict[dg.AssetKey, list[DayOutcome]],
                   specs: dict[dg.AssetKey, TableSpec], checks: list[dg.AssetCheckResult] | None = None) -> list:
    """What a multi-asset writing several tables yields: one materialization per table (from the
    outcomes of ``run_days_multi``) and its check results, limited to what the run selected."""
    results: list = [materialize_result(spec, outcomes[key], asset_key=key) for key, spec in specs.items()]
    return selected_results(context, results + (checks or []))


def selected_results(context: dg.AssetExecutionContext, results: list) -> list:
    """Only the materializations and check results of what the run selected."""
    keys, checks = set(context.selected_asset_keys), set(context.selected_asset_check_keys)
    out = []
    for r in results:
        if isinstance(r, dg.AssetCheckResult):
            if dg.AssetCheckKey(r.asset_key, r.check_name) in checks:
                out.append(r)
        elif r.asset_key in keys:
            out.append(r)
    return out
