"""`python -m pipeline.plan`: what params.yaml will cost, known before `dvc repro` spends it.

    python -m pipeline.plan                          # this machine's CPU
    python -m pipeline.plan --device h100 --mfu 0.4  # or a100 | 4090: datasheet peak x MFU
    python -m pipeline.plan --params presets/tinystories.yaml --device 4090 --json

Not a DVC stage: it reads params.yaml (and, where they exist, the encode stage's manifest and the
committed study reports) and writes nothing. Per variant (and scale point) and in total it prints
parameters, training FLOPs per target token, target tokens and runs, the estimated wall time and
each run's peak memory against the device's.

Design decisions:
- Every model is built by the train stage's own code (`resolve_variant`, `model_config`,
  `build_model`) on the meta device: parameter counts are the real ones, and no weight is allocated.
- FLOPs are the train stage's formula (`pipeline.train.flops_per_target_token`).
- Activation memory is not a formula: one forward pass on the meta device at the configured batch
  shape, with autograd's saved-tensor hook summing every tensor kept for the backward pass.
- GPU time: FLOPs / (datasheet bf16 peak in pipeline.training.device x --mfu, default 0.35).
  CPU time: small models on a CPU are bound by a fixed cost per optimizer step as much as by
  FLOPs, so wall = steps x per-step cost + FLOPs / (this CPU's cached peak x MFU), both fitted to
  the wall times of committed CPU studies (reports/**/report.md, whose cost tables the report stage
  writes from each run's train.json).
- Not included: the data stages and the evaluate stage (its decoding cost depends on what the
  model generates); the train stage's own validation passes are in the measured CPU walls only.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from pipeline.params import Params, ParamsError, load_params, model_config, read_yaml, resolve_variant
from pipeline.train import flops_budget_tokens, flops_per_target_token

# --device: (name in device.GPU_PEAK_BF16, memory in bytes from the vendor's data sheet).
GPUS = {"h100": ("H100", 80 * 10**9), "a100": ("A100", 80 * 10**9), "4090": ("4090", 24 * 10**9)}
DEFAULT_MFU = 0.35  # a well-tuned bf16 training step on one GPU reaches 35-50% (PaLM, nanoGPT)
ADAM_BYTES = 8  # AdamW keeps two fp32 moments per parameter


class PlanError(ValueError):
    """A bad argument or file; its message names it."""


@dataclass
class Calibration:
    """CPU time model: wall = steps x step_s + FLOPs / (peak x mfu), fitted to measured runs."""
    step_s: float
    mfu: float
    runs: int  # variant rows (means over seeds) the fit used
    source: str


@dataclass
class Row:
    """One model configuration: a variant, or a variant at one point of `scales`."""
    variant: str
    scale: str | None
    params: int
    flops_per_token: float
    tokens_per_run: int
    steps_per_run: int
    runs: int
    seconds_per_run: float
    memory: dict  # bytes: weights, gradients, adamw, activations, total
    fits: bool


def gpu_peak(name: str) -> float:
    from pipeline.training.device import GPU_PEAK_BF16

    return GPU_PEAK_BF16[name]


def ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def read_manifest(shards: Path) -> dict | None:
    path = shards / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else None


def tokenizer_ids(params: Params, manifest: dict | None) -> dict:
    """The ids a ModelConfig takes from the tokenizer: the encoded data's if there is some, else
    train_bpe's settings (for a char model its vocab_size is the stated upper bound)."""
    if manifest is not None:
        return {k: manifest[k] for k in ("vocab_size", "pad_id", "bos_id", "eos_id")}
    tok = params.train_bpe
    return {"vocab_size": tok.vocab_size, "pad_id": tok.pad_id, "bos_id": tok.bos_id, "eos_id": tok.eos_id}


