"""What a user opens, seen by a headless Chromium at 1280 px: MLflow's runs page and report.html.

Skipped where no Chromium is installed (Debian: `apt-get install chromium`). Each call gets a
fresh browser profile, so nothing the MLflow UI remembers between visits (chosen columns, grouping,
the workflow switch) changes what is seen: this is the page a first-time user gets.

The README's two pictures are these tests' screenshots: with ABLATION_LAB_SCREENSHOTS=docs/img the
tests also copy them there, so they are remade, not drawn by hand:
- report-first-screen.png: the committed default report (reports/report.html);
- mlflow-compare-variants.png: the saved view "Compare variants" on the default study's own runs,
  the MLflow store `bash run.sh` leaves in the repository (mlflow.db), as a user who opened the
  link the report stage prints and closed MLflow's Assistant panel sees it. Its provenance
  (the runs, their mean val_loss, the picture's hash) goes to mlflow-compare-variants.json, which
  tests/test_docs.py checks against the committed report on every run, browser or not.

    bash run.sh && ABLATION_LAB_SCREENSHOTS=docs/img bash run.sh test tests/test_screenshots.py

Where mlflow.db does not hold the committed report's runs (a fresh clone before `bash run.sh`, CI,
or after a study of other params), that test takes the same view of the runs the report stage
mirrors from the tiny project (tests/tiny_project.py) instead, so CI checks the page without running
the study; remaking the picture needs the study's own store.
"""
from __future__ import annotations

import hashlib
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

import mlflow
import pytest
from PIL import Image

from pipeline.params import load_params
from pipeline.report import DEFAULT_EXPERIMENT, render_report
from pipeline.report import main as report_main
from pipeline.reporting.mlflow_mirror import RunData, RunFiles, mirror_runs
from pipeline.reporting.mlflow_view import CURRENT_RUNS, VIEW_ID, VIEW_NAME, VIEW_QUERY
from pipeline.reporting.study import Study, read_inputs
from tests.cdp import Browser
from tests.committed import default_params
from tests.fixtures.report.fake_runs import VARIANTS, make_project
from tests.tiny_project import ROOT, copy_project

BROWSER = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
pytestmark = [pytest.mark.browser, pytest.mark.skipif(BROWSER is None, reason="no chromium binary on PATH")]
WIDTH, HEIGHT = 1280, 900
# Where the README's pictures go when asked (a folder, relative to the repository root); unset: nowhere.
KEEP = os.environ.get("ABLATION_LAB_SCREENSHOTS")


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


