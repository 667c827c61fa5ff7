"""The CPU time model, fitted to the committed studies:

    wall = steps x (sublayers x sublayer_s + activation bytes / bytes_per_s) + FLOPs / (peak x mfu)

The three terms (matmuls, memory-bound work, a fixed cost per sublayer) are explained in
docs/scaling-out-and-cost-plan.md#know-the-cost-first. The walls come from the committed report.md
files' tables, the only record of the runs git keeps; each report is read with the params.yaml
beside it (or one folder up), checked against the report's parameter counts so that an edited
params.yaml is never paired with an older report.
"""
from __future__ import annotations

import contextlib
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from pipeline.params import load_params, resolve_variant
from pipeline.planning.estimate import (PlanError, activation_bytes, mean_shape, meta_model, shared_share, sublayers,
                                       task_of, tokenizer_ids)
from pipeline.train import flops_per_target_token


def thread_flops(flops: float, split: float, threads: int) -> float:
    """The FLOPs one thread does on the pinned products: those of products shared among the loop's
    `threads` (`split`, a share of the multiply-adds: estimate.shared_share) divide among them, the
    rest run whole. (torch's own products' threads are in the MFU fitted to them.)"""
    return flops * (1 - split * (1 - 1 / threads))


@dataclass
class Calibration:
    """CPU time model (module docstring), fitted to measured runs."""
    mfu: float
    sublayer_s: float  # seconds per sublayer per optimizer step
    bytes_per_s: float  # activation bytes (of one step's saved tensors) handled per second; inf: no such term
    runs: int  # measured variants (one wall each) the fit used
    source: str
    # The matmul peak the fitted runs divided by: a machine measured slower or faster than that is
    # taken to be so in every term, not only the FLOPs'. None: the per-step terms as fitted.
    peak: float | None = None
    pinned: bool = False  # fitted to runs on the pinned products (pipeline/cpu_numerics.py)

    def step_s(self, n_sublayers: int, act_bytes: float) -> float:
        """The per-step cost besides the FLOPs: fixed work per sublayer and memory-bound work."""
        return n_sublayers * self.sublayer_s + act_bytes / self.bytes_per_s

    def thread_flops(self, flops: float, split: float = 0.0, threads: int = 1) -> float:
        return thread_flops(flops, split, threads) if self.pinned else flops

    def cpu_seconds(self, steps: int, n_sublayers: int, act_bytes: float, flops: float, peak: float,
                    split: float = 0.0, threads: int = 1) -> float:
        speed = self.peak / peak if self.peak else 1.0
        return steps * self.step_s(n_sublayers, act_bytes) * speed + self.thread_flops(flops, split, threads) / (
            peak * self.mfu)

    def parallel_share(self, steps: int, n_sublayers: int, act_bytes: float, flops: float, peak: float,
                       split: float = 0.0, threads: int = 1) -> float:
        """The share of `cpu_seconds` that the loop's threads split among them: the products' FLOPs,
        on the pinned products only the shared ones (`thread_flops`). The per-sublayer and
        memory-bound terms are taken as one thread's: a pinned step at the default study's shape
        (no product shared) took 1.07-1.11x as long at one thread as at two, at S1's (all shared)
        1.28-1.34x; torch's own products 1.18-1.37x and 1.21-1.56x (reports/benchmarks/
        cpu_numerics*.json, three CPUs)."""
        products = (flops * split / threads if self.pinned else flops) / (peak * self.mfu)
        return products / self.cpu_seconds(steps, n_sublayers, act_bytes, flops, peak, split, threads)

    def describe(self) -> str:
        traffic = "" if self.bytes_per_s == float("inf") else f" + activation bytes / {self.bytes_per_s:.3g} B/s"
        return f"steps x ({self.sublayer_s * 1e3:.3g} ms per sublayer{traffic}) + FLOPs / (peak x MFU {self.mfu:.3g})"


# Seeds of one variant do the same work, so their walls agree unless other jobs shared the cores:
# a variant's wall is the median of its seeds' when another seed agrees with it within this
# fraction, and the variant is left out when none does (it measured the load).
SEED_AGREEMENT = 0.10


def seed_wall(walls: list[float]) -> float | None:
    """The median of one variant's per-seed walls if another seed confirms it, else None."""
    if len(walls) < 2:
        return walls[0] if walls else None
    mid = statistics.median_low(walls)
    others = list(walls)
    others.remove(mid)
    return mid if any(abs(w - mid) <= SEED_AGREEMENT * mid for w in others) else None


