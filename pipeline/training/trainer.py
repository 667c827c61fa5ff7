"""The training loop shared by the baseline and every ablation.

Fair budgets: the number of optimizer steps is fixed before training from the token budget by
walking the (deterministic) batch plan, so every variant trained with a seed consumes the same
batches and exactly the same number of target tokens. Per-step host syncs are avoided: losses are
summed on the device and read only at logging, evaluation and checkpoint boundaries.

Data parallel (under torchrun): every rank walks the same plan; an optimizer step consumes the next
grad_accum x world batches and rank r takes every world-th of them, starting at r. Losses are
weighted by target tokens exactly as in gradient accumulation, so W ranks with accumulation A train
the same steps on the same tokens as one process with accumulation A x W. Ranks talk only at
logging, evaluation and checkpoint points (plus DDP's gradient all-reduce).
"""
from __future__ import annotations

import contextlib
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from pipeline.progress import clock
from pipeline.training import checkpoint
from pipeline.training.batching import (ATTENTION_ALIGN, Split, collate, lm_batches, lm_collate, lm_stream,
                                       pad_for_compile, seq2seq_batches)
from pipeline.training.device import (Cluster, all_gather, all_reduce, autocast, check_replicas_identical, resolve_device,
                                      resolve_precision, run_slots)
from pipeline.training.gpu_lock import claimed
from pipeline.training.optim import make_optimizer, make_scheduler, uses_fused


class NonFiniteLoss(RuntimeError):
    pass