def lengths(params: Params, manifest: dict | None, lm: bool, context: int) -> tuple[float, float, int, int, str]:
    """(mean source, mean target, longest source, longest target, where they come from): the means
    set FLOPs per token as the train stage counts them, the longest the batch that peaks memory."""
    if lm:
        return 0.0, float(context), 0, context, "language modelling: train.context"
    f, cap = params.filter, params.encode.max_source_tokens
    longest_src = min(cap, f.max_source_tokens) if cap else f.max_source_tokens
    longest_tgt = f.max_target_tokens + 1  # + BOS (input) / EOS (label)
    if manifest is not None:
        split = manifest["splits"]["train"]
        n = max(1, split["examples"])
        return (split["src_tokens"] / n, split["tgt_tokens"] / n + 1, longest_src, longest_tgt,
                "means of the encoded training split (manifest.json); longest at the filter's limits")
    return (float(longest_src), float(longest_tgt), longest_src, longest_tgt,
            "no encoded data yet (no manifest.json in --shards): every example at the filter's limits, a "
            "pre-token or character counted as one token (a rough guess: run the encode stage for the real means)")


def meta_model(resolved: dict, ids: dict, where: str):
    from model import build_model

    cfg = model_config(resolved["model"], ids, where)
    with torch.device("meta"):
        return cfg, build_model(cfg)


