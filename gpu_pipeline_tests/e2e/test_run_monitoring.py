"""Run monitoring under the real Dagster daemon (``dagster dev``) with the instance template.

The runs that the schedules and the sensor launch carry ``dagster/max_runtime``
(``GPU_PIPELINE_RUN_MAX_RUNTIME_S``); the template turns the daemon's run monitoring on, so a run
over its limit is stopped and marked failed instead of holding its day's place in the run queue
(one run per partition), or the sensor's cursor, for ever. Here a range run of three days gets a
limit of 1 s (the run takes several), and the template's poll interval is shortened to 1 s (the one
change to the instance file). Then the same days run again without a limit, and succeed: the
stopped run left nothing that blocks them, and every Parquet file written reads back whole.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gpu_pipeline.defs.jobs import ENV_MAX_RUNTIME, max_runtime_tags
from gpu_pipeline_tests.e2e.ui_helpers import (
    LAUNCH,
    REPOS,
    child_env,
    dagster_dev,
    finished_run,
    prepare_demo,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EVENTS = """
query($id: ID!) { logsForRun(runId: $id) { __typename
    ... on EventConnection { events { __typename ... on MessageEvent { message } } }
    ... on PythonError { message } } }
"""


def _launch(server, where: dict, days: list[str], tags: dict[str, str]) -> str:
    """A range run of ``days`` (as a backfill or ``late_records_rerun`` launches one) with ``tags``."""
    tags = {**tags, "dagster/asset_partition_range_start": days[0], "dagster/asset_partition_range_end": days[-1]}
    launched = server.graphql(LAUNCH, {"p": {
        "selector": {**where, "jobName": "daily_pipeline"},
        "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]},
        "mode": "default",
    }})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


def test_the_daemon_stops_a_run_over_its_max_runtime_and_the_day_runs_again(tmp_path: Path):
    demo = prepare_demo(tmp_path / "demo", n_days=3, gpus=8, seed=13)
    home = Path(demo.env["DAGSTER_HOME"])
    instance_yaml = home / "dagster.yaml"
    text = instance_yaml.read_text()
    assert "run_monitoring:\n  enabled: true\n  poll_interval_seconds: 60\n" in text  # the template's
    instance_yaml.write_text(text.replace("poll_interval_seconds: 60", "poll_interval_seconds: 1"))
    env = child_env({**demo.env, ENV_MAX_RUNTIME: "1"}, pycache=tmp_path / "pycache")
    limit = max_runtime_tags(env)
    assert limit == {"dagster/max_runtime": "1"}

    with dagster_dev(env, demo.base, tmp_path / "dagster_dev.log") as server:
        repos = server.graphql(REPOS)["repositoriesOrError"]
        assert repos["__typename"] == "RepositoryConnection", repos
        (repo,) = repos["nodes"]
        where = {"repositoryLocationName": repo["location"]["name"], "repositoryName": repo["name"]}

        run_id = _launch(server, where, demo.days, limit)
        stopped = wait_for("the limited run to end", lambda: finished_run(server, run_id), server)
        assert stopped["status"] in {"FAILURE", "CANCELED"}, (stopped, server.log_tail(60))
        logs = server.graphql(EVENTS, {"id": run_id})["logsForRun"]
        assert logs["__typename"] == "EventConnection", logs
        messages = [e.get("message") or "" for e in logs["events"]]
        assert any("Exceeded maximum runtime of 1 seconds" in m for m in messages), messages[-15:]
        # stopped in the middle: the last step (the metric plots) never finished
        assert not any('Finished execution of step "metric_plots"' in m for m in messages), messages[-15:]

        again = _launch(server, where, demo.days, {})
        done = wait_for("the days' run without a limit", lambda: finished_run(server, again), server)
        assert done["status"] == "SUCCESS", (done, server.log_tail(60))

    assert all(demo.heatmap_file(day).is_file() for day in demo.days)
    written = sorted(demo.data_root.rglob("*.parquet"))
    assert written
    for path in written:
        pq.read_table(path)  # whole files only: a stopped writer leaves no half-written partition
