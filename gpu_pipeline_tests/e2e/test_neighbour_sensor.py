"""The ``neighbour_days_rerun`` sensor under the real Dagster daemon (``dagster dev``), as an operator uses it.

A small simulated pool, its 3 days materialized as one range run; ``dagster dev`` on 127.0.0.1 with
the sensor's interval at 5 s; then, through the webserver's GraphQL API (what the UI sends): the
sensor is switched on, the first day's clean slot snapshots are re-materialized alone, and the
daemon must launch one run of the second day's stale assets and their downstream, which succeeds
and rewrites that day's GPU states.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_pipeline_tests.e2e.ui_helpers import (
    LAUNCH,
    child_env,
    dagster_dev,
    finished_run,
    materialize_days,
    prepare_demo,
    start_sensor,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_daemon_reruns_the_day_after_a_day_rematerialized_out_of_order(tmp_path: Path):
    demo = prepare_demo(tmp_path / "demo", n_days=3, gpus=8, seed=11)
    env = child_env({**demo.env, "GPU_PIPELINE_NEIGHBOUR_SENSOR_INTERVAL_S": "5"}, pycache=tmp_path / "pycache")
    materialize_days(demo, demo.days[0], demo.days[-1], env, tmp_path / "range.log")
    states_day2 = demo.data_root / "metrics" / "gpu_states" / f"date={demo.days[1]}" / "part-0.parquet"
    written_before = states_day2.stat().st_mtime_ns

    with dagster_dev(env, demo.base, tmp_path / "dagster_dev.log") as server:
        where, ticks = start_sensor(server, "neighbour_days_rerun")

        first = wait_for("the sensor's first tick", lambda: [t for t in ticks() if t["cursor"]], server)
        assert "started" in (first[-1]["skipReason"] or ""), first[-1]  # the history is not re-run

        launched = server.graphql(LAUNCH, {"p": {
            "selector": {**where, "jobName": "daily_pipeline", "assetSelection": [{"path": ["clean", "slot_snapshots"]}]},
            "executionMetadata": {"tags": [{"key": "dagster/partition", "value": demo.days[0]}]},
            "mode": "default",
        }})["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        manual = launched["run"]["runId"]
        done = wait_for("the re-materialization of the first day's slots", lambda: finished_run(server, manual), server)
        assert done["status"] == "SUCCESS", done

        asked = wait_for("a tick of the sensor that launched a run", lambda: [t for t in ticks() if t["runIds"]], server)
        (run_id,) = asked[0]["runIds"]
        rerun = wait_for("the sensor's run", lambda: finished_run(server, run_id), server)
        assert rerun["status"] == "SUCCESS", (rerun, server.log_tail(60))
        tags = {t["key"]: t["value"] for t in rerun["tags"]}
        assert tags["dagster/partition"] == demo.days[1]
        assert tags["gpu_pipeline/reason"] == "neighbour-day-changed"
        assert "metrics/gpu_states" in tags["gpu_pipeline/stale"].split(",")
        chosen = {"/".join(a["path"]) for a in rerun["assetSelection"]}
        assert {"metrics/gpu_states", "metrics/allocation_daily", "metrics/evictions",
                "plots/gpu_timeline_heatmap"} <= chosen
        assert "clean/slot_snapshots" not in chosen and "raw/condor_slot_snapshots" not in chosen
    assert states_day2.stat().st_mtime_ns > written_before  # the second day's states were written again