def keep(png: Path, name: str) -> None:
    """Copy a checked screenshot to $ABLATION_LAB_SCREENSHOTS/name (the README's pictures)."""
    if KEEP:
        folder = ROOT / KEEP
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(png, folder / name)


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
def test_mlflow_runs_page_shows_every_run_its_training_time_and_its_data(tmp_path, monkeypatch):
    import mlflow.tracking as tracking
    monkeypatch.chdir(tmp_path)  # the store's default artifact root, ./mlruns, lands in tmp_path
    db = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    p = make_project(tmp_path, seeds=(0, 1), missing_runs=())
    runs = [RunFiles(v, s, p.runs / f"{v}-{s}", p.evals / f"{v}-{s}") for v in VARIANTS for s in (0, 1)]
    durations = {}
    for i, run in enumerate(runs):  # the resolved params and the stage's times the train stage writes
        (run.run_dir / "config.json").write_text(json.dumps({"model": {"d_model": 32}, "train": {"lr": 0.001}}))
        train = json.loads((run.run_dir / "train.json").read_text())
        durations[run.name] = 6.0 + 0.7 * i  # seconds, as a small run trains
        train.update(started_at=1_700_000_000.0 + 60 * i, finished_at=1_700_000_000.0 + 60 * i + durations[run.name])
        (run.run_dir / "train.json").write_text(json.dumps(train))
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "report.md").write_text("# Ablation report\n")
    data = RunData("tiny_shakespeare", "0123456789abcdef0123456789abcdef", json.dumps({"data.source": "tiny_shakespeare"}))
    assert mirror_runs(runs, tmp_path / "reports", "ablation-lab", data, ("val_loss", "rougeL")) is not None
    exp_id = tracking.MlflowClient().get_experiment_by_name("ablation-lab").experiment_id

    png, view_png = tmp_path / "mlflow_runs.png", tmp_path / "mlflow_view.png"
    with mlflow_server(db, tmp_path / "mlflow-server.log") as base:
        url = f"{base}/#/experiments/{exp_id}/runs"
        chromium(tmp_path, url, f"--screenshot={png}")
        dom = chromium(tmp_path, url, "--dump-dom")
        view = f"{url}?viewStateShareKey={VIEW_ID}"
        chromium(tmp_path, view, f"--screenshot={view_png}")
        view_dom = chromium(tmp_path, view, "--dump-dom")
    (tmp_path / "mlflow_view.html").write_text(view_dom)  # kept beside the screenshots, to read on a failure
    assert_screenshot(png)
    assert_screenshot(view_png)
    # Each training run is a row of its own: as children of the report run, the table would show
    # only a collapsed `report` row, and none of these names.
    texts = {t.strip() for t in re.findall(r">([^<>]+)<", dom)}
    assert {r.name for r in runs} | {"report"} <= texts
    # Duration: the training time train.json recorded (MLflow writes "6.7s"), not the ms of mirroring
    assert {f"{d:.1f}s" for d in durations.values()} <= texts, sorted(t for t in texts if t.endswith("s"))[:40]
    assert len([t for t in texts if re.fullmatch(r"\d+ms", t)]) <= 1  # the report run's own: mirroring
    assert any("tiny_shakespeare" in t for t in texts)  # the Dataset column
    # The saved view: the metric columns, one row per variant (group by the `variant` tag)
    view_texts = {t.strip() for t in re.findall(r">([^<>]+)<", view_dom)}
    assert VIEW_NAME in view_texts and {"val_loss", "rougeL"} <= view_texts
    assert {f"Group: {v}" for v in VARIANTS} <= view_texts, sorted(view_texts)[:80]
    headers = {c: int(i) for i, c in re.findall(r'role="columnheader"[^>]*aria-colindex="(\d+)" col-id="([^"]+)"', view_dom)}
    assert headers["metrics.`val_loss`"] < headers["metrics.`rougeL`"] < headers["attributes.`Dataset`"], headers


# The default study's store, where `bash run.sh` leaves it, and the README picture taken from it.
STUDY_STORE = ROOT / "mlflow.db"
VIEW_PICTURE, VIEW_PROVENANCE = "mlflow-compare-variants.png", "mlflow-compare-variants.json"
# Run before MLflow's own scripts: the browser storage of a user who has been here once and closed
# the Assistant panel, which MLflow 3.17 opens by itself on a first visit to a local server (its
# useLocalStorage hook keeps each setting as `<key>_v<version>`, JSON-encoded).
RETURNING_USER = ("localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');"
                  "localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');")