def activation_bytes(model, cfg, rows: int, src_len: int, tgt_len: int, bf16: bool) -> int:
    """Bytes autograd keeps for the backward pass of one batch (a forward pass on the meta device).

    Views count once (by their base tensor); parameters are counted as weights, not here. bf16
    autocast halves the floating-point activations (an approximation: it keeps norms and softmax
    statistics in fp32)."""
    seen: dict[int, torch.Tensor] = {}
    weights = {id(p) for p in model.parameters()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if id(base) not in weights:
            seen[id(base)] = base
        return t

    if cfg.arch != "encoder_decoder":  # one packed sequence; packing reads lengths, which meta cannot
        src_len, tgt_len = 0, src_len + tgt_len  # (logits at source positions too: a slight overcount)
    src = torch.ones(rows, src_len, dtype=torch.long, device="meta") if src_len else None
    tgt = torch.ones(rows, tgt_len, dtype=torch.long, device="meta")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(src, tgt, tgt)
    total = 0
    for t in seen.values():
        size = t.element_size() // 2 if bf16 and t.is_floating_point() else t.element_size()
        total += t.numel() * size
    return total


def memory(model, cfg, tcfg: dict, longest: tuple[int, int], lm: bool, bf16: bool) -> dict:
    """Peak bytes of one run: fp32 weights, their gradients, AdamW's moments, the largest batch's
    activations (and under bf16 autocast the weights' bf16 copies)."""
    n = model.param_counts()["total"]
    if lm:
        rows, src_len, tgt_len = tcfg["batch_size"], 0, tcfg["context"]
    else:  # a batch holds up to batch_tokens padded tokens; the longest examples make the largest
        src_len, tgt_len = longest
        rows = max(1, tcfg["batch_tokens"] // (src_len + tgt_len))
    out = {"weights": 4 * n, "gradients": 4 * n, "adamw": ADAM_BYTES * n,
           "bf16_weight_copies": 2 * n if bf16 else 0,
           "activations": activation_bytes(model, cfg, rows, src_len, tgt_len, bf16),
           "batch": f"{rows} x ({src_len} + {tgt_len}) tokens" if not lm else f"{rows} x {tgt_len} tokens"}
    out["total"] = sum(v for v in out.values() if isinstance(v, int))
    return out


def tokens_and_steps(tcfg: dict, per_token: float, mean_src: float, mean_tgt: float, lm: bool) -> tuple[int, int]:
    """(target tokens, optimizer steps) of one run, as the train stage's budget decides them."""
    per_batch = tcfg["batch_size"] * tcfg["context"] if lm else \
        tcfg["batch_tokens"] * mean_tgt / (mean_src + mean_tgt)  # padding ignored: steps are a floor
    per_step = per_batch * tcfg["grad_accum"]
    if tcfg["budget_steps"] is not None:
        return int(tcfg["budget_steps"] * per_step), tcfg["budget_steps"]
    tokens = flops_budget_tokens(tcfg["budget_flops"], per_token) if tcfg["budget_flops"] is not None \
        else tcfg["budget_tokens"]
    return tokens, max(1, math.ceil(tokens / per_step))


def task_of(params: Params) -> str:
    from pipeline.preset import source_task

    return source_task(params)


def plan(params: Params, manifest: dict | None, device: str, mfu: float, calibration: Calibration | None,
         peak: float, capacity: int, host_step_s: float = 0.0) -> tuple[list[Row], str]:
    """One Row per variant and scale point, and where the sequence lengths come from.

    CPU (`calibration` given): steps x per-step cost + FLOPs / (peak x MFU). GPU: the GPU works while
    the host prepares the next launches, so a step takes the longer of its FLOPs at peak x `mfu` and
    `host_step_s`, the host's own work per step (the CPU fit's per-step cost)."""
    lm = task_of(params) == "language_modeling"
    ids = tokenizer_ids(params, manifest)
    bf16 = device != "cpu"  # the train stage autocasts to bf16 on CUDA only
    rows, why = [], ""
    per_point = len(params.seeds) * (1 + len(params.lr_sweep))  # the lr points train the same model
    for scale in (None, *params.scales):
        for variant in params.ablations:
            where = f"ablations.{variant}" + (f" at scales.{scale}" if scale else "")
            resolved = resolve_variant(params, variant, scale)
            tcfg = resolved["train"]
            mean_src, mean_tgt, longest_src, longest_tgt, why = lengths(params, manifest, lm, tcfg["context"])
            cfg, model = meta_model(resolved, ids, where)
            per_token = flops_per_target_token(model, cfg, mean_src, mean_tgt)
            tokens, steps = tokens_and_steps(tcfg, per_token, mean_src, mean_tgt, lm)
            flops = per_token * tokens
            if calibration is not None:
                seconds = steps * calibration.step_s + flops / (peak * calibration.mfu)
            else:
                seconds = max(flops / (peak * mfu), steps * host_step_s)
            mem = memory(model, cfg, tcfg, (longest_src, longest_tgt), lm, bf16)
            rows.append(Row(variant, scale, model.param_counts()["total"], per_token, tokens, steps,
                            per_point if scale is None else len(params.seeds), seconds, mem,
                            mem["total"] <= capacity))
    return rows, why


# --- CPU calibration: the committed studies' measured walls -------------------------------------

# Seeds of one variant do the same work, so their walls should agree. Where other jobs shared the
# cores during a run they do not (the default study's committed per-run table has one configuration
# at 5.6 s and at 68 s): a variant's wall is the median of its seeds' when another seed agrees with
# it within this fraction, and the variant is left out when none does (it measured the load).
SEED_AGREEMENT = 0.10


def seed_wall(walls: list[float]) -> float | None:
    """The median of one variant's per-seed walls if another seed confirms it, else None."""
    import statistics

    if len(walls) < 2:
        return walls[0] if walls else None
    mid = statistics.median_low(walls)
    others = list(walls)
    others.remove(mid)
    return mid if any(abs(w - mid) <= SEED_AGREEMENT * mid for w in others) else None


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
    """'120,072–120,142' -> 120072 (the low end of a range), '2.48e+06' -> 2480000.0."""
    return float(cell.replace(",", "").split("–")[0])


def measured_runs(report: Path) -> list[dict]:
    """The variants of one committed report as its training-cost table gives them: steps, tokens,
    tokens/s, MFU, FLOPs per token where the table has the column, and the wall (`seed_wall` of
    the per-run table where there is one, else the mean over seeds)."""
    text = report.read_text(encoding="utf-8")
    walls: dict[str, list[float]] = {}
    for r in markdown_table(text, "Per-run values"):
        if r.get("wall time (s)"):
            walls.setdefault(r["variant"], []).append(number(r["wall time (s)"]))
    out = []
    for r in markdown_table(text, "Training cost"):
        if not r.get("device", "").startswith("cpu") or r.get("MFU") in (None, "—", ""):
            continue
        wall = seed_wall(walls[r["variant"]]) if r["variant"] in walls else number(r["wall time (s)"])
        if wall is None:
            continue
        fpt = number(r["FLOPs / target token"]) if r.get("FLOPs / target token") else None
        out.append({"variant": r["variant"], "steps": number(r["steps"]), "tokens": number(r["tokens trained"]),
                    "wall_s": wall, "tokens_per_s": number(r["tokens/s"]),
                    "mfu": number(r["MFU"]), "flops_per_token": fpt})
    return out


def reference_peak(reports: list[Path]) -> float:
    """The CPU peak the committed runs divided by: FLOPs/token x tokens/s / MFU of the rows whose
    table states FLOPs per token (the median: one number per machine, cached by the train stage)."""
    import statistics

    peaks = [r["flops_per_token"] * r["tokens_per_s"] / r["mfu"] for report in reports
             for r in measured_runs(report) if r["flops_per_token"]]
    if not peaks:
        raise PlanError(f"no committed report states FLOPs per target token ({', '.join(map(str, reports))})")
    return statistics.median(peaks)


def study_points(report: Path) -> list[tuple[float, float, float]]:
    """(steps, training FLOPs, wall s) for each usable variant of one committed report.

    A table without FLOPs per token (reports older than that column) gets them from the params.yaml
    beside it where that needs no data (language modelling); seq2seq rows without them are skipped."""
    points, params = [], None
    for run in measured_runs(report):
        fpt = run["flops_per_token"]
        if fpt is None:
            if params is None:
                path = report.parent / "params.yaml"
                params = load_params(path) if path.is_file() else False
            if not params or task_of(params) != "language_modeling":
                continue
            resolved = resolve_variant(params, run["variant"])
            cfg, model = meta_model(resolved, tokenizer_ids(params, None), run["variant"])
            fpt = flops_per_target_token(model, cfg, 0.0, float(resolved["train"]["context"]))
        points.append((run["steps"], fpt * run["tokens"], run["wall_s"]))
    return points


def fit(points: list[tuple[float, float, float]], peak: float, source: str) -> Calibration:
    """Least squares on relative error: wall ~ steps x step_s + FLOPs / (peak x mfu)."""
    import numpy as np

    if len(points) < 2:
        raise PlanError(f"{source}: fewer than two measured CPU runs to calibrate on")
    a = np.array([[s / w, f / peak / w] for s, f, w in points])
    (step_s, inv_mfu), *_ = np.linalg.lstsq(a, np.ones(len(points)), rcond=None)
    if step_s < 0 or inv_mfu <= 0:  # not physical: keep the FLOPs term alone
        step_s, inv_mfu = 0.0, float(np.mean([w * peak / f for _, f, w in points]))
    return Calibration(float(step_s), float(1 / inv_mfu), len(points), source)


def calibrate(reports: list[Path]) -> Calibration:
    """The CPU time model fitted to every usable run of `reports` (report.md files)."""
    if not reports:
        raise PlanError("no committed report.md to calibrate the CPU time on (see --calibration)")
    points = [p for report in reports for p in study_points(report)]
    return fit(points, reference_peak(reports), f"{len(points)} variants of {len(reports)} committed CPU studies")


# --- output ---------------------------------------------------------------------------------------

def fmt_bytes(n: float) -> str:
    for scale, name in ((10**9, "GB"), (10**6, "MB"), (10**3, "kB")):
        if n >= scale:
            return f"{n / scale:.3g} {name}"
    return f"{n:.0f} B"


def fmt_time(s: float) -> str:
    if s < 90:
        return f"{s:.3g} s"
    if s < 5400:
        return f"{s / 60:.3g} min"
    return f"{s / 3600:.3g} h"


def device_facts(device: str, mfu: float | None, reports: list[Path], cpu_peak: str = "measured") -> dict:
    """Peak FLOP/s, memory, and the time model of `device` (cpu: calibrated on `reports`; its peak
    measured here and cached, or with cpu_peak="studies" the one the committed studies' runs used)."""
    if device == "cpu":
        from pipeline.training.device import _cpu_model, cpu_peak_flops

        cal = calibrate(reports)
        if cpu_peak == "studies":
            peak, source = reference_peak(reports), "the peak the committed studies' runs divided by (their machine)"
        else:
            peak, source = cpu_peak_flops()
        if mfu is not None:
            cal.mfu, cal.source = mfu, f"MFU {mfu} given (--mfu); per-step cost from {cal.source}"
        return {"device": f"cpu ({_cpu_model()}, {torch.get_num_threads()} threads)", "peak_flops": peak,
                "peak_source": source, "memory_bytes": ram_bytes(), "memory_source": "this machine's RAM",
                "calibration": cal, "mfu": cal.mfu}
    name, memory_bytes = GPUS[device]
    mfu = DEFAULT_MFU if mfu is None else mfu
    try:  # no GPU run has been measured: the host's per-step work comes from the CPU studies' fit
        host = calibrate(reports)
    except PlanError:
        host = None
    return {"device": f"one {name}", "peak_flops": gpu_peak(name),
            "peak_source": f"datasheet bf16 dense peak of the {name} (pipeline.training.device)",
            "memory_bytes": memory_bytes, "memory_source": f"the {name}'s data sheet",
            "calibration": None, "mfu": mfu, "host_step_s": host.step_s if host else 0.0,
            "host_source": host.source if host else "none (no committed CPU study found)"}


def table(rows: list[Row], facts: dict) -> str:
    head = ["variant", "parameters", "FLOPs / target token", "target tokens / run", "steps / run", "runs",
            "time / run", "time, all runs", "peak memory / run (weights + grads + AdamW + activations)",
            f"fits in {fmt_bytes(facts['memory_bytes'])}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        m = r.memory
        mem = (f"{fmt_bytes(m['total'])} ({fmt_bytes(m['weights'])} + {fmt_bytes(m['gradients'])} + "
               f"{fmt_bytes(m['adamw'])} + {fmt_bytes(m['activations'])}"
               + (f" + bf16 copies {fmt_bytes(m['bf16_weight_copies'])}" if m["bf16_weight_copies"] else "") + ")")
        name = r.variant + (f" @ {r.scale}" if r.scale else "")
        lines.append(f"| {name} | {r.params:,} | {r.flops_per_token:.3g} | {r.tokens_per_run:,} | "
                     f"{r.steps_per_run:,} | {r.runs} | {fmt_time(r.seconds_per_run)} | "
                     f"{fmt_time(r.seconds_per_run * r.runs)} | {mem} | {'yes' if r.fits else '**NO**'} |")
    runs = sum(r.runs for r in rows)
    lines.append(f"| **total** | | | {sum(r.tokens_per_run * r.runs for r in rows):,} | | {runs} | | "
                 f"**{fmt_time(sum(r.seconds_per_run * r.runs for r in rows))}** | | |")
    return "\n".join(lines)


def report_text(params_path: Path, rows: list[Row], facts: dict, lengths_source: str) -> str:
    cal = facts["calibration"]
    if cal is not None:
        model = (f"time = steps x {cal.step_s * 1000:.3g} ms + FLOPs / (peak x MFU {cal.mfu:.3g}), "
                 f"fitted to {cal.source}")
    else:
        model = (f"time per step = the longer of FLOPs / (peak x MFU {facts['mfu']:g}"
                 f"{' (default)' if facts['mfu'] == DEFAULT_MFU else ''}) and the host's "
                 f"{facts['host_step_s'] * 1000:.3g} ms of work per step (the per-step cost fitted to "
                 f"{facts['host_source']})")
    out = [f"Plan for {params_path} on {facts['device']}: peak {facts['peak_flops']:.3g} FLOP/s "
           f"({facts['peak_source']}); {model}.",
           f"Sequence lengths: {lengths_source}.", "", table(rows, facts), "",
           "Time is training only, one run after another on one device (data stages and the evaluate "
           "stage are not included). Memory: fp32 weights, gradients and AdamW's two moments, plus the "
           "activations of the largest batch (" + rows[0].memory["batch"] + " for the first row), "
           + ("bf16 autocast as on CUDA." if facts["calibration"] is None else "float32 as on CPU.")]
    if cal is None:
        out.append("No GPU run has been measured here: the MFU is an assumption (--mfu), and the host's "
                   "per-step cost is the CPU studies' (a GPU machine's host may be faster or slower).")
    if "no encoded data" in lengths_source:
        out.append("For the real sequence lengths, run `dvc repro encode` (the data stages only) and plan again.")
    for r in rows:
        if not r.fits:
            out.append(f"CANNOT FIT: {r.variant}{' @ ' + r.scale if r.scale else ''} needs "
                       f"{fmt_bytes(r.memory['total'])} per run, the device has {fmt_bytes(facts['memory_bytes'])} "
                       f"({facts['memory_source']}); lower train.batch_tokens / train.batch_size or the model size.")
    return "\n".join(out)


def brief(params_path: Path, rows: list[Row], facts: dict, lm: bool, has_manifest: bool) -> str:
    """One line: runs, time per run (range) and in all, the largest run's memory and whether it fits."""
    per_run = sorted(r.seconds_per_run for r in rows)
    span = fmt_time(per_run[0]) + ("" if fmt_time(per_run[-1]) == fmt_time(per_run[0]) else f"-{fmt_time(per_run[-1])}")
    biggest = max(rows, key=lambda r: r.memory["total"])
    cal = facts["calibration"]
    how = (f"MFU {facts['mfu']:.2g} + {cal.step_s * 1000:.2g} ms/step, fitted" if cal else
           f"MFU {facts['mfu']:.2g}, at least {facts['host_step_s'] * 1000:.2g} ms/step")
    guess = "" if lm or has_manifest else "; seq2seq lengths at the filter's limits (rough until encode has run)"
    fits = "fits" if all(r.fits for r in rows) else "DOES NOT FIT"
    return (f"{params_path}: {sum(r.runs for r in rows)} runs on {facts['device']} ({facts['peak_flops']:.3g} FLOP/s "
            f"x {how}): {span} each, {fmt_time(sum(r.seconds_per_run * r.runs for r in rows))} in all; peak memory "
            f"{fmt_bytes(biggest.memory['total'])} per run of {fmt_bytes(facts['memory_bytes'])} ({fits}){guess}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--device", default="cpu", help=f"{' | '.join(GPUS)} | cpu (default: cpu, this machine)")
    parser.add_argument("--mfu", type=float, help=f"model FLOPs utilisation (GPU default {DEFAULT_MFU}; "
                        "CPU default: fitted to the committed studies)")
    parser.add_argument("--shards", type=Path, default=Path("data/shards"),
                        help="the encode stage's output: its manifest gives the vocabulary and sequence lengths")
    parser.add_argument("--calibration", type=Path, default=Path("reports"),
                        help="committed CPU study reports (every report.md below this folder) the CPU time is fitted to")
    parser.add_argument("--cpu-peak", choices=("measured", "studies"), default="measured",
                        help="cpu: this machine's float32 peak (measured once, cached), or the one the committed "
                        "studies ran at (their machine; a measurement on a busy machine reads low)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    parser.add_argument("--brief", action="store_true", help="one line: runs, time, memory (the README's lines)")
    args = parser.parse_args(argv)
    try:
        if args.device not in (*GPUS, "cpu"):
            raise PlanError(f"--device: unknown device {args.device!r} (choose {', '.join(GPUS)} or cpu)")
        if args.mfu is not None and not 0 < args.mfu <= 1:
            raise PlanError(f"--mfu: {args.mfu:g} is not a fraction in (0, 1]")
        params = load_params(args.params)
        reports = sorted(args.calibration.rglob("report.md"))
        facts = device_facts(args.device, args.mfu, reports, args.cpu_peak)
        manifest = read_manifest(args.shards)
        rows, why = plan(params, manifest, args.device, facts["mfu"], facts["calibration"],
                         facts["peak_flops"], facts["memory_bytes"], facts.get("host_step_s", 0.0))
    except (ParamsError, PlanError, OSError) as exc:
        raise SystemExit(f"plan: {str(exc).strip().splitlines()[0]}") from None
    if args.json:
        cal = facts["calibration"]
        print(json.dumps({"params": str(args.params), **{k: v for k, v in facts.items() if k != "calibration"},
                          "calibration": asdict(cal) if cal else None, "lengths": why,
                          "rows": [asdict(r) for r in rows],
                          "total": {"runs": sum(r.runs for r in rows),
                                    "seconds": sum(r.seconds_per_run * r.runs for r in rows),
                                    "all_fit": all(r.fits for r in rows)}}, indent=2))
    elif args.brief:
        print(brief(args.params, rows, facts, why.startswith("language"), manifest is not None))
    else:
        print(report_text(args.params, rows, facts, why))


if __name__ == "__main__":
    main()