CONTENDED = "⚠"  # the report's mark on a timing taken under contention (pipeline/reporting/cost.py)


def markdown_table(text: str, heading: str) -> list[dict]:
    """Rows of the first table under `## heading` in a report.md, as {column: cell}."""
    parts = re.split(r"^## ", text, flags=re.M)
    section = next((p for p in parts if p.startswith(heading)), None)
    if section is None:
        return []
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    if len(lines) < 3:
        return []
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[2:]]


def number(cell: str) -> float:
    """'1,389–1,394' (min–max over seeds) -> 1391.5, its middle; '2.48e+06' -> 2480000.0."""
    ends = [float(part) for part in cell.replace(",", "").split("–")]
    return sum(ends) / len(ends)


def measured_runs(report: Path) -> list[dict]:
    """One committed report's training-cost rows, each with its wall (`seed_wall` over the per-run
    table where there is one, else the cost table's mean over seeds)."""
    text = report.read_text(encoding="utf-8")
    walls: dict[str, list[float]] = {}
    for r in markdown_table(text, "Per-run values"):
        # "—": a run the study never made (seeds until decided stops a decided comparison's seeds)
        if r.get("wall time (s)", "—") not in ("", "—") and CONTENDED not in r["wall time (s)"]:
            walls.setdefault(r["variant"], []).append(number(r["wall time (s)"]))
    out = []
    for r in markdown_table(text, "Training cost"):
        if not r.get("device", "").startswith("cpu") or r.get("MFU") in (None, "—", ""):
            continue
        if CONTENDED in r.get("wall time (s)", "") + r.get("tokens/s", "") and (
                r.get("others' CPU (max)", "—") != "—" or r["variant"] not in walls):
            continue  # the report measured other processes' CPU use during the run and marks it contended
        # Marked by the load average alone, which counts the run's own threads too: the seeds'
        # agreement decides, as for unmarked runs.
        wall = seed_wall(walls[r["variant"]]) if r["variant"] in walls else number(r["wall time (s)"])
        if wall is None:
            continue
        fpt = number(r["FLOPs / target token"]) if r.get("FLOPs / target token") else None
        out.append({"variant": r["variant"], "steps": number(r["steps"]), "tokens": number(r["tokens trained"]),
                    "wall_s": wall, "tokens_per_s": number(r["tokens/s"].replace(CONTENDED, "")),
                    "mfu": number(r["MFU"]), "flops_per_token": fpt, "batch": mean_batch(r.get("mean batch")),
                    "threads": int(number(r["cores"])) if r.get("cores", "—") not in ("", "—") else None})
    return out


def pinned_report(report: Path) -> bool:
    """Whether the report's runs trained on the pinned products (fingerprint.json beside it says
    "products: openblas ..."; pipeline/cpu_numerics.py): their MFU divided by that kernel's peak."""
    try:
        numerics = json.loads((report.parent / "fingerprint.json").read_text()).get("cpu_numerics") or {}
    except (OSError, ValueError):
        return False
    return any("products: openblas" in str(v) for v in numerics.values())


def reference_peak(reports: list[Path]) -> float:
    """The CPU peak the committed runs divided by: the median FLOPs/token x tokens/s / MFU of the
    rows stating FLOPs per token, from runs on torch's own products where there are some (a pinned
    run's peak is the pinned kernel's, which day_speed reads as a slower machine)."""
    native = [r for r in reports if not pinned_report(r)]
    peaks = [r["flops_per_token"] * r["tokens_per_s"] / r["mfu"] for report in (native or reports)
             for r in measured_runs(report) if r["flops_per_token"]]
    if not peaks:
        raise PlanError(f"no committed report states FLOPs per target token ({', '.join(map(str, reports))})")
    return statistics.median(peaks)


@dataclass
class Point:
    """One measured variant: what the time model reads, and its wall."""
    study: str
    variant: str
    steps: float
    sublayers: int
    act_bytes: float  # saved activations of the mean batch
    flops: float
    wall_s: float
    split: float = 0.0  # of the multiply-adds, those in products shared among the run's threads (pinned)
    threads: int = 1


def report_params(report: Path):
    """The params.yaml that made `report`: beside it, else the workspace's one folder up; None if neither."""
    for path in (report.parent / "params.yaml", report.parent.parent / "params.yaml"):
        if path.is_file():
            return load_params(path)
    return None


BODY = ("attention", "ffn", "norms", "other")  # the parameter counts the vocabulary does not change


