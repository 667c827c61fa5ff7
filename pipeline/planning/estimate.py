"""What one params.yaml costs: per variant (and scale point) the parameters, FLOPs per target token,
tokens, steps and runs, the wall time under a given time model, and each run's peak memory.

Models are built by the train stage's own code on the meta device (real parameter counts, nothing
allocated); FLOPs are the train stage's formula; activation memory is traced, not a formula
(activation_bytes). docs/scaling-out-and-cost-plan.md#know-the-cost-first describes the plan.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from model import exact
from pipeline.params import Params, model_config, resolve_variant
from pipeline.train import flops_budget_tokens, flops_per_target_token

ADAM_BYTES = 8  # AdamW keeps two fp32 moments per parameter


class PlanError(ValueError):
    """A bad argument or file; its message names it."""


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
    parallel_share: float = 1.0  # of seconds_per_run, what the loop's threads split (Calibration.parallel_share)


def cpu_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


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


def lengths(params: Params, manifest: dict | None, lm: bool, context: int,
            max_len: int) -> tuple[float, float, int, int, str]:
    """(mean source, mean target, longest source, longest target, where they come from): the means
    set FLOPs per token as the train stage counts them, the longest the batch that peaks memory.
    A side with neither a filter maximum nor an encode cap is taken as the model's max_len."""
    if lm:
        return 0.0, float(context), 0, context, "language modelling: train.context"
    f, e = params.filter, params.encode

    def longest(*limits: int | None) -> int:
        return min([n for n in limits if n is not None] or [max_len])

    longest_src = longest(e.max_source_tokens, f.max_source_tokens)
    longest_tgt = longest(e.max_target_tokens, f.max_target_tokens) + 1  # + BOS (input) / EOS (label)
    if manifest is not None:
        split = manifest["splits"]["train"]
        n = max(1, split["examples"])
        return (split["src_tokens"] / n, split["tgt_tokens"] / n + 1, longest_src, longest_tgt,
                "the encoded training split (manifest.json, shards): its mean lengths and the train stage's batch plan")
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
    Views count once (by their base); parameters count as weights, not here. bf16 halves the
    floating-point activations (an approximation: autocast keeps norms and softmax stats in fp32)."""
    seen: dict[int, torch.Tensor] = {}
    weights = {id(p) for p in model.parameters()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if id(base) not in weights:
            seen[id(base)] = base
        return t

    src, tgt = _inputs(cfg, rows, src_len, tgt_len)
    traced = "meta" not in exact.WRITTEN_OUT_ON
    exact.WRITTEN_OUT_ON.add("meta")  # what the CPU runs (pipeline/cpu_numerics.py); a GPU keeps less
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(src, tgt, tgt)
    finally:
        if traced:
            exact.WRITTEN_OUT_ON.discard("meta")
    total = 0
    for t in seen.values():
        size = t.element_size() // 2 if bf16 and t.is_floating_point() else t.element_size()
        total += t.numel() * size
    return total


def _inputs(cfg, rows: int, src_len: int, tgt_len: int):
    """A meta batch as activation_bytes feeds it: (source or None, target)."""
    if cfg.arch == "target_lm":  # the batch carries sources the model never reads
        src_len = 0
    elif cfg.arch != "encoder_decoder":  # one packed sequence; packing reads lengths, which meta cannot
        src_len, tgt_len = 0, src_len + tgt_len  # (logits at source positions too: a slight overcount)
    src = torch.ones(rows, src_len, dtype=torch.long, device="meta") if src_len else None
    return src, torch.ones(rows, tgt_len, dtype=torch.long, device="meta")


def shared_share(model, cfg, rows: int, src_len: int, tgt_len: int, threads: int) -> float:
    """The share of one training step's multiply-adds in products the pinned products share among
    `threads` threads: the forward's products traced on the meta device, each with the two its
    backward makes (the input's gradient, m x n x k; the weight's, k x m x n)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from pipeline.cpu_numerics import piece_count

    aten = torch.ops.aten
    operands = {aten.mm.default: (0, 1), aten.bmm.default: (0, 1), aten.addmm.default: (1, 2),
                aten.baddbmm.default: (1, 2)}  # the products pipeline/cpu_numerics.py routes
    products = []

    class Products(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in operands:
                a, b = (args[i] for i in operands[func])
                products.append((a.shape[0] if a.dim() == 3 else 1, *a.shape[-2:], b.shape[-1]))
            return func(*args, **(kwargs or {}))

    traced = "meta" not in exact.WRITTEN_OUT_ON
    exact.WRITTEN_OUT_ON.add("meta")  # attention written out, as the pinned CPU runs it
    try:
        src, tgt = _inputs(cfg, rows, src_len, tgt_len)
        with torch.no_grad(), Products():
            model(src, tgt, tgt)
    finally:
        if traced:
            exact.WRITTEN_OUT_ON.discard("meta")
    total = shared = 0
    for batch, m, k, n in products:
        for shape in ((m, k, n), (m, n, k), (k, m, n)):
            total += batch * m * k * n
            shared += batch * m * k * n if piece_count(batch, *shape, threads) > 1 else 0
    return shared / total if total else 0.0


def memory(model, cfg, shape: tuple[int, int, int], bf16: bool) -> dict:
    """Peak bytes of one run at the largest batch `shape` (rows, source, target length): weights,
    gradients, AdamW's moments, activations, bf16 weight copies, and backward's largest transient,
    the logits' fp32 gradient (the loss runs in fp32), alive while the saved activations are."""
    n = model.param_counts()["total"]
    rows, src_len, tgt_len = shape
    out = {"weights": 4 * n, "gradients": 4 * n, "adamw": ADAM_BYTES * n,
           "bf16_weight_copies": 2 * n if bf16 else 0,
           "activations": activation_bytes(model, cfg, rows, src_len, tgt_len, bf16),
           "logits_gradient": 4 * rows * tgt_len * cfg.vocab_size,
           "batch": f"{rows} x ({src_len} + {tgt_len}) tokens" if src_len else f"{rows} x {tgt_len} tokens",
           "batch_shape": [rows, src_len, tgt_len]}
    out["total"] = sum(v for v in out.values() if isinstance(v, int))
    return out


def guessed_shape(cfg, tcfg: dict, longest: tuple[int, int]) -> tuple[int, int, int]:
    """The largest seq2seq batch without data: the longest examples, as many as batch_tokens holds."""
    src_len, tgt_len = (min(n, cfg.max_len) for n in longest)  # the model takes no longer
    # One packed sequence (target_lm's is the target alone: its sources only count in the batch's size)
    if cfg.arch not in ("encoder_decoder", "target_lm") and src_len + tgt_len > cfg.max_len:
        src_len = max(1, cfg.max_len - tgt_len)
    return max(1, tcfg["batch_tokens"] // (src_len + tgt_len)), src_len, tgt_len


def tokens_and_steps(tcfg: dict, per_token: float, mean_src: float, mean_tgt: float, lm: bool) -> tuple[int, int]:
    """(target tokens, optimizer steps) of one run from the budget, without data (seq2seq: padding
    ignored, so the steps are a floor)."""
    per_batch = tcfg["batch_size"] * tcfg["context"] if lm else tcfg["batch_tokens"] * mean_tgt / (mean_src + mean_tgt)
    per_step = per_batch * tcfg["grad_accum"]
    if tcfg["budget_steps"] is not None:
        return int(tcfg["budget_steps"] * per_step), tcfg["budget_steps"]
    tokens = budget_tokens(tcfg, per_token)
    steps = max(1, math.ceil(tokens / per_step))
    # Training stops at the first whole step past the budget: a language model's steps are all equal.
    return (steps * per_step if lm else tokens), steps


def budget_tokens(tcfg: dict, per_token: float) -> int:
    if tcfg["budget_flops"] is not None:
        return flops_budget_tokens(tcfg["budget_flops"], per_token)
    return tcfg["budget_tokens"]


def planned_batches(split, manifest: dict, tcfg: dict, seed: int, per_token: float):
    """(target tokens, steps, largest batch shape, mean batch shape) of a seq2seq run on the encoded
    data: the train stage's own batch plan (`trainer.plan_steps`), padding included."""
    from pipeline.training import trainer

    ids = {k: manifest[k] for k in ("pad_id", "bos_id", "eos_id")}
    data = trainer.Data(task=manifest["task"], train=split, val=None, ids=ids, batch_tokens=tcfg["batch_tokens"],
                        batch_size=tcfg["batch_size"], context=tcfg["context"], seed=seed)
    steps, tokens = trainer.plan_steps(data, budget_tokens(tcfg, per_token), tcfg["budget_steps"], tcfg["grad_accum"])
    shapes = [(len(idx), max(len(split.src[i]) for i in idx), max(len(split.tgt[i]) for i in idx) + 1)
              for idx in data.epoch(0)]
    mean = tuple(sum(s[k] for s in shapes) / len(shapes) for k in range(3))
    return tokens, steps, max(shapes, key=lambda s: s[0] * (s[1] + s[2])), mean


def mean_shape(cfg, shape: tuple[float, float, float]) -> tuple[int, int, int]:
    """A mean batch as the whole rows and lengths a meta-device forward takes, within the model's max_len."""
    rows, src, tgt = (max(0, round(x)) for x in shape)
    tgt = min(max(1, tgt), cfg.max_len)
    src = min(src, cfg.max_len if cfg.arch == "encoder_decoder" else max(0, cfg.max_len - tgt))
    return max(1, rows), src, tgt


def sublayers(cfg) -> int:
    """Attention and feed-forward sublayers per forward pass: the unit of the fixed per-step cost."""
    if cfg.arch == "encoder_decoder":
        return 2 * cfg.n_encoder_layers + 3 * cfg.n_decoder_layers  # decoder: self, cross, FFN
    return 2 * cfg.n_decoder_layers


def task_of(params: Params) -> str:
    from pipeline.preset import source_task

    return source_task(params)


def plan(params: Params, manifest: dict | None, device: str, peak: float, time, capacity: int,
         shards: Path | None = None, cores: int | None = None) -> tuple[list[Row], str]:
    """One Row per variant and scale point, and where the sequence lengths come from. `time`: a
    calibration.Calibration. GPU: the device computes while the host prepares the next step, so a
    step takes the longer of its FLOPs at peak x MFU and the host's work per sublayer (the
    memory-bound term is inside the MFU there). CPU: a run takes train.threads, or every one of
    `cores` (default: this machine's)."""
    lm = task_of(params) == "language_modeling"
    ids = tokenizer_ids(params, manifest)
    bf16 = device != "cpu"  # the train stage autocasts to bf16 on CUDA only
    split = None
    if manifest is not None and shards is not None and not lm:
        from pipeline.training.batching import load_split

        split = load_split(shards, manifest, "train")
    rows, why = [], ""
    per_point = len(params.seeds) * (1 + len(params.lr_sweep))  # the lr points train the same model
    for scale in (None, *params.scales):
        for variant in params.ablations:
            where = f"ablations.{variant}" + (f" at scales.{scale}" if scale else "")
            resolved = resolve_variant(params, variant, scale)
            tcfg = resolved["train"]
            cfg, model = meta_model(resolved, ids, where)
            mean_src, mean_tgt, longest_src, longest_tgt, why = lengths(params, manifest, lm, tcfg["context"],
                                                                        cfg.max_len)
            per_token = flops_per_target_token(model, cfg, mean_src, mean_tgt)
            if lm:
                tokens, steps = tokens_and_steps(tcfg, per_token, mean_src, mean_tgt, lm)
                shape = mean = (tcfg["batch_size"], 0, tcfg["context"])
            elif split is not None:
                tokens, steps, shape, mean = planned_batches(split, manifest, tcfg, params.seeds[0], per_token)
            else:
                tokens, steps = tokens_and_steps(tcfg, per_token, mean_src, mean_tgt, lm)
                shape = mean = guessed_shape(cfg, tcfg, (longest_src, longest_tgt))
            flops = per_token * tokens
            n = sublayers(cfg)
            mem = memory(model, cfg, shape, bf16)
            share = 1.0
            if device == "cpu":  # float32: a language model's mean batch is the one memory traced
                act = mem["activations"] if mean == shape else activation_bytes(model, cfg, *mean_shape(cfg, mean), False)
                threads = tcfg.get("threads") or cores or cpu_cores()  # the loop's own, serial: 0 is every core
                shared = shared_share(model, cfg, *mean_shape(cfg, mean), threads) if time.pinned else 0.0
                seconds = time.cpu_seconds(steps, n, act, flops, peak, shared, threads)
                share = time.parallel_share(steps, n, act, flops, peak, shared, threads)
            else:
                seconds = max(flops / (peak * time.mfu), steps * n * time.sublayer_s)
            added = sum(1 for r in params.decide.runs.values() if r.variant == variant)  # seeds until decided
            rows.append(Row(variant, scale, model.param_counts()["total"], per_token, tokens, steps,
                            per_point + added if scale is None else len(params.seeds), seconds, mem,
                            mem["total"] <= capacity, share))
    return rows, why
