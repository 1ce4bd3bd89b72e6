"""The Dagster UI end to end, driven like a user in headless chromium.

One small simulated pool (16 GPUs, the last 4 complete days in America/Chicago) with the oldest
day materialized through ``gpu_pipeline.cli.run_pipeline``; then ``dagster dev`` on 127.0.0.1 and:

1. the catalog lists every layer's assets in their groups; the lineage graph shows the 4 groups;
2. the heatmap asset's latest materialization shows its PNG preview (a data:image/png <img>);
3. a 3-day backfill of the missing days is launched by clicking: the lineage graph filtered to the
   heatmap and its upstream assets (raw -> clean -> metrics -> plots), "Materialize all…",
   "Missing", "Launch backfill"; it completes as ONE run (BackfillPolicy.single_run on every
   asset), and the days' gpu_states Parquet files and heatmap PNGs are on disk;
4. the nightly schedule is listed as stopped and its next tick requests yesterday's partition.

Screenshots go under the test's tmp dir and, when ``GPU_PIPELINE_UI_SCREENSHOTS`` is set, are copied
there too, with ``ui_summary.json`` (timings, the backfill's run count).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from gpu_pipeline_tests.e2e.ui_helpers import (
    DagsterDev,
    DemoData,
    Screenshots,
    browser_context,
    child_env,
    dismiss_community_modal,
    materialize_days,
    missing_chromium,
    prepare_demo,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(missing_chromium() is not None, reason=str(missing_chromium())),
    pytest.mark.timeout(600),
]

PAGE_TIMEOUT_MS = 60_000  # one UI element to appear (the UI polls; a busy 2-core machine is slow)
NEW_BACKFILL_TIMEOUT_S = 60.0  # the backfill to be recorded after the click
BACKFILL_TIMEOUT_S = 300.0  # the daemon ticks every 30 s, then one range run of 4 steps (60-90 s here)
TERMINAL_BACKFILL = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED", "FAILING",
                     "CANCELING"}

# (group, asset name): every layer and at least one asset of each
ASSETS = [
    ("raw", "condor_slot_snapshots"),
    ("raw", "job_documents"),
    ("raw", "gpu_telemetry"),
    ("clean", "slot_snapshots"),
    ("clean", "jobs"),
    ("clean", "gpu_samples"),
    ("metrics", "gpu_states"),
    ("plots", "gpu_timeline_heatmap"),
]

# the lineage search: the heatmap and all its upstream assets (a "+" without a depth is unbounded)
HEATMAP_LINEAGE = '+key:"plots/gpu_timeline_heatmap"'

HEATMAP_CHAIN = [("raw", "condor_slot_snapshots"), ("clean", "slot_snapshots"), ("metrics", "gpu_states"),
                 ("plots", "gpu_timeline_heatmap")]

BACKFILLS = """
{ partitionBackfillsOrError(limit: 20) {
    __typename
    ... on PartitionBackfills { results { id } }
    ... on PythonError { message }
} }
"""

BACKFILL = """
query($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill {
      id status numPartitions partitionNames isAssetBackfill assetSelection { path }
      runs(limit: 50) { runId status tags { key value } }
    }
    ... on PythonError { message }
    ... on BackfillNotFoundError { message }
  }
}
"""

SCHEDULES = """
{ repositoriesOrError {
    __typename
    ... on RepositoryConnection { nodes { name location { name }
      schedules { name executionTimezone scheduleState { status }
        futureTicks(limit: 1) { results { timestamp
          evaluationResult { skipReason error { message } runRequests { tags { key value } } } } } } } }
    ... on PythonError { message }
} }
"""


@dataclass
class UI:
    demo: DemoData
    server: DagsterDev
    context: object
    shots: Screenshots
    tmp: Path
    summary: dict = field(default_factory=dict)

    def new_page(self):  # noqa: ANN201
        page = self.context.new_page()
        page.set_default_timeout(PAGE_TIMEOUT_MS)
        dismiss_community_modal(page)
        return page

    def shot(self, page, name: str) -> Path:  # noqa: ANN001
        """A screenshot, with the community modal out of the way (the locator handler only runs
        before actions and assertions, and the modal may open after the last one)."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        skip = page.get_by_role("button", name="Skip", exact=True)
        if skip.is_visible():
            try:
                # the locator handler may click it first, before this click's action: this click then
                # waits for a button that is gone
                skip.click(timeout=5_000)
            except PlaywrightTimeout:
                pass
            skip.wait_for(state="hidden", timeout=10_000)
        return self.shots.take(page, name)

    def record(self, **values) -> None:
        self.summary.update(values)
        path = self.shots.directory / "ui_summary.json"
        path.write_text(json.dumps(self.summary, indent=2, sort_keys=True) + "\n")
        if self.shots.copy_to is not None:
            self.shots.copy_to.mkdir(parents=True, exist_ok=True)
            (self.shots.copy_to / path.name).write_text(path.read_text())

    @contextlib.contextmanager
    def explained(self, page, what: str) -> Iterator[None]:  # noqa: ANN001
        """Re-raise a failed check with what was being checked, a screenshot and the server log."""
        from playwright.sync_api import Error as PlaywrightError

        try:
            yield
        except (AssertionError, PlaywrightError) as exc:
            slug = re.sub(r"[^a-z0-9]+", "-", what.lower()).strip("-")[:60]
            shot = self.shots.failure(page, slug)
            raise AssertionError(
                f"{what}: {str(exc)[:2000]}\n  page: {page.url}\n  screenshot: {shot}\n"
                f"  dagster dev log {self.server.log_path} (tail):\n{self.server.log_tail(40)}"
            ) from exc