def parameter_counts(text: str) -> dict[str, dict[str, int]]:
    """{variant: {component: count}} from the report's parameter table."""
    return {r["variant"]: {k: int(number(r[k])) for k in (*BODY, "embeddings")}
            for r in markdown_table(text, "Parameters by component") if all(r.get(k) for k in (*BODY, "embeddings"))}


def matched_model(resolved: dict, params, variant: str, counts: dict | None):
    """(config, meta model) of a reported variant: its params, at the vocabulary its embedding count
    implies (a character vocabulary is known only from the data). None when the reported counts
    of the layers differ: the params.yaml found is not the one that made the report."""
    ids = tokenizer_ids(params, None)
    cfg, model = meta_model(resolved, ids, variant)
    if counts is None:
        return cfg, model
    have = model.param_counts()
    if any(have[k] != counts[k] for k in BODY):
        return None
    if have["embeddings"] != counts["embeddings"]:
        _, bigger = meta_model(resolved, {**ids, "vocab_size": ids["vocab_size"] + 1}, variant)
        vocab, rest = divmod(counts["embeddings"] - have["embeddings"],
                             bigger.param_counts()["embeddings"] - have["embeddings"])
        vocab += ids["vocab_size"]
        if rest or vocab <= max(ids["pad_id"], ids["bos_id"], ids["eos_id"]):
            return None
        cfg, model = meta_model(resolved, {**ids, "vocab_size": vocab}, variant)
    return cfg, model


def mean_batch(cell: str | None) -> tuple[float, float, float] | None:
    """'24.3 × (17.1 + 19)' -> (24.3, 17.1, 19.0); '12 × 64' -> (12.0, 0.0, 64.0); None if absent."""
    if not cell or cell == "—":
        return None
    nums = [float(x) for x in re.findall(r"[\d.]+(?:e[+-]?\d+)?", cell.replace(",", ""))]
    return (nums[0], nums[1], nums[2]) if len(nums) == 3 else (nums[0], 0.0, nums[1]) if len(nums) == 2 else None


# A report's own peak this far from the reference is not a machine speed but FLOPs counted another
# way: its walls are taken as they are. Days here moved -15% to +12%; a report counted another way
# reads 1.85x, so the top stays below that.
PLAUSIBLE_SPEED = (1 / 3, 1.5)


# Before the pinned products were shared among threads, a pinned run's peak was one thread's
# whatever its threads (0.35-0.49x torch's reference in the committed reports); after, at two
# threads, ~1.7x that (0.77-0.81x). Below this share of the reference a pinned peak is one thread's.
PINNED_ONE_THREAD = 0.6


def products_shared(report: Path, reference: float) -> bool:
    """Whether `report`'s pinned runs shared their larger products among threads: its peak was
    measured so (PINNED_ONE_THREAD); before, every product ran whole on one thread."""
    try:
        return pinned_report(report) and reference_peak([report]) > PINNED_ONE_THREAD * reference
    except PlanError:
        return False


def pinned_one_thread_peak(reports: list[Path]) -> float | None:
    """The pinned kernel's one-thread peak on the machines the committed pinned runs trained on (the
    median of the pinned reports' own peaks that were one thread's); None where none was."""
    reference = reference_peak(reports)
    peaks = []
    for report in reports:
        if pinned_report(report):
            with contextlib.suppress(PlanError):
                if (own := reference_peak([report])) <= PINNED_ONE_THREAD * reference:
                    peaks.append(own)
    return statistics.median(peaks) if peaks else None


def day_speed(report: Path, reference: float) -> float:
    """How fast the machine was when `report`'s runs trained: their own peak over `reference` (the
    fit's), 1 where the report gives none or an implausible one, or its runs were pinned.

    A pinned report's peak is the pinned kernel's at the run's threads, which changed meaning when
    the pinned products came to be shared among threads (one thread's peak before, ~1.7x that at
    two after: pipeline.training.device.cpu_peak_flops), while the studies' products stayed too
    small to share (pipeline/cpu_numerics.py's SHARE): as a speed it read 0.35-0.49 in the reports
    before and 0.77-0.81 after, and scaled by it, cnn_dailymail_cpu's loops were planned at 0.60x
    and multi30k_cpu's at 0.41x. Pinned runs are fitted to each other as measured instead
    (`calibrate`): 0.82-1.27x, each study planned by the others. A plan scales them to its
    machine by the pinned kernel's one-thread peak there (pinned_one_thread_peak)."""
    if pinned_report(report):
        return 1.0
    try:
        ratio = reference_peak([report]) / reference
    except PlanError:
        return 1.0
    return ratio if PLAUSIBLE_SPEED[0] <= ratio <= PLAUSIBLE_SPEED[1] else 1.0


