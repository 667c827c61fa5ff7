"""What thread-count-free LayerNorm gradients (model/exact.py) cost a CPU training step.

Run: python -m benchmarks.norm_cost [--repeats 40] [--threads 1 2]
Prints one JSON object. Two shapes: the default study's encoder-decoder (d 64, 2+2 layers, post-norm,
~1,024 tokens a batch) and nanoGPT's Tiny Shakespeare recipe (decoder-only, d 128, 4 layers,
pre-norm, 12 x 64). For each, our model as built (`ours`) and the same weights with torch's
nn.LayerNorm put back (`torch_ln`) take the same AdamW step on the same batch, interleaved after a
warm-up, at each thread count; `ours_over_torch_ln` is the ratio of median step times (1.0 = free).
`same_bits_across_threads` says whether each model's weights after those steps are identical at
every thread count (they are for ours; torch's LayerNorm sums its weight gradients per thread).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import platform

import torch
from torch import nn

from benchmarks.gpt_step import gpt_config
from benchmarks.model_speed import make_batch, make_step, time_interleaved
from model import ModelConfig, build_model
from model.layers import LayerNorm
from pipeline import cpu_numerics


def with_torch_layernorm(model: nn.Module) -> nn.Module:
    """The model with each of our LayerNorms replaced by torch's, holding the same parameters."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, LayerNorm):
                plain = nn.LayerNorm(child.normalized_shape, eps=child.eps, bias=child.bias is not None)
                plain.load_state_dict(child.state_dict())
                setattr(module, name, plain)
    return model


def shapes() -> dict[str, tuple[ModelConfig, tuple]]:
    gen = torch.Generator().manual_seed(0)
    default = ModelConfig(vocab_size=2000, d_model=64, n_heads=4, n_encoder_layers=2, n_decoder_layers=2,
                          d_ff=256, dropout=0.0, max_len=512)
    gpt = gpt_config(65, 128, 4, 4, 512, 64)
    tokens = torch.randint(4, 65, (12, 65), generator=gen)
    return {"default_encoder_decoder": (default, make_batch(default, 16, 64, "cpu", 0.25, gen)),
            "nanogpt_shakespeare_char": (gpt, (None, tokens[:, :-1], tokens[:, 1:]))}


def fingerprint(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()[:16]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = p.parse_args()
    result = {"config": {**vars(args), "torch": torch.__version__, "machine": platform.machine()}, "shapes": {}}
    for shape, (cfg, batch) in shapes().items():
        per_threads, bits = {}, {"ours": set(), "torch_ln": set()}
        for threads in args.threads:
            torch.set_num_threads(threads)
            cpu_numerics.engage()  # the kernels the stages run (pipeline/cpu_numerics.py)
            torch.manual_seed(0)
            ours = build_model(cfg).train()
            plain = with_torch_layernorm(build_model(cfg).train())
            plain.load_state_dict(ours.state_dict())
            steps = {"ours": make_step(ours, batch, "cpu", torch.float32),
                     "torch_ln": make_step(plain, batch, "cpu", torch.float32)}
            times = time_interleaved(steps, args.repeats, args.warmup, "cpu")["wall"]
            per_threads[threads] = {"step_ms_ours": round(1e3 * times["ours"], 3),
                                    "step_ms_torch_ln": round(1e3 * times["torch_ln"], 3),
                                    "ours_over_torch_ln": round(times["ours"] / times["torch_ln"], 4)}
            bits["ours"].add(fingerprint(ours))
            bits["torch_ln"].add(fingerprint(plain))
        result["shapes"][shape] = {"threads": per_threads,
                                   "same_bits_across_threads": {k: len(v) == 1 for k, v in bits.items()}}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