@pytest.fixture(scope="module")
def ui(tmp_path_factory) -> Iterator[UI]:
    from playwright.sync_api import expect

    expect.set_options(timeout=PAGE_TIMEOUT_MS)  # assertions default to 5 s, too short on 2 busy cores
    tmp = tmp_path_factory.mktemp("ui")
    t0 = time.monotonic()
    demo = prepare_demo(tmp / "demo", n_days=4, gpus=16, seed=5)
    env = child_env(demo.env, pycache=tmp / "pycache")
    t_sim = time.monotonic()
    materialize_days(demo, demo.days[0], demo.days[0], env, tmp / "first_day.log")
    t_first = time.monotonic()
    server = DagsterDev(env=env, cwd=demo.base, log_path=tmp / "dagster_dev.log")
    server.start()
    try:
        ready_s = server.wait_ready()
        shots = Screenshots(tmp / "screenshots")
        with browser_context(tmp / "chromium-profile") as context:
            state = UI(demo=demo, server=server, context=context, shots=shots, tmp=tmp)
            state.record(days=demo.days, simulate_s=round(t_sim - t0, 1),
                         first_day_run_s=round(t_first - t_sim, 1), dagster_dev_ready_s=round(ready_s, 1))
            yield state
    finally:
        survivors = server.stop()
    assert not survivors, (f"processes of dagster dev survived SIGTERM + SIGKILL of its group: {survivors}; "
                           f"log {server.log_path}:\n{server.log_tail(20)}")


def _search_assets(page, query: str) -> None:  # noqa: ANN001
    """Type an asset selection into the catalog's / lineage graph's "Search and filter assets" box.

    The box is a CodeMirror editor: its (tiny) textarea takes the keys, its lines take the clicks."""
    from playwright.sync_api import expect

    box = page.get_by_role("textbox", name="Search and filter assets")
    expect(box).to_be_visible()  # an assertion: lets the community-modal handler run first
    box.focus()
    page.keyboard.press("Control+a")
    page.keyboard.type(query)
    page.keyboard.press("Enter")
    page.keyboard.press("Escape")  # close the autocompletion list


def _backfill_ids(server: DagsterDev) -> set[str]:
    data = server.graphql(BACKFILLS)["partitionBackfillsOrError"]
    assert data["__typename"] == "PartitionBackfills", data
    return {b["id"] for b in data["results"]}


def _backfill(server: DagsterDev, backfill_id: str) -> dict:
    data = server.graphql(BACKFILL, {"id": backfill_id})["partitionBackfillOrError"]
    assert data["__typename"] == "PartitionBackfill", data
    return data


def _tags(obj: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in obj["tags"]}


