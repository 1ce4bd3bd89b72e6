"""Freshness checks: a day's end products missing past the deadline fail their checks."""

import datetime as dt

import dagster as dg
import pytest

from gpu_pipeline.defs.freshness import (
    DEFAULT_DEADLINE,
    FRESHNESS_CHECKS,
    SENSOR_NAME,
    build_freshness_checks,
    daily_assets,
    due_day,
    freshness_deadline,
    stuck_checks,
)


@pytest.fixture(scope="module")
def defs(loaded_defs) -> dg.Definitions:
    return loaded_defs


def _checked(checks) -> dict[dg.AssetKey, dg.AssetCheckKey]:
    return {key.asset_key: key for c in checks for key in c.check_keys}


def test_every_end_product_has_one_check_and_the_jobs_leave_them_to_the_sensor(defs):
    graph = defs.resolve_asset_graph()
    # the graph's own answer: the assets nothing reads
    sinks = {k for k in graph.get_all_asset_keys() if not graph.get(k).child_keys}
    assert len(sinks) >= 20
    checked = _checked(FRESHNESS_CHECKS)
    assert set(checked) == sinks
    assert dg.AssetKey(["plots", "gpu_timeline_heatmap"]) in checked
    assert dg.AssetKey(["metrics", "gpu_states"]) not in checked  # read by the heatmap, fresh with it
    assert {k.name for k in checked.values()} == {"freshness_check"}
    for name in ("daily_pipeline", "late_records_pipeline"):
        job = defs.resolve_job_def(name)
        assert not [n for n in job.graph.node_defs if n.name.startswith("freshness_check")], name
        # the data checks of the assets stay in the jobs
        names = {k.name for k in job.asset_layer.asset_graph.asset_check_keys}
        assert "freshness_check" not in names and {"has_documents", "unique_run_key"} <= names, (name, names)
    sensor = defs.resolve_sensor_def(SENSOR_NAME)
    assert sensor.default_status == dg.DefaultSensorStatus.STOPPED


def _evaluate(defs, instance) -> dict[dg.AssetKey, dg.AssetCheckEvaluation]:
    job = dg.define_asset_job("freshness_only", selection=dg.AssetSelection.checks(*FRESHNESS_CHECKS))
    with_job = dg.Definitions.merge(defs, dg.Definitions(jobs=[job]))
    result = with_job.resolve_job_def("freshness_only").execute_in_process(instance=instance)
    return {e.asset_key: e for e in result.get_asset_check_evaluations()}


def test_an_end_product_missing_its_last_day_past_the_deadline_fails_alone(defs):
    """At any hour, the last complete day due by the last 08:00 UTC is yesterday or the day before: every
    end product written for the three days before today passes; one written only three days back fails
    with the severity ERROR."""
    today = dt.datetime.now(dt.UTC).date()
    late = dg.AssetKey(["plots", "top_contributors"])
    with dg.instance_for_test() as instance:
        for asset_key in _checked(FRESHNESS_CHECKS):
            for back in (3,) if asset_key == late else (1, 2, 3):
                day = (today - dt.timedelta(days=back)).isoformat()
                instance.report_runless_asset_event(dg.AssetMaterialization(asset_key, partition=day))
        # the sensor asks for every check never evaluated
        sensor = defs.resolve_sensor_def(SENSOR_NAME)
        tick = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs))
        assert [set(r.asset_check_keys) for r in tick.run_requests] == [set(_checked(FRESHNESS_CHECKS).values())]

        evaluations = _evaluate(defs, instance)
        assert set(evaluations) == set(_checked(FRESHNESS_CHECKS))
        failed = {k for k, e in evaluations.items() if not e.passed}
        assert failed == {late}
        assert evaluations[late].severity == dg.AssetCheckSeverity.ERROR
        assert evaluations[late].metadata["dagster/freshness_params"].value == {
            "timezone": "UTC", "deadline_cron": DEFAULT_DEADLINE}


def test_the_deadline_variable():
    assert freshness_deadline({}) == DEFAULT_DEADLINE
    assert freshness_deadline({"GPU_PIPELINE_FRESHNESS_DEADLINE": "  "}) == DEFAULT_DEADLINE
    assert freshness_deadline({"GPU_PIPELINE_FRESHNESS_DEADLINE": " 30  9 * * 1-5 "}) == "30 9 * * 1-5"
    assert freshness_deadline({"GPU_PIPELINE_FRESHNESS_DEADLINE": "OFF"}) is None
    assets = daily_assets()
    assert build_freshness_checks(assets, None, "UTC") == ([], [])
    checks, sensors = build_freshness_checks(assets, "30 9 * * 1-5", "Europe/Berlin")
    assert len(_checked(checks)) == len(_checked(FRESHNESS_CHECKS)) and len(sensors) == 1
    with pytest.raises(ValueError, match="GPU_PIPELINE_FRESHNESS_DEADLINE='8:00': expected a cron string"):
        build_freshness_checks(assets, "8:00", "UTC")


def test_no_run_before_a_day_is_due_and_checks_a_failed_run_left_are_asked_again():
    """A fresh install (partitions from today): Dagster's freshness check fails its whole run while no
    day is due, and its sensor then waited on the checks that run left planned, for ever. The sensor
    skips until a day is due, and asks again for checks whose run ended without them."""
    today = dt.datetime.now(dt.UTC).date()
    fresh = dg.DailyPartitionsDefinition(start_date=today.isoformat())

    @dg.asset(partitions_def=fresh, name="product")
    def product() -> None: ...

    checks, (sensor,) = build_freshness_checks([product], DEFAULT_DEADLINE, "UTC", fresh)
    keys = list(_checked(checks).values())
    defs = dg.Definitions(assets=[product], asset_checks=checks, sensors=[sensor],
                          jobs=[dg.define_asset_job("checks_only", selection=dg.AssetSelection.checks(*checks))])
    with dg.instance_for_test() as instance:
        tick = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs))
        assert tick.run_requests == [] and "no day is due yet" in tick.skip_message
        assert due_day(fresh, DEFAULT_DEADLINE, "UTC", dt.datetime.now(dt.UTC)) is None
        # what Dagster's own sensor asked for: the run fails and leaves the check planned
        failed = defs.resolve_job_def("checks_only").execute_in_process(instance=instance, raise_on_error=False)
        assert not failed.success and failed.get_asset_check_evaluations() == []
        assert stuck_checks(instance, keys) == keys
        # once a day is due (the same checks under a sensor of partitions that began earlier), they are
        # asked for again rather than waited on
        earlier = dg.DailyPartitionsDefinition(start_date=(today - dt.timedelta(days=5)).isoformat())
        _, (later_sensor,) = build_freshness_checks([product], DEFAULT_DEADLINE, "UTC", earlier)
        tick = later_sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs))
        assert [set(r.asset_check_keys) for r in tick.run_requests] == [set(keys)]


def test_the_day_due_follows_the_deadline_in_the_partition_time_zone():
    chicago = dg.DailyPartitionsDefinition(start_date="2025-01-01", timezone="America/Chicago")
    at = lambda h: dt.datetime(2025, 8, 7, h, tzinfo=dt.UTC)  # noqa: E731 - 08:00 CDT is 13:00 UTC
    assert due_day(chicago, DEFAULT_DEADLINE, "America/Chicago", at(12)) == "2025-08-05"
    assert due_day(chicago, DEFAULT_DEADLINE, "America/Chicago", at(14)) == "2025-08-06"
    assert due_day(chicago, DEFAULT_DEADLINE, "America/Chicago", dt.datetime(2024, 12, 31, tzinfo=dt.UTC)) is None
