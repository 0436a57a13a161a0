"""The Dagster UI in a real browser: `dagster dev -w workspace.yaml` opened in headless Chromium.

Debian's ``chromium`` package driven by Playwright with ``executable_path`` (no browser download;
.ci/run installs the package). The test checks the asset graph a user sees (sources, views,
epoch_commit, sinks), then launches epoch_job from the Launchpad, watches the run succeed, and finds
the failed check it recorded on the epoch's partition (the demo plus one check that fails on any row).

``UPDATE_SCREENSHOTS=1`` also writes the asset graph to docs/images/asset-graph.png (the
README's picture); otherwise it goes to the test's temp dir only, so a test run changes no tracked file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.dagster_dev import REPO, DagsterDev, dagster_dev, epochal_status, isolated_env

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
SCREENSHOT = REPO / "docs" / "images" / "asset-graph.png"

# The demo pipeline (epochal/demo_pipeline/*.sql) as the asset graph groups it.
GROUPS = {
    "sources": ["bid", "auction"],
    "views": ["big_bids", "big_bids_banded", "auction_stats", "top_bids", "category_volume", "bids_per_window"],
    "checkpoint": ["epoch_commit", "epoch_compaction"],
    "sinks": ["big_bids_out", "auction_stats_out"],
}
VIEWPORT = {"width": 1300, "height": 1150}  # the graph is taller than wide: room to read the names
TOOLBAR_BOTTOM = 95  # the graph's search bar covers the top of the viewport
TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}
#: a check added to the demo that fails at any epoch where big_bids has a row: an error check, so it
#: also holds big_bids_out back
FAILING_CHECK = "no_big_bids"
CHECKS_SQL = f"CREATE CHECK {FAILING_CHECK} ON big_bids AS SELECT * FROM big_bids WHERE price_eur > 0;\n"


def wait_for_run(server: DagsterDev, run_id: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while (status := server.run_status(run_id)) not in TERMINAL:
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} still {status} after {timeout}s:\n{server.tail()}")
        time.sleep(2)
    return status


def show_whole_asset_graph(page, names: list[str]) -> tuple[float, float, float, float]:  # noqa: ANN001
    """Expand every group, zoom out until all ``names`` are drawn on screen, center them; their box."""
    from playwright.sync_api import expect

    # The graph is drawn, groups collapsed (slow on a busy machine: it lays out in the browser).
    expect(page.get_by_text("views", exact=True).last).to_be_visible(timeout=120_000)
    page.get_by_role("button", name="Hide navigation").click()
    page.locator("button:has([aria-label=panel_show_right])").last.click()  # the asset tree beside the graph
    page.mouse.click(VIEWPORT["width"] / 2, VIEWPORT["height"] - 40, button="right")  # the graph's background
    page.get_by_role("menuitem", name="Expand all groups").click()

    def box() -> tuple[float, float, float, float] | None:
        boxes = []
        for name in names:
            label = page.get_by_text(name, exact=True)
            if not label.count():  # the graph draws only what is on screen
                return None
            boxes.append(label.last.bounding_box())
        return (min(b["x"] for b in boxes), min(b["y"] for b in boxes),
                max(b["x"] + b["width"] for b in boxes), max(b["y"] + b["height"] for b in boxes))

    for _ in range(12):
        found = box()
        if found and found[2] - found[0] < VIEWPORT["width"] - 200 and found[3] - found[1] < VIEWPORT["height"] - 200:
            break
        page.locator("[aria-label=zoom_out]").click()
        page.wait_for_timeout(300)
    else:
        raise AssertionError(f"the asset graph never showed all of {names} at once")
    # Drag the graph so that it sits in the middle of the free area, clear of the toolbar.
    x0, y0, x1, y1 = found
    page.mouse.move((x0 + x1) / 2, (y0 + y1) / 2)
    page.mouse.down()
    page.mouse.move(VIEWPORT["width"] / 2, (VIEWPORT["height"] + TOOLBAR_BOTTOM) / 2, steps=5)
    page.mouse.up()
    page.wait_for_timeout(500)
    centered = box()
    if centered is None:
        raise AssertionError("the asset graph lost nodes while it was centered")
    return centered


def test_asset_graph_and_a_launchpad_run(tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium is not at {CHROMIUM}: `apt-get install chromium` (.ci/run does) or set CHROMIUM_PATH")
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import expect, sync_playwright

    env = isolated_env(tmp_path)
    pipeline = shutil.copytree(REPO / "epochal" / "demo_pipeline", tmp_path / "pipeline")
    (pipeline / "04_checks.sql").write_text(CHECKS_SQL)
    env["EPOCHAL_PIPELINE"] = str(pipeline)
    started = time.monotonic()
    command = [sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml"]
    with dagster_dev(command, env, tmp_path / "dagster_dev.log") as server, sync_playwright() as playwright:
        # Closed with `playwright` on the way out, whatever happens.
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport=VIEWPORT, device_scale_factor=1.5)
        page.set_default_timeout(30_000)
        served = time.monotonic()
        try:

            # The asset graph: every source, view, the commit and every sink, in their groups.
            page.goto(f"{server.url}/asset-groups")
            names = [*GROUPS, *(asset for assets in GROUPS.values() for asset in assets)]
            x0, y0, x1, y1 = show_whole_asset_graph(page, names)
            for name in names:
                expect(page.get_by_text(name, exact=True).last).to_be_visible()
            shot = tmp_path / "asset-graph.png"
            # Margins: the group boxes reach below their last node's label.
            page.screenshot(path=shot, clip={"x": x0 - 30, "y": y0 - 30, "width": x1 - x0 + 60, "height": y1 - y0 + 90})
            if os.environ.get("UPDATE_SCREENSHOTS") == "1":
                SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(shot, SCREENSHOT)
            graph_checked = time.monotonic()

            # Jobs -> epoch_job -> Launchpad -> Launch Run, as the README says.
            page.goto(f"{server.url}/jobs")
            page.get_by_text("epoch_job", exact=True).first.click()
            page.get_by_role("tab", name="Launchpad").click()
            page.get_by_role("button", name="Launch Run").click()
            page.wait_for_url("**/runs/*")
            run_id = page.url.rstrip("/").split("/")[-1].split("?")[0]
            status = wait_for_run(server, run_id, timeout=900)
            assert status == "SUCCESS", f"run {run_id} ended {status}:\n{server.tail()}"
            # The run page itself says so (its status tag), not only the GraphQL API.
            expect(page.get_by_text("Success", exact=True).first).to_be_visible(timeout=60_000)
            ran = time.monotonic()

            # The check failed on the epoch's partition, and the asset's checks tab says so.
            committed = epochal_status(env)["committed_epoch"]
            page.goto(f"{server.url}/assets/big_bids?view=checks")
            expect(page.get_by_text(FAILING_CHECK, exact=True).first).to_be_visible(timeout=60_000)
            expect(page.get_by_text("Failed", exact=True).first).to_be_visible(timeout=60_000)
            expect(page.get_by_text(str(committed), exact=True).first).to_be_visible()  # its Partition
            page.screenshot(path=tmp_path / "failed-check.png")
        except Exception:
            with contextlib.suppress(PlaywrightError):  # what the browser showed, next to dagster_dev.log
                page.screenshot(path=tmp_path / "failure.png")
            raise
    # The run from the UI went through the controller: one epoch committed for every table.
    status = epochal_status(env)
    assert status["committed_epoch"] is not None and status["in_flight"] == [], status
    assert set(status["tables"].values()) == {status["committed_epoch"]}, status
    print(f"\nUI test: served {served - started:.0f}s, graph {graph_checked - served:.0f}s, "
          f"run {ran - graph_checked:.0f}s, total {time.monotonic() - started:.0f}s")