def test_catalog_preview_and_a_three_day_backfill_from_the_asset_graph(ui: UI):
    from playwright.sync_api import expect

    demo, server = ui.demo, ui.server
    first, missing = demo.days[0], demo.days[1:]
    assert len(missing) == 3
    page = ui.new_page()

    # -- 1. the catalog lists every layer's group and its assets ---------------------------------
    with ui.explained(page, "catalog lists every group and asset"):
        page.goto(f"{server.url}/assets")
        expect(page.get_by_role("link", name="clean / slot_snapshots")).to_be_visible()
        expect(page.get_by_text(re.compile(r"^\d+ partitions$")).first, "partition statuses loaded").to_be_visible()
        expect(page.get_by_text("- partitions", exact=True), "every status loaded").to_have_count(0)
        ui.shot(page, "01-catalog")
        # the catalog is a virtualized table longer than the window: filter it to each asset in turn
        for group, name in ASSETS:
            _search_assets(page, f'key:"{group}/{name}"')
            link = page.get_by_role("link", name=f"{group} / {name}")
            expect(link, f"asset {group}/{name} listed in the catalog").to_be_visible()
            row = link.locator("xpath=ancestor::div[.//a[contains(@href, 'asset-groups')]][1]")
            # the group link's accessible name is its icon's label and the name: "asset_group raw"
            expect(row.get_by_role("link", name=re.compile(rf"(^|\s){group}$")),
                   f"asset {group}/{name} shown in group {group!r}").to_be_visible()

    with ui.explained(page, "asset lineage graph shows the four layer groups"):
        page.goto(f"{server.url}/asset-groups")
        expect(page.get_by_role("button", name="Materialize all…")).to_be_enabled()
        for group in ("raw", "clean", "metrics", "plots"):
            expect(page.get_by_text(group, exact=True).last, f"group {group!r} in the asset graph").to_be_visible()
        expect(page.get_by_text(re.compile("fetching statuses")), "asset statuses in the graph").to_have_count(0)
        ui.shot(page, "02-asset-graph")

    # -- 2. the heatmap's latest materialization shows its PNG preview ------------------------------
    with ui.explained(page, "heatmap asset page shows the preview image of its latest materialization"):
        page.goto(f"{server.url}/assets/plots/gpu_timeline_heatmap")
        expect(page.get_by_text("Latest materialization")).to_be_visible()
        expect(page.get_by_text(first, exact=True).first,
               f"latest materialization is partition {first}").to_be_visible()
        preview_row = page.get_by_role("row").filter(has=page.get_by_text("preview", exact=True))
        preview_row.get_by_text("[Show Markdown]").click()
        dialog = page.get_by_role("dialog").filter(has_text="preview")
        img = dialog.locator('img[src^="data:image/png;base64,"]')
        expect(img, "a data:image/png <img> in the preview").to_be_visible()
        width = img.evaluate("i => i.complete ? i.naturalWidth : 0")
        assert width >= 100, f"the preview PNG did not decode (naturalWidth {width})"
        ui.shot(page, "03-plot-preview")
        dialog.get_by_role("button", name="Close").click()

    # -- 3. a 3-day backfill launched from the asset graph ----------------------------------------
    before = _backfill_ids(server)
    with ui.explained(page, "launch a backfill of the 3 missing days from the heatmap's lineage"):
        # The heatmap and everything upstream of it (raw -> clean -> metrics -> plots), filtered in the
        # lineage graph's search box like a user would; then that graph's "Materialize all…".
        page.goto(f"{server.url}/asset-groups")
        expect(page.get_by_role("button", name="Materialize all…")).to_be_enabled()
        # hide the group sidebar (its toggle is named after its icon) so the four expanded groups fit
        sidebar_toggle = page.get_by_role("button", name="panel_show_right", exact=True)
        if sidebar_toggle.count() == 1:
            sidebar_toggle.click()
        _search_assets(page, HEATMAP_LINEAGE)
        expect(page).to_have_url(re.compile(r"gpu_timeline_heatmap"))
        page.get_by_role("button", name="settings", exact=True).click()  # the graph's settings menu
        page.get_by_role("menuitem", name=re.compile("Expand all groups")).click()
        page.keyboard.press("Escape")  # the menu stays open after the click
        expect(page.get_by_role("menuitem", name=re.compile("Collapse all groups"))).to_be_hidden()
        for _, name in HEATMAP_CHAIN:
            expect(page.get_by_text(name, exact=True), f"{name!r} in the filtered, expanded graph").to_be_visible()
        ui.shot(page, "04-heatmap-lineage")
        page.get_by_role("button", name="Materialize all…").click()
        dialog = page.get_by_role("dialog").filter(has_text="Launch runs to materialize")
        expect(dialog).to_be_visible()
        title = dialog.get_by_text(re.compile(r"^Launch runs to materialize \d+ assets?$")).inner_text()
        ui.record(backfill_dialog_title=title)
        dialog.get_by_role("button", name="Missing", exact=True).click()
        expect(dialog.get_by_text("3 partitions", exact=True)).to_be_visible()
        expect(dialog.get_by_role("textbox").first).to_have_value(f"[{missing[0]}...{missing[-1]}]")
        ui.shot(page, "05-backfill-dialog")
        launch = dialog.get_by_role("button", name="Launch backfill")
        expect(launch).to_be_enabled()
        t_launch = time.monotonic()
        launch.click()
        expect(dialog).to_be_hidden()

    deadline = time.monotonic() + NEW_BACKFILL_TIMEOUT_S
    new: set[str] = set()
    while not new and time.monotonic() < deadline:
        new = _backfill_ids(server) - before
        time.sleep(1.0)
    assert len(new) == 1, (f"clicking 'Launch backfill' recorded {len(new)} new backfills within "
                           f"{NEW_BACKFILL_TIMEOUT_S:.0f} s ({sorted(new)}); screenshot "
                           f"{ui.shots.failure(page, 'no-backfill')}\n{server.log_tail(40)}")
    backfill_id = new.pop()

    status, backfill = "", {}
    deadline = time.monotonic() + BACKFILL_TIMEOUT_S
    while time.monotonic() < deadline:
        backfill = _backfill(server, backfill_id)
        status = backfill["status"]
        if status in TERMINAL_BACKFILL:
            break
        time.sleep(3.0)
    backfill_s = time.monotonic() - t_launch
    runs = backfill.get("runs", [])
    ui.record(backfill_id=backfill_id, backfill_status=status, backfill_s=round(backfill_s, 1),
              backfill_runs=len(runs),
              backfill_run_ranges=[[_tags(r).get("dagster/asset_partition_range_start"),
                                    _tags(r).get("dagster/asset_partition_range_end"), r["status"]] for r in runs])
    print(f"backfill {backfill_id}: {status} after {backfill_s:.0f} s, {len(runs)} run(s)")
    assert status in {"COMPLETED", "COMPLETED_SUCCESS"}, (
        f"backfill {backfill_id} is {status or 'unknown'} after {backfill_s:.0f} s (limit "
        f"{BACKFILL_TIMEOUT_S:.0f} s); runs {[(r['runId'], r['status']) for r in runs]}; screenshot "
        f"{ui.shots.failure(page, 'backfill-not-done')}\n"
        f"dagster dev log {server.log_path} (tail):\n{server.log_tail(60)}")
    assert backfill["isAssetBackfill"] and sorted(backfill["partitionNames"]) == missing, backfill
    selected = {"/".join(a["path"]) for a in backfill["assetSelection"] or []}
    chain = {f"{group}/{name}" for group, name in HEATMAP_CHAIN}
    assert chain <= selected, f"the backfill does not target {sorted(chain - selected)}: {sorted(selected)}"
    assert all(r["status"] == "SUCCESS" for r in runs), runs
    # BackfillPolicy.single_run on every asset: fewer runs than days (one range run), not one per day
    assert 0 < len(runs) < len(missing), (
        f"the 3-day backfill ran as {len(runs)} runs, expected a single range run: "
        f"{[_tags(r) for r in runs]}")
    covered = {(_tags(r).get("dagster/asset_partition_range_start"),
                _tags(r).get("dagster/asset_partition_range_end")) for r in runs}
    assert (missing[0], missing[-1]) in covered, f"no run covers {missing[0]}..{missing[-1]}: {covered}"

    with ui.explained(page, "backfill page shows the completed backfill"):
        page.goto(f"{server.url}/runs/b/{backfill_id}")
        expect(page.get_by_text("Succeeded", exact=True).first).to_be_visible()
        expect(page.get_by_text("plots / gpu_timeline_heatmap").first).to_be_visible()
        ui.shot(page, "06-backfill-done")

    # -- 4. the files of the backfilled days are on disk -------------------------------------------
    absent = [str(p) for day in missing for p in (demo.gpu_states_file(day), demo.heatmap_file(day))
              if not p.is_file()]
    assert not absent, f"backfilled files missing: {absent}"
    for day in missing:
        assert demo.heatmap_file(day).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", demo.heatmap_file(day)
        assert demo.gpu_states_file(day).read_bytes()[:4] == b"PAR1", demo.gpu_states_file(day)
    page.close()


