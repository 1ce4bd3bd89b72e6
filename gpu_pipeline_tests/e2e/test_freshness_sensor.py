"""The ``freshness_checks_sensor`` under the real Dagster daemon (``dagster dev``), as an operator uses it.

A small simulated pool of the last 3 complete days of which only the first is materialized (the
nightly runs of the two days after it never happened); ``dagster dev`` on 127.0.0.1; through the
webserver's GraphQL API (what the UI sends) the sensor is switched on, and the daemon must launch a
run that evaluates the freshness checks, which fail with severity ERROR: yesterday and the day
before are missing whatever the hour (the deadline is 08:00 in the partition time zone).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_pipeline.defs.freshness import SENSOR_NAME
from gpu_pipeline_tests.e2e.ui_helpers import (
    child_env,
    dagster_dev,
    finished_run,
    materialize_days,
    prepare_demo,
    start_sensor,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CHECK_EXECUTIONS = """
query($k: AssetKeyInput!) { assetCheckExecutions(assetKey: $k, checkName: "freshness_check", limit: 5) {
    runId status evaluation { success severity description } } }
"""


def test_the_daemon_evaluates_the_freshness_checks_and_a_missing_day_fails_them(tmp_path: Path):
    demo = prepare_demo(tmp_path / "demo", n_days=3, gpus=8, seed=11)
    env = child_env(demo.env, pycache=tmp_path / "pycache")
    materialize_days(demo, demo.days[0], demo.days[0], env, tmp_path / "first_day.log")

    with dagster_dev(env, demo.base, tmp_path / "dagster_dev.log") as server:
        _, ticks = start_sensor(server, SENSOR_NAME)
        asked = wait_for("a tick of the sensor that launched a run", lambda: [t for t in ticks() if t["runIds"]], server)
        (run_id,) = asked[0]["runIds"]
        run = wait_for("the sensor's run", lambda: finished_run(server, run_id), server)
        assert run["status"] == "SUCCESS", (run, server.log_tail(60))

        for path in (["plots", "gpu_timeline_heatmap"], ["metrics", "coverage"]):
            executions = server.graphql(CHECK_EXECUTIONS, {"k": {"path": path}})["assetCheckExecutions"]
            (mine,) = [e for e in executions if e["runId"] == run_id]
            assert mine["status"] == "FAILED", mine
            assert mine["evaluation"]["success"] is False and mine["evaluation"]["severity"] == "ERROR", mine
        # the materialized day's own assets carry no freshness check of their own (not end products)
        states = server.graphql(CHECK_EXECUTIONS, {"k": {"path": ["metrics", "gpu_states"]}})
        assert states["assetCheckExecutions"] == [], states