def study_runs(db: Path) -> tuple[str, dict[str, float], list[str]]:
    """(experiment id, variant -> mean val_loss, run names) of the current runs in the store `db`,
    as the saved view selects them."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    experiment = client.get_experiment_by_name(DEFAULT_EXPERIMENT)
    if experiment is None:
        return "", {}, []
    runs = client.search_runs([experiment.experiment_id], CURRENT_RUNS, max_results=10_000)
    losses: dict[str, list[float]] = {}
    for run in runs:
        losses.setdefault(run.data.tags.get("variant", ""), []).append(run.data.metrics.get("val_loss", float("nan")))
    means = {variant: sum(values) / len(values) for variant, values in losses.items()}
    return experiment.experiment_id, means, sorted(run.info.run_name for run in runs)


def tiny_study_store(tiny: Path, tmp_path: Path, db: Path, monkeypatch) -> tuple[list[str], list[int]]:
    """The store the report stage writes into `db` from the tiny project's runs (a copy of `tiny`,
    tests/tiny_project.py, trained by `dvc repro` with MLflow off): its variants and seeds."""
    project = tmp_path / "project"
    copy_project(tiny, project)
    monkeypatch.chdir(project)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    monkeypatch.setenv("DVC_ROOT", str(project))  # where the report stage finds dvc.lock
    monkeypatch.setenv("ABLATION_LAB_TRACKING", "1")
    report_main(["--runs", "data/runs", "--evals", "data/eval", "--filter-metrics", "data/metrics/filter.json",
                 "--download-metrics", "data/metrics/download.json", "--raw", "data/raw", "--shards", "data/shards",
                 "--params", "params.yaml", "--out-dir", "reports"])
    params = load_params(project / "params.yaml")
    return list(params.ablations), params.seeds


@pytest.mark.repro  # the tiny project, where the default study's store is not there (tiny_repo)
@pytest.mark.slow
def test_the_default_studys_runs_in_the_saved_view_as_the_readme_shows_them(tmp_path, request, monkeypatch):
    """The README's second picture: the saved view on the default study's own runs, where `bash
    run.sh` left them (mlflow.db); elsewhere (a fresh clone, CI) the same view on the runs the report
    stage mirrors from the tiny project, so the page is checked on every run. Remaking the picture
    (ABLATION_LAB_SCREENSHOTS) needs the study's own store and fails without it."""
    params = default_params()  # the committed default study's, whatever the workspace's params.yaml holds
    report = json.loads((ROOT / "reports" / "metrics.json").read_text())
    variants, seeds = list(params["ablations"]), params["seeds"]
    db = tmp_path / "mlflow.db"
    if STUDY_STORE.exists():
        shutil.copyfile(STUDY_STORE, db)  # the server may upgrade a store's schema: never the user's own
    exp_id, means, names = study_runs(db) if db.exists() else ("", {}, [])
    # The picture must show the runs the committed report summarizes: the same runs, the same means.
    if names != sorted(f"{v}-{s}" for v in variants for s in seeds) or \
            any(means.get(v) != pytest.approx(report[v]["mean"], rel=1e-9) for v in variants):
        if KEEP:
            pytest.fail(f"{STUDY_STORE} does not hold the runs of reports/metrics.json: run `bash run.sh` first")
        db.unlink(missing_ok=True)
        variants, seeds = tiny_study_store(request.getfixturevalue("tiny_repo"), tmp_path, db, monkeypatch)
        exp_id, means, names = study_runs(db)
        assert names == sorted(f"{v}-{s}" for v in variants for s in seeds), names  # the report stage mirrored each

    png = tmp_path / VIEW_PICTURE
    query = f"#/experiments/{exp_id}/runs?{VIEW_QUERY}"  # the link the report stage prints
    groups = [f"Group: {v}" for v in variants]
    shown = f"(() => {{ const t = document.body ? document.body.innerText : ''; " \
            f"return t.includes('val_loss') && {json.dumps(groups)}.every(g => t.includes(g)); }})()"
    profile = tmp_path / "profile"
    with mlflow_server(db, tmp_path / "mlflow-server.log") as base, \
            Browser(BROWSER, str(profile), WIDTH, HEIGHT) as page:
        page.add_init_script(RETURNING_USER)
        page.goto(f"{base}/{query}")
        page.wait_for(shown, timeout=120, settle=2.0)
        png.write_bytes(page.screenshot())
        text = page.evaluate("document.body.innerText")
    assert_screenshot(png)
    assert all(g in text for g in groups) and "val_loss" in text
    # Model-training mode: the side bar lists runs and models, not the GenAI pages (judges, sessions, playground) ...
    assert {"Runs", "Models"} <= set(text.split("\n")), text[:600]
    assert not {"Judges", "Sessions", "Playground"} & set(text.split("\n")), text[:600]
    # ... and the Assistant panel is closed (its button may stay, its chat box does not)
    assert "Ask a question" not in text and "Ask questions about your experiments" not in text
    if KEEP:
        keep(png, VIEW_PICTURE)
        provenance = {
            "taken_by": "tests/test_screenshots.py::test_the_default_studys_runs_in_the_saved_view_as_the_readme_shows_them",
            "store": "mlflow.db after `bash run.sh` (the default study, params.yaml)",
            "url": query, "window": [WIDTH, HEIGHT],
            "mlflow": mlflow.__version__,
            "runs": names, "val_loss_mean": means,
            "png_sha256": hashlib.sha256(png.read_bytes()).hexdigest(),
        }
        (ROOT / KEEP / VIEW_PROVENANCE).write_text(json.dumps(provenance, indent=1) + "\n")


