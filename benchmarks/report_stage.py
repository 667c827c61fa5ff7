"""The report stage's own cost, split as the stage logs it: the report written (read, tables,
figures, HTML) and MLflow's mirror after it, with the store new (the stage makes MLflow's tables)
or made ahead (as the grid launcher does beside the runs: pipeline.tracking.make_store).

Run: python -m benchmarks.report_stage [--repeats 3] [--against CHECKOUT]
Prints one JSON object. Each trial is one new process of `python -m pipeline.report`, cold, on the
default study's stage outputs in this workspace (data/runs, data/eval, ...: `bash run.sh` or `dvc
repro` first), into a scratch folder and a scratch MLflow store. --against times that checkout's
code trial for trial in turn with this one (the same outputs, the same load), so read the ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INPUTS = {"--runs": "data/runs", "--evals": "data/eval", "--filter-metrics": "data/metrics/filter.json",
          "--download-metrics": "data/metrics/download.json", "--raw": "data/raw", "--shards": "data/shards",
          "--params": "params.yaml"}  # dvc.yaml's report command
WRITTEN = re.compile(r"report: wrote .* in ([0-9.]+) s")
MIRROR = re.compile(r"report: mirroring \d+ runs took ([0-9.]+) s more")


def trial(code: Path, store: str, folder: Path) -> dict:
    """One cold report stage of `code` on this workspace's outputs; `store`: "new" or "ahead"."""
    out, db = folder / "out", folder / "mlflow.db"
    # Run in the scratch folder, `code` on the path, this workspace's data/ linked there: the
    # command is dvc.yaml's, and MLflow's artifacts (mlruns/) go to the scratch folder.
    for name in ("dvc.lock", "params.yaml"):
        shutil.copy(ROOT / name, folder / name)
    (folder / "data").symlink_to(ROOT / "data")
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{db}", "ABLATION_LAB_TRACKING": "1",
           "ABLATION_LAB_MLFLOW_LIVE": "0", "ABLATION_LAB_AUTO_WARM": "0", "DVC_ROOT": str(folder),
           "PYTHONPATH": str(code)}
    if store == "ahead":
        subprocess.run([sys.executable, "-m", "pipeline.tracking", "--make-store"], cwd=folder, env=env, check=True)
    inputs = [x for pair in INPUTS.items() for x in pair]
    command = [sys.executable, "-m", "pipeline.report", *inputs, "--out-dir", str(out)]
    t0 = time.monotonic()
    run = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if run.returncode:
        raise SystemExit(f"report_stage: the report stage of {code} failed:\n{run.stderr[-2000:]}")
    written, mirror = WRITTEN.search(run.stderr), MIRROR.search(run.stderr)
    return {"wall_s": round(wall, 2), "written_s": float(written.group(1)) if written else None,
            "mirror_s": float(mirror.group(1)) if mirror else None}


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--against", type=Path, help="another checkout, timed in turn with this one")
    args = p.parse_args()
    if not (ROOT / "data" / "runs").is_dir():
        raise SystemExit("report_stage: no data/runs here: run `bash run.sh` (or `dvc repro`) first")
    codes = {"this": ROOT, **({"against": args.against.resolve()} if args.against else {})}
    stores = ("new", "ahead")
    runs: dict = {c: {s: [] for s in stores} for c in codes}
    for _ in range(args.repeats):
        for store in stores:
            for name, code in codes.items():
                if name == "against" and store == "ahead" and \
                        "--make-store" not in (code / "pipeline" / "tracking.py").read_text():
                    continue  # that checkout cannot make its store ahead
                with tempfile.TemporaryDirectory(prefix="report-stage.") as tmp:
                    runs[name][store].append(trial(code, store, Path(tmp)))
                print(f"report_stage: {name} {store}: {runs[name][store][-1]}", file=sys.stderr, flush=True)
    out = {"repeats": args.repeats, "cpu_count": os.cpu_count(), "load": os.getloadavg()[0], "runs": runs,
           "median": {c: {s: {k: median([r[k] for r in runs[c][s]]) for k in ("wall_s", "written_s", "mirror_s")}
                          for s in stores if runs[c][s]} for c in codes}}
    if args.against:
        this, against = out["median"]["this"], out["median"]["against"]
        # the stage alone (each making its store), and as the launcher runs it (this: made ahead)
        out["wall_ratio_to_against"] = {s: round(this[s]["wall_s"] / against["new"]["wall_s"], 3)
                                        for s in stores if s in this and this[s]["wall_s"] and against["new"]["wall_s"]}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