def test_nightly_schedule_is_stopped_and_its_next_tick_targets_yesterday(ui: UI):
    from playwright.sync_api import expect

    server = ui.server
    repos = server.graphql(SCHEDULES)["repositoriesOrError"]
    assert repos["__typename"] == "RepositoryConnection", repos
    schedules = {s["name"]: (repo, s) for repo in repos["nodes"] for s in repo["schedules"]}
    assert "nightly_pipeline" in schedules, f"schedules: {sorted(schedules)}"
    _, schedule = schedules["nightly_pipeline"]
    assert schedule["scheduleState"]["status"] == "STOPPED", schedule["scheduleState"]
    tz = ZoneInfo(schedule["executionTimezone"] or ui.demo.timezone)
    tick = schedule["futureTicks"]["results"][0]
    tick_utc = dt.datetime.fromtimestamp(tick["timestamp"], dt.UTC)
    tick_local = tick_utc.astimezone(tz)
    expected = (tick_local.date() - dt.timedelta(days=1)).isoformat()
    assert (tick_local.hour, tick_local.minute) == (2, 15), f"next tick at {tick_local}, expected 02:15 local"
    result = tick["evaluationResult"]
    assert result and not result["error"] and not result["skipReason"], result
    partitions = [_tags(r).get("dagster/partition") for r in result["runRequests"]]
    assert partitions == [expected], (f"the tick at {tick_local} requests partitions {partitions}, "
                                      f"expected yesterday's {expected}")
    ui.record(next_tick_local=tick_local.isoformat(), next_tick_partition=partitions[0])

    page = ui.new_page()
    with ui.explained(page, "Automation lists nightly_pipeline as stopped"):
        page.goto(f"{server.url}/automation")
        link = page.get_by_role("link", name=re.compile(r"\bnightly_pipeline\b"))
        expect(link).to_be_visible()
        expect(page.get_by_text(re.compile(r"At 0?2:15 AM"))).to_be_visible()
        # the schedule's row: its selection checkbox and its on/off switch (a spinner until loaded)
        row = link.locator("xpath=ancestor::div[count(.//input[@type='checkbox']) >= 2][1]")
        expect(row.get_by_role("checkbox"), "selection checkbox and on/off switch").to_have_count(2)
        expect(row.get_by_role("checkbox").last, "nightly_pipeline switched off in the list").not_to_be_checked()
        ui.shot(page, "07-automation")
        link.click()
        running = page.get_by_role("row").filter(has_text="Running").get_by_role("checkbox")
        expect(running, "the schedule's Running switch").to_have_count(1)
        expect(running, "nightly_pipeline is stopped by default").not_to_be_checked()

    with ui.explained(page, f"preview of the tick at {tick_utc:%Y-%m-%d %H:%M} UTC requests partition {expected}"):
        page.get_by_role("button", name="Preview tick result").click()
        dialog = page.get_by_role("dialog").filter(has_text="Preview tick result")
        dialog.get_by_role("button", name=re.compile(r"\d{1,2}:\d{2} [AP]M")).click()
        # the browser runs in UTC: the menu lists ticks like "Nov 21, 8:15 AM UTC"
        label = f"{tick_utc:%b} {tick_utc.day}, {tick_utc.hour % 12 or 12}:{tick_utc:%M} {tick_utc:%p} UTC"
        page.get_by_role("menuitem", name=label, exact=True).click()
        dialog.get_by_role("button", name="Continue").click()
        expect(dialog.get_by_text("1 run requests")).to_be_visible()
        dialog.get_by_role("row").filter(has_text="daily_pipeline").get_by_role("button").click()
        config = page.get_by_role("dialog").filter(has_text="Run configuration")
        expect(config.get_by_text(f"partition: {expected}", exact=True)).to_be_visible()
        ui.shot(page, "08-schedule-next-tick")
        config.get_by_role("button", name="OK").click()
        dialog.get_by_role("button", name="Close").click()  # never "Launch all & commit tick result"
    page.close()
