"""pipeline.plan's peak memory per run against what one training step really takes, on this CPU.

Run: python -m benchmarks.plan_memory [--presets tinystories_cpu tiny_shakespeare_cpu]
Prints one JSON object to stdout.

For each preset's baseline, a fresh process takes three training steps at the preset's largest
batch and reports its peak resident memory over what was resident before. ratio = measured /
planned: above 1 the plan undercounts (allocator caching, AdamW's foreach temporaries). Only
language-model presets: their batch shape needs no data.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, sys, torch
from pathlib import Path
def hwm_rss():
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmHWM"].split()[0]) * 1024, int(fields["VmRSS"].split()[0]) * 1024
from model import build_model
from pipeline import cpu_numerics
from pipeline.params import load_params, model_config, resolve_variant
from pipeline.planning.estimate import tokenizer_ids
from pipeline.training.allocator import keep_freed_memory
from pipeline.training.optim import make_optimizer
torch.set_num_threads(1)
keep_freed_memory()  # freed memory kept for the next step, as the stages keep it
cpu_numerics.engage()  # the kernels the stages run (pipeline/cpu_numerics.py)
params = load_params(sys.argv[1])
resolved = resolve_variant(params, params.report.baseline)
t = resolved["train"]
ids = tokenizer_ids(params, None)
cfg = model_config(resolved["model"], ids, "baseline")
tokens = torch.randint(4, cfg.vocab_size, (t["batch_size"], t["context"] + 1))
def steps(model, batch, n):
    opt = make_optimizer(model, t["lr"], t["betas"], t["eps"], t["weight_decay"], torch.device("cpu"))
    for _ in range(n):
        _, loss = model(None, batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
# The same kernels once on one short row, so their code pages and thread pools are resident before
# the measurement; then the peak is reset (Linux: clear_refs 5) and only the real run counts.
steps(build_model(cfg).train(), tokens[:1, :9], 1)
Path("/proc/self/clear_refs").write_text("5")
_, before = hwm_rss()
steps(build_model(cfg).train(), tokens, 3)
peak, _ = hwm_rss()
print(json.dumps({"measured_bytes": peak - before}))
"""


def planned(preset: Path) -> dict:
    from pipeline.params import load_params
    from pipeline.planning.calibration import Calibration
    from pipeline.planning.estimate import plan

    params = load_params(preset)
    untimed = Calibration(mfu=1.0, sublayer_s=0.0, bytes_per_s=float("inf"), runs=0, source="memory only")
    rows, _ = plan(params, None, "cpu", 1.0, untimed, 0)
    return next(r for r in rows if r.variant == params.report.baseline).memory


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tinystories_cpu", "tiny_shakespeare_cpu"])
    args = parser.parse_args(argv)
    results = {}
    for name in args.presets:
        path = ROOT / "presets" / f"{name}.yaml"
        mem = planned(path)
        out = subprocess.run([sys.executable, "-c", _CHILD, str(path)], cwd=ROOT, capture_output=True, text=True,
                             check=True)
        measured = json.loads(out.stdout.strip().splitlines()[-1])["measured_bytes"]
        results[name] = {"planned_bytes": mem["total"], "measured_bytes": measured,
                         "ratio": round(measured / mem["total"], 3), "batch": mem["batch"],
                         "planned": {k: v for k, v in mem.items() if isinstance(v, int)}}
    print(json.dumps({"benchmark": "plan_memory", "machine": platform.machine(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