def study_points(report: Path, reference: float | None = None) -> list[Point]:
    """The usable variants of one committed report, its walls scaled to a machine of peak
    `reference` (day_speed). A variant needs matching params, its mean batch and its FLOPs per
    token (for a language model, batch_size x context and the train stage's formula stand in)."""
    params = report_params(report)
    if params is None:
        return []
    text = report.read_text(encoding="utf-8")
    counts = parameter_counts(text)
    lm = task_of(params) == "language_modeling"
    speed = day_speed(report, reference) if reference else 1.0
    shares = bool(reference) and products_shared(report, reference)
    points = []
    for run in measured_runs(report):
        if run["variant"] not in params.ablations:
            continue
        resolved = resolve_variant(params, run["variant"])
        tcfg = resolved["train"]
        shape = run["batch"] or ((tcfg["batch_size"], 0.0, tcfg["context"]) if lm else None)
        if shape is None or (run["flops_per_token"] is None and not lm):
            continue
        matched = matched_model(resolved, params, run["variant"], counts.get(run["variant"]))
        if matched is None:
            continue
        cfg, model = matched
        fpt = run["flops_per_token"] or flops_per_target_token(model, cfg, 0.0, float(tcfg["context"]))
        threads = run["threads"] or 1
        split = shared_share(model, cfg, *mean_shape(cfg, shape), threads) if shares else 0.0
        points.append(Point(report.parent.name, run["variant"], run["steps"], sublayers(cfg),
                            activation_bytes(model, cfg, *mean_shape(cfg, shape), False), fpt * run["tokens"],
                            run["wall_s"] * speed, split, threads))
    return points


def fit(points: list[Point], peak: float, source: str, pinned: bool = False) -> Calibration:
    """Least squares on relative error over the three terms of the time model, none negative and
    the FLOPs never faster than the peak (MFU <= 1): tiny models alone could otherwise explain
    their walls without FLOPs, and a plan for a large model would then cost nothing."""
    import numpy as np
    from scipy.optimize import nnls

    if len(points) < 3:
        raise PlanError(f"{source}: fewer than three measured CPU runs to calibrate on")
    flops = [thread_flops(p.flops, p.split, p.threads) if pinned else p.flops for p in points]
    at_peak = np.array([f / peak / p.wall_s for f, p in zip(flops, points)])
    if np.any(at_peak >= 1):
        raise PlanError(f"{source}: a measured wall is shorter than its FLOPs at the peak ({peak:.3g} FLOP/s)")
    a = np.array([[p.steps * p.sublayers / p.wall_s, p.steps * p.act_bytes / p.wall_s, f / peak / p.wall_s]
                  for f, p in zip(flops, points)])
    (per_sublayer, per_byte, slower), _ = nnls(a, 1 - at_peak)  # 1 / MFU = 1 + slower
    return Calibration(float(1 / (1 + slower)), float(per_sublayer),
                       float(1 / per_byte) if per_byte > 0 else float("inf"), len(points), source, peak, pinned)


def calibrate(reports: list[Path], pinned: bool = False) -> Calibration:
    """The CPU time model of runs on the pinned products (`pinned`) or torch's own, fitted to the
    usable runs of `reports` (report.md files) that trained on them; to every usable run where
    fewer than three did. The two differ in every term: torch's own products take their threads
    (MKL), the pinned ones one thread a product at the studies' sizes, and pinned runs also write
    out attention (pipeline/cpu_numerics.py)."""
    if not reports:
        raise PlanError("no committed report.md to calibrate the CPU time on (see --calibration)")
    peak = reference_peak(reports)
    same = [r for r in reports if pinned_report(r) == pinned]
    points = [p for report in same for p in study_points(report, peak)]
    kind = "pinned" if pinned else "torch's own products"
    if len(points) >= 3:
        return fit(points, peak, f"{len(points)} variants of {len({p.study for p in points})} committed CPU "
                                 f"studies ({kind})", pinned)
    points = [p for report in reports for p in study_points(report, peak)]
    return fit(points, peak, f"{len(points)} variants of {len({p.study for p in points})} committed CPU studies "
                             f"(too few {kind} alone)", pinned)
