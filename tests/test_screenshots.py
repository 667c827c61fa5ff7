"""What a user opens, seen by a headless Chromium at 1280 px: MLflow's runs page and report.html.

Skipped where no Chromium is installed (Debian: `apt-get install chromium`). Each call gets a
fresh browser profile, so nothing the MLflow UI remembers between visits (chosen columns, grouping,
the workflow switch) changes what is seen: this is the page a first-time user gets.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
from PIL import Image

from pipeline.report import render_report
from pipeline.reporting.mlflow_mirror import RunFiles, mirror_runs
from tests.fixtures.report.fake_runs import VARIANTS, make_project

BROWSER = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no chromium binary on PATH")
WIDTH, HEIGHT = 1280, 900


def chromium(tmp_path: Path, url: str, *args: str, budget_ms: int = 15_000) -> str:
    """Run headless Chromium on `url` with `args` (--screenshot=..., --dump-dom); returns stdout.

    The virtual-time budget lets a single-page app (MLflow's React UI) fetch and render first.
    """
    profile = tmp_path / f"chromium-{time.monotonic_ns()}"
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           # without these three it stalls on an offline machine, waiting on Google's services
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           # otherwise a screenshot may catch parts of a long page not painted yet
           "--run-all-compositor-stages-before-draw", "--hide-scrollbars",
           f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}", f"--virtual-time-budget={budget_ms}",
           *args, url]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def assert_screenshot(png: Path) -> None:
    """A 1280 px wide capture of a rendered page, not of a blank (near single-colour) one."""
    with Image.open(png) as im:
        assert im.size == (WIDTH, HEIGHT)
        colours = im.convert("RGB").getcolors(maxcolors=1 << 16)  # None: more colours than that
    assert colours is None or len(colours) > 50, f"{png} is nearly blank ({len(colours)} colours)"


@contextmanager
def mlflow_server(db: Path, log: Path):
    """`mlflow server` on a free local port over the sqlite store `db`; yields its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with log.open("wb") as sink:
        # Its own session, so the uvicorn worker it starts is stopped with it. No job runner (a
        # handful of queue consumers, for GenAI jobs) and no telemetry: a page of runs needs neither.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db}",
             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            cwd=db.parent, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"mlflow server did not answer:\n{log.read_text(errors='replace')[-2000:]}")
                time.sleep(0.5)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
def test_mlflow_runs_page_shows_every_variant_and_seed(tmp_path, monkeypatch):
    tracking = pytest.importorskip("mlflow.tracking")
    monkeypatch.chdir(tmp_path)  # the store's default artifact root, ./mlruns, lands in tmp_path
    db = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    p = make_project(tmp_path, seeds=(0, 1), missing_runs=())
    runs = [RunFiles(v, s, p.runs / f"{v}-{s}", p.evals / f"{v}-{s}") for v in VARIANTS for s in (0, 1)]
    for run in runs:  # the resolved params the train stage writes
        (run.run_dir / "config.json").write_text(json.dumps({"model": {"d_model": 32}, "train": {"lr": 0.001}}))
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "report.md").write_text("# Ablation report\n")
    assert mirror_runs(runs, tmp_path / "reports", "ablation-lab") is not None
    exp_id = tracking.MlflowClient().get_experiment_by_name("ablation-lab").experiment_id

    png = tmp_path / "mlflow_runs.png"
    with mlflow_server(db, tmp_path / "mlflow-server.log") as base:
        url = f"{base}/#/experiments/{exp_id}/runs"
        chromium(tmp_path, url, f"--screenshot={png}")
        dom = chromium(tmp_path, url, "--dump-dom")
    assert_screenshot(png)
    # Each training run is a row of its own: as children of the report run, the table would show
    # only a collapsed `report` row, and none of these names.
    texts = {t.strip() for t in re.findall(r">([^<>]+)<", dom)}
    assert {r.name for r in runs} | {"report"} <= texts


# Added before </body>: the page's layout width against the window's, once everything has loaded.
PROBE = ("<script>addEventListener('load', () => { const d = document.documentElement;"
         " document.body.setAttribute('data-widths', d.scrollWidth + ' ' + d.clientWidth); });</script>")


def test_report_html_fits_1280_px_with_wide_tables_scrolling_inside(tmp_path):
    p = make_project(tmp_path)
    samples = p.evals / "baseline-0" / "samples.json"
    rows = json.loads(samples.read_text())
    rows[0]["prediction"] = "x" * 300  # a degenerate output with no space: wider than the page
    samples.write_text(json.dumps(rows))
    out = tmp_path / "reports"
    render_report(p.runs, p.evals, p.filter_metrics, p.variants, p.seeds, "baseline", {"budget_tokens": 200_000}, out)

    page = (out / "report.html").read_text(encoding="utf-8")
    probe = out / "probe.html"
    probe.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    found = re.search(r'data-widths="(\d+) (\d+)"', chromium(tmp_path, probe.as_uri(), "--dump-dom", budget_ms=5_000))
    assert found, "the probe script did not run"
    scroll_width, window_width = map(int, found.groups())
    assert scroll_width <= window_width, "the page scrolls sideways: a table or figure is wider than the window"

    png = tmp_path / "report.png"
    chromium(tmp_path, (out / "report.html").as_uri(), f"--screenshot={png}", budget_ms=5_000)
    assert_screenshot(png)
