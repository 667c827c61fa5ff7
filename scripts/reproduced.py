"""Did this study reproduce the committed one? One answer instead of a `git diff` to read.

    python -m scripts.reproduced                 # the workspace's reports/ against git's HEAD
    python -m scripts.reproduced --against REV   # against another commit (a tag, a branch)

Compares reports/fingerprint.json (each model.pt's sha256) and reports/metrics.json with the same
files at REV. Identical: exit 0. Otherwise (exit 1) it lists the models that differ, says why they
may (docs/training-engine.md#the-same-bits-on-every-cpu), and gives how far each ablation's Δ moved
in units of the committed interval's half-width and whether its verdict holds. Exit 2: a file is
missing or unreadable. Standard library only (no torch).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from pipeline.cpu_numerics import CHECKED_ON

FILES = ("fingerprint.json", "metrics.json")


def fail(message: str) -> None:
    print(f"reproduced: {message}", file=sys.stderr)
    raise SystemExit(2)


def committed(rev: str, path: str) -> dict:
    shown = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True)
    if shown.returncode:
        fail(f"{path} at {rev}: {(shown.stderr.strip().splitlines() or ['not found'])[-1]}")
    return json.loads(shown.stdout)


def current(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        fail(f"{path}: {exc} (run the study first: dvc repro)")


def significant(entry: dict) -> bool:
    return entry.get("delta_ci95") is not None and abs(entry["delta"]) > entry["delta_ci95"]


def moves(old: dict, new: dict) -> list[str]:
    """One line per ablation whose primary Δ moved: by how much, in units of the committed half-width."""
    lines = []
    for name, was in old.items():
        if not isinstance(was, dict) or "delta" not in was:
            continue
        now = new.get(name)
        if not isinstance(now, dict) or "delta" not in now:
            lines.append(f"  {name}: missing from this run's metrics.json")
            continue
        if now["delta"] == was["delta"] and now.get("delta_ci95") == was.get("delta_ci95"):
            continue
        half = was.get("delta_ci95")
        units = f"{abs(now['delta'] - was['delta']) / half:.2f} of its interval's half-width" if half else "no interval"
        same = (now["delta"] > 0) == (was["delta"] > 0) and significant(now) == significant(was)
        lines.append(f"  {name}: Δ {was['delta']:+.4g} ± {half or 0:.3g} -> {now['delta']:+.4g} ± "
                     f"{now.get('delta_ci95') or 0:.3g} (moved {units}; verdict {'holds' if same else 'CHANGED'})")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--against", default="HEAD", help="the commit whose reports/ to compare with (default HEAD)")
    p.add_argument("--reports", type=Path, default=Path("reports"))
    args = p.parse_args(argv)
    old = {name: committed(args.against, f"{args.reports.as_posix()}/{name}") for name in FILES}
    new = {name: current(args.reports / name) for name in FILES}
    models_old, models_new = old["fingerprint.json"]["models"], new["fingerprint.json"]["models"]
    differ = sorted(k for k in models_old.keys() | models_new.keys() if models_old.get(k) != models_new.get(k))
    if not differ and old["metrics.json"] == new["metrics.json"]:
        print(f"reproduced: identical to {args.against} ({len(models_new)} models the same bits, metrics.json "
              "the same numbers)")
        return 0
    print(f"reproduced: NOT identical to {args.against}: {len(differ)} of {len(models_old)} models differ"
          + (f" ({', '.join(differ[:6])}{', ...' if len(differ) > 6 else ''})" if differ else ""))
    if differ:
        print(why(old["fingerprint.json"].get("cpu_numerics", {}), new["fingerprint.json"].get("cpu_numerics", {})))
    print("\n".join(moves(old["metrics.json"], new["metrics.json"])) or "  metrics.json: the same numbers")
    return 1


def why(was: dict, now: dict) -> str:
    """Why models may differ, from how each study's CPU kernels ran (fingerprint.json cpu_numerics)."""
    unpinned = sorted({v for v in now.values() if v.startswith("not")})
    if unpinned:
        return (f"  this study's CPU kernels were {', '.join(unpinned)}: its numbers are this machine's; "
                f"{KNOWN}; compare the verdicts below")
    if set(was.values()) != set(now.values()):
        return (f"  the committed study ran its CPU kernels as {', '.join(sorted(set(was.values()))) or 'unrecorded'}, "
                f"this one as {', '.join(sorted(set(now.values())))}: other kernels, other bits; compare the verdicts below")
    return ("  both ran pinned alike, so the same bits were promised: look first for other params or code "
            "(git status, dvc params diff) or other package versions (constraints.txt); pinned, no op is known "
            f"to part ways between CPU models ({', '.join(CHECKED_ON)} checked: docs/training-engine.md), so "
            "if neither, this CPU breaks the promise: please report it; the verdicts below are what to compare")


# What a CPU of another make or model changes when the kernels are not pinned (pipeline/cpu_numerics.py).
KNOWN = ("unpinned, MKL's matrix products and vector maths (exp, log, sqrt), torch's fused CPU attention and "
         "oneDNN's gelu give other bits on other CPU models")


if __name__ == "__main__":
    sys.exit(main())