@dataclass
class Data:
    """Training and validation data plus the batch plan, for either task.

    Language modelling reads `train_stream`/`val_stream` (memory-mapped token files from
    `batching.lm_token_file`) when given, else concatenates the splits' documents in memory.
    """
    task: str
    train: Split | None
    val: Split | None
    ids: dict  # pad_id, bos_id, eos_id
    batch_tokens: int
    batch_size: int
    context: int
    seed: int
    train_stream: np.ndarray | None = None
    val_stream: np.ndarray | None = None
    lm_windows: str = "grid"  # train.lm_windows: how training windows are drawn (validation: always grid)
    _cache: dict = field(default_factory=dict)

    def __post_init__(self):
        self.lm = self.task == "language_modeling"
        if self.lm:
            if self.train_stream is None:
                self.train_stream = lm_stream(self.train, self.ids["eos_id"])
            if self.val_stream is None:
                self.val_stream = lm_stream(self.val, self.ids["eos_id"])

    def epoch(self, epoch: int) -> list[np.ndarray]:
        if epoch not in self._cache:
            self._cache = {epoch: (lm_batches(len(self.train_stream), self.context, self.batch_size, self.seed, epoch,
                                              windows=self.lm_windows)
                                   if self.lm else seq2seq_batches(self.train, self.batch_tokens, self.seed, epoch))}
            if not self._cache[epoch]:
                raise ValueError("training split too small for one batch (lower train.batch_size/context)")
        return self._cache[epoch]

    def batch(self, idx: np.ndarray, split: str = "train"):
        if self.lm:
            return lm_collate(self.train_stream if split == "train" else self.val_stream, idx, self.context)
        return collate(self.train if split == "train" else self.val, idx, **self.ids)

    def target_tokens(self, idx: np.ndarray) -> int:
        if self.lm:
            return len(idx) * self.context
        return int(sum(len(self.train.tgt[i]) + 1 for i in idx))

    def val_batches(self, max_examples: int, windows: str = "first", step: int = 0) -> list[np.ndarray]:
        """The validation batches of the in-loop estimate at `step` (train.eval_windows).

        first: a fixed subset, the first `max_examples` examples (or windows), in order.
        random (language modelling): `max_examples` windows at uniformly random starts over the
        whole split, drawn from (seed, step): new windows at every evaluation, the same ones for
        every variant of a seed, and again the same after a resume.
        """
        if windows == "random":
            if not self.lm:
                raise ValueError("train.eval_windows: random draws language-model windows; this task is "
                                 f"{self.task} (use first)")
            if len(self.val_stream) <= self.context:
                raise ValueError(f"train.eval_windows: the validation split ({len(self.val_stream)} tokens) is "
                                 f"shorter than one window of train.context + 1 = {self.context + 1}")
            rng = np.random.default_rng([self.seed, step, _EVAL_DRAW])
            starts = rng.integers(0, len(self.val_stream) - self.context, size=max(1, max_examples))
            return [starts[i:i + self.batch_size] for i in range(0, len(starts), self.batch_size)]
        if self.lm:
            return lm_batches(len(self.val_stream), self.context, self.batch_size, 0, 0, shuffle=False)[
                : max(1, max_examples // self.batch_size)] or [np.array([0])]
        subset = Split(self.val.src[:max_examples], self.val.tgt[:max_examples])
        return seq2seq_batches(subset, self.batch_tokens, 0, 0, shuffle=False)


# Keeps the validation draws of train.eval_windows = random apart from the training windows' (seed, epoch).
_EVAL_DRAW = 0x5EA1


# Planning walks the batches of every epoch the budget needs, a few ms each: past this many
# passes over the data it would take minutes before the first step, for a budget no study means.
MAX_EPOCHS = 10_000


def plan_steps(data: Data, budget_tokens: int, budget_steps: int | None, per_step: int) -> tuple[int, int]:
    """(optimizer steps, target tokens they consume) for the budget; `per_step` batches per step."""
    first = data.epoch(0)
    epoch_tokens = sum(data.target_tokens(idx) for idx in first)
    passes = budget_steps * per_step / max(len(first), 1) if budget_steps else budget_tokens / max(epoch_tokens, 1)
    if passes > MAX_EPOCHS:
        key = "train.budget_steps" if budget_steps else "train.budget_tokens"
        raise ValueError(f"{key}: {budget_steps or budget_tokens} is {passes:,.0f} passes over the training "
                         f"data ({epoch_tokens:,} target tokens per pass; at most {MAX_EPOCHS:,}); lower it")
    batches = tokens = epoch = 0
    while True:
        for idx in data.epoch(epoch):
            if budget_steps is not None and batches >= budget_steps * per_step:
                return budget_steps, tokens
            if budget_steps is None and tokens >= budget_tokens and batches % per_step == 0:
                return batches // per_step, tokens
            tokens += data.target_tokens(idx)
            batches += 1
        epoch += 1


def evaluate_loss(model, data: Data, batches: list[np.ndarray], device, use_autocast: bool,
                  cluster: Cluster = Cluster(), on_batch=None) -> float:
    """Mean loss per target token over `batches`; under DDP each rank takes its share.
    `on_batch(n)`, if given, is told each batch's target tokens (the evaluate stage's progress)."""
    model.eval()
    total = torch.zeros((), device=device, dtype=torch.float64)
    count = 0
    with torch.no_grad():
        for idx in batches[cluster.rank::cluster.world]:
            src, tgt_in, tgt_out = (t.to(device) if t is not None else None for t in data.batch(idx, "val"))
            with autocast(device, use_autocast):
                _, loss = model(src, tgt_in, tgt_out)
            n = int((tgt_out != data.ids["pad_id"]).sum()) if not data.lm else tgt_out.numel()
            total += loss.double() * n
            count += n
            if on_batch is not None:
                on_batch(n)
    model.train()
    total, count = all_reduce([float(total), count], device)
    return total / max(count, 1)


def train(model, data: Data, cfg: dict, ckpt_dir: Path, run_hash: str, tracker=None, log=print,
          cluster: Cluster = Cluster()) -> dict:
    """Train `model` to the budget in `cfg` (the `train` section); return the final metrics."""
    device = resolve_device(cfg["device"], cluster, run_slots(cfg, model, data.lm))
    precision = resolve_precision(cfg["precision"], device)
    use_autocast = precision == "bf16"
    log = log if cluster.main else _silent
    for seed_fn in (random.seed, np.random.seed, torch.manual_seed):
        seed_fn(data.seed + cluster.rank)  # ranks draw different dropout masks
    model.to(device)
    optimizer = make_optimizer(model, cfg["lr"], cfg["betas"], cfg["eps"], cfg["weight_decay"], device,
                               cfg["decay_embeddings"], precision)
    per_step = cfg["grad_accum"] * cluster.world
    total_steps, budget_tokens = plan_steps(data, cfg["budget_tokens"], cfg["budget_steps"], per_step)
    scheduler = make_scheduler(optimizer, cfg["schedule"], cfg["warmup_steps"], total_steps, cfg["min_lr_ratio"],
                               cfg.get("warmup_start", "one"))
    eval_windows, keep = cfg.get("eval_windows", "first"), cfg.get("keep", "last")
    val_batches = data.val_batches(cfg["eval_examples"], eval_windows)
    s = {"step": 0, "tokens": 0, "epoch": 0, "index": 0, "train_rows": [], "val_rows": [], "elapsed": 0.0}
    # This rank's share, saved per rank. "shape": micro-batches, rows, source and target lengths
    # (padded), summed: the mean batch the planner's time model is calibrated on.
    mine = {"loss_acc": [0.0, 0], "pad": [0, 0], "shape": [0, 0, 0, 0]}
    # train.keep = best: the lowest in-loop estimate so far, its step and the weights (on the CPU).
    best: dict | None = None
    resumed = checkpoint.load_for_ranks(ckpt_dir, run_hash, device)
    if resumed is not None:
        model.load_state_dict(resumed["model"])
        optimizer.load_state_dict(resumed["optimizer"])
        scheduler.load_state_dict(resumed["scheduler"])
        ranks = resumed.get("ranks", [])
        mine = ranks[cluster.rank] if len(ranks) == cluster.world else {
            "rng": resumed["rng"], "loss_acc": resumed["loop"].get("loss_acc", [0.0, 0]),
            "pad": resumed["loop"].get("pad", [0, 0])}
        checkpoint.set_rng_state(mine["rng"])
        s = resumed["loop"]
        best = resumed.get("best")
        log(f"resumed from step {s['step']} ({ckpt_dir})")
    saved = s["step"] if resumed is not None else None  # the step of the last good checkpoint
    ddp = step_model = model
    if cluster.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        # No buffer sync in forward: the buffers are constants (position tables), and a collective
        # inside forward would deadlock the unevenly sharded evaluation.
        ddp = step_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                                   forward_sync_buffers=False)
    if cfg["compile"]:
        step_model = compiled(ddp, device, dynamic=not data.lm)
    # The encoder-decoder's attention sees the source and target lengths themselves, so padding
    # them to ATTENTION_ALIGN keeps CUDA's alignment guards true for every batch (on CPU too, so
    # the CPU tests see the GPU's shapes). Decoder-only models attend over the packed length, a
    # data-dependent sum no padding here fixes, and padded targets would only lengthen it.
    align = ATTENTION_ALIGN if model.cfg.arch == "encoder_decoder" else 1
    # Validation runs eager: compiled, no_grad and eval mode are a second graph to compile (a
    # minute on CPU) for a pass that runs once every eval_every steps.
    eval_model = model
    log(f"training {total_steps} steps, {budget_tokens} target tokens, on {device}"
        + (f" x {cluster.world} ranks" if cluster.world > 1 else "")
        + f", {precision}" + (", compiled" if cfg["compile"] else ""))
    loss_sum = torch.tensor(mine["loss_acc"][0], device=device)
    loss_tokens, pad, shape = mine["loss_acc"][1], list(mine["pad"]), list(mine.get("shape", [0, 0, 0, 0]))
    started = time.perf_counter() - s["elapsed"]
    window_start, here = s["step"], (s["step"], time.perf_counter())  # `here`: this process's start, for ETA
    bad_step = torch.full((), -1, device=device, dtype=torch.long)
    bar = _progress(total_steps, s["step"]) if cluster.main else None
    model.train()
    while s["step"] < total_steps:
        group = []
        for _ in range(per_step):
            batches = data.epoch(s["epoch"])
            group.append(batches[s["index"]])
            s["index"] += 1
            if s["index"] == len(batches):
                s["epoch"], s["index"] = s["epoch"] + 1, 0
        group_tokens = sum(data.target_tokens(idx) for idx in group)
        shard = group[cluster.rank::cluster.world]
        for i, idx in enumerate(shard):
            batch = data.batch(idx)
            # Padding is counted on the host copy, so it costs no device sync.
            pad[0] += sum(int((t == data.ids["pad_id"]).sum()) for t in batch[:2] if t is not None)
            pad[1] += sum(t.numel() for t in batch[:2] if t is not None)
            shape = [a + b for a, b in zip(shape, (1, len(batch[1]), 0 if batch[0] is None else batch[0].shape[1],
                                                    batch[1].shape[1]))]
            if cfg["compile"] and not data.lm:  # after the counts above: they describe the data
                batch = pad_for_compile(batch, data.ids["pad_id"], align, model.cfg.max_len)
            src, tgt_in, tgt_out = (_to_device(t, device) for t in batch)
            n = data.target_tokens(idx)
            # Gradients are all-reduced once per optimizer step, after the last micro-batch.
            sync = ddp is model or i == len(shard) - 1
            with contextlib.nullcontext() if sync else ddp.no_sync():
                with autocast(device, use_autocast):
                    _, loss = step_model(src, tgt_in, tgt_out)
                # DDP averages gradients over ranks; x world turns that into the token-weighted sum.
                (loss * (n * cluster.world / group_tokens)).backward()
            loss_sum += loss.detach().float() * n
            loss_tokens += n
            # In place with a Python scalar: building a tensor on the GPU here would sync every step.
            bad_step.masked_fill_(~torch.isfinite(loss.detach()) & (bad_step < 0), s["step"] + 1)
        if cfg["clip_grad_norm"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["clip_grad_norm"])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        s["step"] += 1
        s["tokens"] += group_tokens
        last = s["step"] == total_steps
        if s["step"] % cfg["log_every"] == 0 or last:
            _check_finite(bad_step, device, saved, ckpt_dir)
            loss_total, tokens_total = all_reduce([float(loss_sum), loss_tokens], device)
            train_loss = loss_total / max(tokens_total, 1)
            lr = scheduler.get_last_lr()[0]
            s["train_rows"].append([s["step"], s["tokens"], train_loss, lr])
            now = time.perf_counter()
            tps = s["tokens"] / max(now - started, 1e-9)
            eta = (total_steps - s["step"]) * (now - here[1]) / max(s["step"] - here[0], 1)
            if tracker:
                tracker.log_metrics({"train_loss": train_loss, "lr": lr, "tokens": s["tokens"],
                                     "tokens_per_s": tps}, s["step"])
            _report(bar, log, s["step"], total_steps, train_loss, lr, tps, eta, s["step"] - window_start)
            window_start = s["step"]
            loss_sum.zero_()
            loss_tokens = 0
        if s["step"] % cfg["eval_every"] == 0 or last:
            if eval_windows == "random":
                val_batches = data.val_batches(cfg["eval_examples"], eval_windows, s["step"])
            val_loss = evaluate_loss(eval_model, data, val_batches, device, use_autocast, cluster)
            s["val_rows"].append([s["step"], s["tokens"], val_loss])
            if bar is None:  # a stage's log (DVC, the grid): the estimates so far, also of a run cut short
                log(f"val estimate {val_loss:.4f} at step {s['step']}/{total_steps}")
            if keep == "best" and (best is None or val_loss < best["val_loss"]):
                best = {"step": s["step"], "val_loss": val_loss,
                        "state": {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}}
            if tracker:
                tracker.log_metrics({"val_loss": val_loss}, s["step"])
        if s["step"] % cfg["checkpoint_every"] == 0 and not last:
            _check_finite(bad_step, device, saved, ckpt_dir)
            s["elapsed"] = time.perf_counter() - started
            # Each rank's RNG, unlogged loss and padding counts, so a resumed run continues exactly.
            ranks = all_gather({"rng": checkpoint.rng_state(), "loss_acc": [float(loss_sum), loss_tokens],
                                "pad": list(pad), "shape": list(shape)})
            if cluster.main:
                checkpoint.save(ckpt_dir, s["step"], {
                    "config_hash": run_hash, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "rng": ranks[0]["rng"], "ranks": ranks, "loop": s,
                    "best": best,
                }, cfg["keep_checkpoints"])
            saved = s["step"]
    if bar is not None:
        bar.close()
    wall = time.perf_counter() - started
    if cluster.world > 1:
        check_replicas_identical(model)
    pad = all_reduce(pad, device)
    shape = all_reduce(shape, device)
    kept = kept_model(model, best, s["step"]) if keep == "best" else {"kept_step": s["step"], "last_state": None}
    if tracker:
        tracker.log_metrics({"kept_step": kept["kept_step"]}, s["step"])
    estimates = [row[2] for row in s["val_rows"]]
    return {
        "steps": s["step"], "tokens_trained": s["tokens"], "budget_tokens": budget_tokens,
        # passes over the training data (whole epochs + the share of the next): a seed's claim is
        # compared only within its budget class (pipeline/reporting/claims.py)
        "passes": s["epoch"] + s["index"] / len(data.epoch(s["epoch"])),
        "train_loss": s["train_rows"][-1][2] if s["train_rows"] else None,
        "val_loss": s["val_rows"][-1][2] if s["val_rows"] else None,
        "wall_time_s": wall, "tokens_per_s": s["tokens"] / max(wall, 1e-9),
        "padding_ratio": pad[0] / pad[1] if pad[1] else 0.0,
        "processed_tokens_per_s": (pad[1] - pad[0]) / max(wall, 1e-9),  # source + target, no pad, all ranks
        "batch_shape_mean": [x / shape[0] for x in shape[1:]] if shape[0] else None,  # rows, source, target
        "device": str(device), "world_size": cluster.world, "resumed": resumed is not None,
        "gpu": claimed().record() if device.type == "cuda" and claimed() else None,
        "precision": precision, "compile": cfg["compile"], "fused_adamw": uses_fused(device, precision),
        "train_rows": s["train_rows"], "val_rows": s["val_rows"],
        # The in-loop estimates (train.eval_windows) and which model model.pt holds (train.keep).
        "eval_windows": eval_windows, "eval_examples": cfg["eval_examples"], "keep": keep,
        "kept_step": kept["kept_step"],
        "val_estimate_best": min(estimates) if estimates else None,
        "val_estimate_best_step": s["val_rows"][estimates.index(min(estimates))][0] if estimates else None,
        "val_estimate_last": estimates[-1] if estimates else None,
        "last_state": kept["last_state"],
    }


def kept_model(model, best: dict | None, last_step: int) -> dict:
    """train.keep = best: load the best in-loop estimate's weights into `model`. Returns its step and,
    when that is not the last step, the last step's weights (the train stage saves both)."""
    if best is None or best["step"] == last_step:
        return {"kept_step": last_step, "last_state": None}
    last_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    model.load_state_dict(best["state"])
    return {"kept_step": best["step"], "last_state": last_state}


def compiled(model, device: torch.device, dynamic: bool, backend="inductor"):
    """torch.compile (inductor) of the training step, on CUDA or CPU.

    Seq2seq batches change shape every step (length buckets): `dynamic` compiles for symbolic
    batch and sequence sizes from the start, one compilation where a static first one would be
    followed by a dynamic recompile. torch still specialises sizes of 1 (a bucket's leftover of one
    example), which the loop pads away (batching.pad_for_compile), and by default gives sizes that
    happen to be equal in the first batch one symbol ("duck sizing": a source as long as its target
    would recompile at the first batch where they differ), which is turned off here for the process.
    On CUDA, inductor also guards that the fused attention's mask and statistics are aligned to 8
    elements, which the loop keeps true by padding encoder-decoder lengths to multiples of 8, and
    its matmul padding pass (`shape_padding`) guards on whether a product of sizes makes a matmul
    compute-bound (seen on an H200: `tgt_len * batch >= 150` recompiled), so it is off for dynamic
    steps. So the step compiles once.
    Language-model windows have one shape: static, as specialised as inductor can make it.
    `backend`: tests count compilations with a cheap one.
    """
    if device.type == "cpu" and backend == "inductor":
        try:
            from torch._inductor.cpp_builder import get_cpp_compiler

            get_cpp_compiler()
        except Exception as exc:  # noqa: BLE001 - whatever torch says, the fix is the same
            raise ValueError(f"train.compile: torch.compile on CPU needs a C++ compiler (g++ or clang++, or $CXX) "
                             f"and found none ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
                             "install one or set train.compile: false") from None
    if dynamic:
        import torch.fx.experimental._config as shapes

        shapes.use_duck_shape = False  # read when a graph is traced, so it stays set
    if dynamic and backend == "inductor":
        return torch.compile(model, dynamic=True, backend=backend, options={"shape_padding": False})
    return torch.compile(model, dynamic=dynamic or None, backend=backend)


def _to_device(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    if t is None:
        return None
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t


def _check_finite(bad_step: torch.Tensor, device, saved: int | None, ckpt_dir: Path) -> None:
    """Raise on every rank if any rank saw a non-finite loss (the earliest step is named), saying
    which checkpoint, if any, holds the last good state."""
    step = int(bad_step)
    step = all_reduce([step if step >= 0 else math.inf], device, "min")[0]
    if step < math.inf:
        kept = (f"the checkpoint of step {saved} in {ckpt_dir} is the last good state" if saved is not None
                else "no checkpoint was written before it")
        raise NonFiniteLoss(f"non-finite loss at step {int(step)}; {kept} (lower train.lr or raise "
                            "train.warmup_steps)")


def _silent(*_args, **_kwargs) -> None:
    pass


def _progress(total: int, initial: int, stream=None):
    """A tqdm bar on a terminal; None when stderr is a file or pipe (DVC, CI), which get log lines."""
    stream = stream or sys.stderr
    if not stream.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, file=stream)


def _report(bar, log, step, total, loss, lr, tps, eta, advanced) -> None:
    if bar is not None:
        bar.update(advanced)  # tqdm's own "elapsed<remaining" is the ETA
        bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tps:,.0f}")
    else:
        log(f"step {step}/{total} loss {loss:.4f} lr {lr:.2e} tokens/s {tps:,.0f} ETA {clock(eta)}")