# Added before </body>: the page's layout width against the window's, and where the verdict and the
# first figure sit, once everything (the embedded PNGs) has loaded.
PROBE = ("<script>addEventListener('load', () => { const d = document.documentElement;"
         " const box = e => { const r = e.getBoundingClientRect(); return Math.round(r.top) + ' ' + Math.round(r.bottom); };"
         " const verdict = [...document.querySelectorAll('h2')].find(h => h.textContent === 'Verdict');"
         " document.body.setAttribute('data-widths', d.scrollWidth + ' ' + d.clientWidth);"
         " document.body.setAttribute('data-verdict', verdict ? box(verdict.nextElementSibling) : 'none');"
         " document.body.setAttribute('data-figure', box(document.querySelector('figure img'))); });</script>")


def first_screen(tmp_path: Path, page: str) -> tuple[int, int, int, int, int]:
    """Layout of report.html's text `page` at 1280 x 900: (page width, window width, verdict top,
    figure top, figure bottom) in px, once the embedded figures have loaded."""
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom = chromium(tmp_path, probe.as_uri(), "--dump-dom", budget_ms=5_000)
    found = re.search(r'data-widths="(\d+) (\d+)"', dom)
    assert found, "the probe script did not run"
    verdict_top, _ = map(int, re.search(r'data-verdict="(-?\d+) (-?\d+)"', dom).groups())
    figure_top, figure_bottom = map(int, re.search(r'data-figure="(-?\d+) (-?\d+)"', dom).groups())
    return (*map(int, found.groups()), verdict_top, figure_top, figure_bottom)


def test_report_html_at_1280_px_opens_on_verdict_and_figure_without_sideways_scrolling(tmp_path):
    p = make_project(tmp_path)
    samples = p.evals / "baseline-0" / "samples.json"
    rows = json.loads(samples.read_text())
    rows[0]["prediction"] = "x" * 300  # a degenerate output with no space: wider than the page
    samples.write_text(json.dumps(rows))
    out = tmp_path / "reports"
    render_report(read_inputs(Study(p.runs, p.evals, p.filter_metrics, p.variants, p.seeds, "baseline",
                                    {"budget_tokens": 200_000})), out)

    page = (out / "report.html").read_text(encoding="utf-8")
    scroll_width, window_width, verdict_top, figure_top, figure_bottom = first_screen(tmp_path, page)
    assert scroll_width <= window_width, "the page scrolls sideways: a table or figure is wider than the window"
    # The first screen (1280 x 900) holds the verdict and the whole Δ figure, above every table.
    assert 0 <= verdict_top < figure_top < figure_bottom <= HEIGHT, (verdict_top, figure_top, figure_bottom)
    assert 'src="data:image/png;base64,' in page[page.index("<figure>"):page.index("</figure>")]
    assert page.index("<figure>") < page.index("<table>")

    png = tmp_path / "report.png"
    chromium(tmp_path, (out / "report.html").as_uri(), f"--screenshot={png}", budget_ms=5_000)
    assert_screenshot(png)


def test_the_committed_default_report_opens_on_its_verdict_and_figure(tmp_path):
    # The README's first picture: the default study's report as committed, not a fixture's.
    report = ROOT / "reports" / "report.html"
    page = report.read_text(encoding="utf-8")
    scroll_width, window_width, verdict_top, figure_top, figure_bottom = first_screen(tmp_path, page)
    assert scroll_width <= window_width, f"{report} scrolls sideways at {WIDTH} px"
    assert 0 <= verdict_top < figure_top < figure_bottom <= HEIGHT, (verdict_top, figure_top, figure_bottom)
    png = tmp_path / "report.png"
    chromium(tmp_path, report.as_uri(), f"--screenshot={png}", budget_ms=5_000)
    assert_screenshot(png)
    keep(png, "report-first-screen.png")
