"""`python -m pipeline.plan`: what params.yaml will cost, known before `dvc repro` spends it.

    python -m pipeline.plan                          # this machine's CPU
    python -m pipeline.plan --device h100 --mfu 0.4  # or a100 | 4090: datasheet peak x MFU
    python -m pipeline.plan --params presets/tinystories.yaml --device 4090 --json
    python -m pipeline.plan --jobs 2                 # the study's wall with two stages at a time
    python -m pipeline.plan --cold                   # ... each stage a new process (ABLATION_LAB_WARM=0)

Not a DVC stage: it reads params.yaml (and, where they exist, the encode stage's manifest and the
committed study reports) and writes nothing. What it prints and how each figure is modelled:
docs/scaling-out-and-cost-plan.md#know-the-cost-first; per run pipeline/planning/estimate.py (the
CPU fit in calibration.py), per study pipeline/planning/study.py. The train stage's own validation
passes are in the measured CPU walls only.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

import torch

from pipeline.params import load_params
from pipeline.planning.calibration import Calibration, calibrate, pinned_one_thread_peak, reference_peak
from pipeline.planning.estimate import PlanError, Row, cpu_cores, plan, ram_bytes, read_manifest
from pipeline.planning.study import decide_bounds, families, fit_costs, loop_slowdown, rounds_wall, study_stages

# --device: (name in device.GPU_PEAK_BF16, memory in bytes from the vendor's data sheet).
GPUS = {"h100": ("H100", 80 * 10**9), "a100": ("A100", 80 * 10**9), "4090": ("4090", 24 * 10**9)}
DEFAULT_MFU = 0.35  # well-tuned bf16 training reports 35-50% (PaLM: 46%)


def gpu_peak(name: str) -> float:
    from pipeline.training.device import GPU_PEAK_BF16

    return GPU_PEAK_BF16[name]


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
    """Peak FLOP/s, memory and the time model (`time`, a Calibration) of `device`. cpu: fitted to
    `reports`' runs on the products the runs here will train on; torch's own scaled by the peak
    measured here once and cached (cpu_peak="studies": the committed runs'), the pinned by the
    pinned kernel's one-thread peak here against the committed pinned runs' machines'.
    GPU: the datasheet peak x `mfu`; no GPU run is measured, so the host's cost is the CPU fit's."""
    if device == "cpu":
        from pipeline import cpu_numerics
        from pipeline.training.device import _cpu_model, cpu_peak_flops

        pinned = cpu_numerics.engage()  # whether the runs will train on the pinned products
        cal = calibrate(reports, pinned)
        if pinned:
            # Scaled by the pinned kernel's one-thread peak, here against the committed runs'
            # machines' (calibration.day_speed says why not by the peak at the runs' threads).
            peak, source = cal.peak, ("pinned products (pipeline/cpu_numerics.py): the committed pinned studies' "
                                      "machines, not scaled to this one (none of their reports gives one thread's peak)")
            committed = pinned_one_thread_peak(reports)
            if committed:
                threads = torch.get_num_threads()
                torch.set_num_threads(1)
                try:
                    here, _ = cpu_peak_flops()
                finally:
                    torch.set_num_threads(threads)
                peak = cal.peak * here / committed
                source = (f"the committed pinned runs' time model scaled to this machine: the pinned products' "
                          f"one-thread peak {here:.3g} FLOP/s here against {committed:.3g} where they ran "
                          "(pipeline/cpu_numerics.py)")
        elif cpu_peak == "studies":
            peak, source = reference_peak(reports), "the peak the committed studies' runs divided by (their machine)"
        else:
            peak, source = cpu_peak_flops()
        return {"device": f"cpu ({_cpu_model()}, {torch.get_num_threads()} threads)", "peak_flops": peak,
                "pinned": pinned, "peak_source": source,
                "memory_bytes": ram_bytes(), "memory_source": "this machine's RAM",
                "time": cal if mfu is None else replace(cal, mfu=mfu),
                "time_source": (f"MFU {mfu} given (--mfu), " if mfu is not None else "") + f"fitted to {cal.source}"}
    name, memory_bytes = GPUS[device]
    try:
        host = calibrate(reports)  # the host's work per sublayer: a GPU run's CPU side is torch's own
    except PlanError:
        host = None
    mfu = DEFAULT_MFU if mfu is None else mfu
    return {"device": f"one {name}", "peak_flops": gpu_peak(name),
            "peak_source": f"datasheet bf16 dense peak of the {name} (pipeline.training.device)",
            "memory_bytes": memory_bytes, "memory_source": f"the {name}'s data sheet",
            "time": replace(host, mfu=mfu) if host else Calibration(mfu, 0.0, float("inf"), 0, "none"),
            "time_source": (f"MFU {'default' if mfu == DEFAULT_MFU else 'given (--mfu)'}; host cost per sublayer "
                            f"fitted to {host.source}" if host else "no committed CPU study found: FLOPs only")}


def timing(time: Calibration) -> dict:
    """The time model as JSON (no rate where the fit has no activation term)."""
    out = asdict(time)
    out["bytes_per_s"] = None if out["bytes_per_s"] == float("inf") else out["bytes_per_s"]
    return out


def table(rows: list[Row], facts: dict) -> str:
    head = ["variant", "parameters", "FLOPs / target token", "target tokens / run", "steps / run", "runs",
            "time / run", "time, all runs", "peak memory / run (weights + grads + AdamW + activations + logits' grad)",
            f"fits in {fmt_bytes(facts['memory_bytes'])}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        m = r.memory
        mem = (f"{fmt_bytes(m['total'])} ({fmt_bytes(m['weights'])} + {fmt_bytes(m['gradients'])} + "
               f"{fmt_bytes(m['adamw'])} + {fmt_bytes(m['activations'])} + {fmt_bytes(m['logits_gradient'])}"
               + (f" + bf16 copies {fmt_bytes(m['bf16_weight_copies'])}" if m["bf16_weight_copies"] else "") + ")")
        name = r.variant + (f" @ {r.scale}" if r.scale else "")
        lines.append(f"| {name} | {r.params:,} | {r.flops_per_token:.3g} | {r.tokens_per_run:,} | "
                     f"{r.steps_per_run:,} | {r.runs} | {fmt_time(r.seconds_per_run)} | "
                     f"{fmt_time(r.seconds_per_run * r.runs)} | {mem} | {'yes' if r.fits else '**NO**'} |")
    runs = sum(r.runs for r in rows)
    lines.append(f"| **total** | | | {sum(r.tokens_per_run * r.runs for r in rows):,} | | {runs} | | "
                 f"**{fmt_time(sum(r.seconds_per_run * r.runs for r in rows))}** | | |")
    return "\n".join(lines)


def study_wall(params, rows: list[Row], facts: dict, calibration: Path, jobs: int, warm: bool = True) -> dict:
    """The study's stages timed and scheduled on `jobs` slots (planning/study.py), warm or cold;
    {"error": why} where no committed study timed its stages."""
    try:
        costs = fit_costs(sorted(p.parent for p in calibration.rglob("run.json")), warm)
    except PlanError as exc:
        return {"error": str(exc)}
    loops = {(r.variant, r.scale): r.seconds_per_run for r in rows}
    cpu = facts["device"].startswith("cpu")
    slowdown = {(r.variant, r.scale): loop_slowdown(jobs, params.train.threads, cpu_cores(), r.parallel_share)
                if cpu else 1.0 for r in rows}
    serial = study_stages(params, loops, costs)
    stages = study_stages(params, loops, costs, slowdown)
    note = "" if facts["device"].startswith("cpu") else (
        " The stage costs are CPU studies' (no GPU study has timed its stages yet): a GPU's CUDA start-up and "
        "a GPU host's CPU speed are not in them, and --jobs stages are assumed not to slow each other's loops.")
    out = {"jobs": jobs, "warm": warm, "wall_s": rounds_wall(stages, params, jobs),
           "serial_s": rounds_wall(serial, params, 1),
           "stages": len(stages), "loop_slowdown": max(slowdown.values(), default=1.0),
           "loop_slowdown_least": min(slowdown.values(), default=1.0), "families": families(serial), "costs": asdict(costs),
           "costs_source": costs.describe(), "note": note}
    if bounds := decide_bounds(params):  # seeds until decided: what the rounds can cost, both ends
        out["decide"] = {"budget_seeds": params.decide.looks[-1], **{
            end: rounds_wall(study_stages(p, loops, costs, slowdown), p, jobs)
            for end, p in zip(("first_look_s", "budget_s"), bounds)}}
    return out


def study_text(study: dict) -> str:
    if "error" in study:
        return f"Study wall: not predicted ({study['error']})."
    fam = study["families"]
    parts = [f"training loops {fmt_time(fam['train']['loop_seconds'])}",
             f"train stages' fixed cost {fmt_time(fam['train']['seconds'] - fam['train']['loop_seconds'])}"]
    parts += [f"{name} {fam[name]['stages']} x {fmt_time(fam[name]['seconds'] / fam[name]['stages'])}"
              for name in ("evaluate", "knockout", "data", "report") if name in fam]
    how = "warm starts (the grid launcher, a plain `dvc repro`)" if study["warm"] else "cold (each stage a new process)"
    line = (f"Study wall: **{fmt_time(study['wall_s'])}** at --jobs {study['jobs']}, {how} "
            f"({study['stages']} stages; serial: {fmt_time(study['serial_s'])} = {', '.join(parts)})")
    if study["loop_slowdown"] > 1:
        low, high = study["loop_slowdown_least"], study["loop_slowdown"]
        span = f"x{high:.2g}" if f"{low:.2g}" == f"{high:.2g}" else f"x{low:.2g} to x{high:.2g}"
        line += (f"; {study['jobs']} stages at a time share the cores: each training loop {span} (the part of it "
                 "its threads split takes as much longer as each has fewer)")
    if "decide" in study:
        d = study["decide"]
        line += (f". Seeds until decided: from {fmt_time(d['first_look_s'])} (every variant at the first look) to "
                 f"{fmt_time(d['budget_s'])} (every variant at the budget of {d['budget_seeds']} seeds); the wall above "
                 "is the rounds run so far (decide.runs)")
    return line + f". Stage costs: {study['costs_source']}.{study['note']}"


def report_text(params_path: Path, rows: list[Row], facts: dict, lengths_source: str) -> str:
    cpu = facts["device"].startswith("cpu")
    time = facts["time"]
    if cpu:
        model = f"time = {time.describe()}"
    else:
        model = (f"time per step = the longer of FLOPs / (peak x MFU {time.mfu:.3g}) and the host's "
                 f"{time.sublayer_s * 1000:.3g} ms of work per sublayer")
    model += f" ({facts['time_source']})"
    out = [f"Plan for {params_path} on {facts['device']}: peak {facts['peak_flops']:.3g} FLOP/s "
           f"({facts['peak_source']}); {model}.",
           f"Sequence lengths: {lengths_source}.", "", table(rows, facts), "",
           "Time per run is the training loop, one run after another on one device; the study line below "
           "adds every stage's fixed cost, evaluation and knock-outs. Memory: fp32 weights, gradients and AdamW's two moments, plus the "
           "activations of the largest batch (" + rows[0].memory["batch"] + " for the first row) and the "
           "fp32 gradient of its logits (backward's other transients are not counted: leave headroom), "
           + ("float32 as on CPU." if cpu else "bf16 autocast as on CUDA.")]
    if not cpu:
        out.append("No GPU run has been measured here: the MFU is an assumption (--mfu), and the host's "
                   "per-sublayer cost is the CPU studies' (a GPU machine's host may be faster or slower).")
    if "no encoded data" in lengths_source:
        out.append("For the real sequence lengths, run `dvc repro encode` (the data stages only) and plan again.")
    for r in rows:
        if not r.fits:
            out.append(f"CANNOT FIT: {r.variant}{' @ ' + r.scale if r.scale else ''} needs "
                       f"{fmt_bytes(r.memory['total'])} per run, the device has {fmt_bytes(facts['memory_bytes'])} "
                       f"({facts['memory_source']}); lower train.batch_tokens / train.batch_size or the model size.")
    return "\n".join(out)


def brief(params_path: Path, rows: list[Row], facts: dict, lm: bool, has_manifest: bool, study: dict) -> str:
    """One line: runs, time per run and in all, the study's wall, the largest run's memory, fits."""
    per_run = sorted(r.seconds_per_run for r in rows)
    span = fmt_time(per_run[0]) + ("" if fmt_time(per_run[-1]) == fmt_time(per_run[0]) else f"-{fmt_time(per_run[-1])}")
    biggest = max(rows, key=lambda r: r.memory["total"])
    time = facts["time"]
    how = (f"MFU {time.mfu:.2g} + {time.sublayer_s * 1000:.2g} ms/sublayer/step + activation traffic, fitted"
           if facts["device"].startswith("cpu") else
           f"MFU {time.mfu:.2g}, at least {time.sublayer_s * 1000:.2g} ms/sublayer/step")
    guess = "" if lm or has_manifest else "; seq2seq lengths at the filter's limits (rough until encode has run)"
    fits = "fits" if all(r.fits for r in rows) else "DOES NOT FIT"
    wall = "" if "error" in study else f"; the study {fmt_time(study['wall_s'])} at --jobs {study['jobs']}"
    return (f"{params_path}: {sum(r.runs for r in rows)} runs on {facts['device']} ({facts['peak_flops']:.3g} FLOP/s "
            f"x {how}): {span} each, {fmt_time(sum(r.seconds_per_run * r.runs for r in rows))} in all{wall}; peak "
            f"memory {fmt_bytes(biggest.memory['total'])} per run of {fmt_bytes(facts['memory_bytes'])} ({fits}){guess}")


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
    parser.add_argument("--jobs", "-j", type=int, default=1,
                        help="stages at a time, as `python -m pipeline.grid -j N` runs them (default 1: serial)")
    parser.add_argument("--cold", action="store_true",
                        help="each stage a new process, as `ABLATION_LAB_WARM=0 dvc repro` or --cold runs them (default: "
                        "warm starts on a CPU, the launcher's and a plain `dvc repro`'s; a GPU --device is planned cold)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    parser.add_argument("--brief", action="store_true", help="one line: runs, time, memory")
    args = parser.parse_args(argv)
    try:
        if args.device not in (*GPUS, "cpu"):
            raise PlanError(f"--device: unknown device {args.device!r} (choose {', '.join(GPUS)} or cpu)")
        if args.mfu is not None and not 0 < args.mfu <= 1:
            raise PlanError(f"--mfu: {args.mfu:g} is not a fraction in (0, 1]")
        if args.jobs < 1:
            raise PlanError(f"--jobs: {args.jobs} is not a positive number of stages at a time")
        params = load_params(args.params)
        reports = sorted(args.calibration.rglob("report.md"))
        facts = device_facts(args.device, args.mfu, reports, args.cpu_peak)
        manifest = read_manifest(args.shards)
        rows, why = plan(params, manifest, args.device, facts["peak_flops"], facts["time"], facts["memory_bytes"],
                         args.shards)
        # A GPU --device is planned cold (--cold's help), though the launcher runs warm there too.
        study = study_wall(params, rows, facts, args.calibration, args.jobs, not args.cold and args.device == "cpu")
    except (ValueError, OSError) as exc:  # ParamsError and PlanError are ValueErrors
        raise SystemExit(f"plan: {str(exc).strip().splitlines()[0]}") from None
    if args.json:
        print(json.dumps({"params": str(args.params), **facts, "time": timing(facts["time"]), "lengths": why,
                          "rows": [asdict(r) for r in rows],
                          "total": {"runs": sum(r.runs for r in rows),
                                    "seconds": sum(r.seconds_per_run * r.runs for r in rows),
                                    "all_fit": all(r.fits for r in rows)}, "study": study}, indent=2))
    elif args.brief:
        print(brief(args.params, rows, facts, why.startswith("language"), manifest is not None, study))
    else:
        print(report_text(args.params, rows, facts, why) + "\n" + study_text(study))


if __name__ == "__main__":
    main()
