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

from pipeline.io.progress import clock
from pipeline.training import checkpoint
from pipeline.training.batching import (ATTENTION_ALIGN, Split, collate, lm_batches, lm_collate, lm_stream,
                                       pad_for_compile, seq2seq_batches)
from pipeline.training.device import (Cluster, all_gather, all_reduce, autocast, check_replicas_identical,
                                      resolve_device, resolve_precision, run_slots, to_device)
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
    loop = Loop(model, data, cfg, ckpt_dir, run_hash, tracker, log if cluster.main else lambda *_: None, cluster)
    while loop.state["step"] < loop.total_steps:
        loop.step()
        step, last = loop.state["step"], loop.state["step"] == loop.total_steps
        if step % cfg["log_every"] == 0 or last:
            loop.log()
        if step % cfg["eval_every"] == 0 or last:
            loop.evaluate()
        if step % cfg["checkpoint_every"] == 0 and not last:
            loop.checkpoint()
    return loop.finish()


class Loop:
    """One run's training, set up and resumed. `state` is its place as a checkpoint saves it (step, tokens,
    epoch and index in the batch plan, curve rows, seconds); `best` the lowest estimate (train.keep = best)."""

    def __init__(self, model, data: Data, cfg: dict, ckpt_dir: Path, run_hash: str, tracker, say, cluster: Cluster):
        self.model, self.data, self.cfg, self.ckpt_dir, self.run_hash = model, data, cfg, ckpt_dir, run_hash
        self.tracker, self.say, self.cluster = tracker, say, cluster
        device = self.device = resolve_device(cfg["device"], cluster, run_slots(cfg, model, data.lm))
        self.precision = resolve_precision(cfg["precision"], device)
        for seed_fn in (random.seed, np.random.seed, torch.manual_seed):
            seed_fn(data.seed + cluster.rank)  # ranks draw different dropout masks
        model.to(device)
        self.optimizer = make_optimizer(model, cfg["lr"], cfg["betas"], cfg["eps"], cfg["weight_decay"], device,
                                        cfg["decay_embeddings"], self.precision)
        self.per_step = cfg["grad_accum"] * cluster.world
        self.total_steps, self.budget_tokens = plan_steps(data, cfg["budget_tokens"], cfg["budget_steps"],
                                                          self.per_step)
        self.scheduler = make_scheduler(self.optimizer, cfg["schedule"], cfg["warmup_steps"], self.total_steps,
                                        cfg["min_lr_ratio"], cfg["warmup_start"])
        self.val_batches = data.val_batches(cfg["eval_examples"], cfg["eval_windows"])
        self.state = {"step": 0, "tokens": 0, "epoch": 0, "index": 0, "train_rows": [], "val_rows": [], "elapsed": 0.0}
        self.best, self.saved, self.resumed = None, None, False  # saved: the step of the last good checkpoint
        # This rank's share, saved per rank. "shape": micro-batches, rows, source and target lengths
        # (padded), summed: the mean batch the planner's time model is calibrated on.
        mine = self.resume() or {"loss_acc": [0.0, 0], "pad": [0, 0], "shape": [0, 0, 0, 0]}
        self.ddp = self.step_model = model
        if cluster.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            # No buffer sync in forward: the buffers are constants (position tables), and a collective
            # inside forward would deadlock the unevenly sharded evaluation.
            self.ddp = self.step_model = DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None, forward_sync_buffers=False)
        if cfg["compile"]:
            self.step_model = compiled(self.ddp, device, dynamic=not data.lm)
        # The encoder-decoder's attention sees the source and target lengths themselves, so padding
        # them to ATTENTION_ALIGN keeps CUDA's alignment guards true for every batch (on CPU too, so
        # the CPU tests see the GPU's shapes). Decoder-only models attend over the packed length, a
        # data-dependent sum no padding here fixes, and padded targets would only lengthen it.
        self.align = ATTENTION_ALIGN if model.cfg.arch == "encoder_decoder" else 1
        say(f"training {self.total_steps} steps, {self.budget_tokens} target tokens, on {device}"
            + (f" x {cluster.world} ranks" if cluster.world > 1 else "")
            + f", {self.precision}" + (", compiled" if cfg["compile"] else ""))
        self.loss_sum = torch.tensor(mine["loss_acc"][0], device=device)
        self.loss_tokens, self.pad, self.shape = mine["loss_acc"][1], list(mine["pad"]), list(mine["shape"])
        step = self.state["step"]
        self.started = time.perf_counter() - self.state["elapsed"]
        self.last_logged, self.here = step, (step, time.perf_counter())  # `here`: this process's start, for ETA
        self.bad_step = torch.full((), -1, device=device, dtype=torch.long)
        self.bar = _progress(self.total_steps, step) if cluster.main else None
        model.train()

    def resume(self) -> dict | None:
        """Load the newest checkpoint of this configuration and code, if any; return this rank's share."""
        found = checkpoint.load_for_ranks(self.ckpt_dir, self.run_hash, self.device)
        if found is None:
            return None
        self.model.load_state_dict(found["model"])
        self.optimizer.load_state_dict(found["optimizer"])
        self.scheduler.load_state_dict(found["scheduler"])
        mine = found["ranks"][self.cluster.rank]
        checkpoint.set_rng_state(mine["rng"])
        self.state, self.best, self.saved, self.resumed = found["loop"], found["best"], found["loop"]["step"], True
        self.say(f"resumed from step {self.saved} ({self.ckpt_dir})")
        return mine

    def step(self) -> None:
        """One optimizer step on the plan's next grad_accum x world batches; this rank takes its share,
        each micro-batch's loss weighted by its share of the step's target tokens."""
        s, data, device, world = self.state, self.data, self.device, self.cluster.world
        group = []
        for _ in range(self.per_step):
            batches = data.epoch(s["epoch"])
            group.append(batches[s["index"]])
            s["index"] += 1
            if s["index"] == len(batches):
                s["epoch"], s["index"] = s["epoch"] + 1, 0
        group_tokens = sum(data.target_tokens(idx) for idx in group)
        shard = group[self.cluster.rank::world]
        for i, idx in enumerate(shard):
            batch = data.batch(idx)
            # Padding is counted on the host copy, so it costs no device sync.
            self.pad[0] += sum(int((t == data.ids["pad_id"]).sum()) for t in batch[:2] if t is not None)
            self.pad[1] += sum(t.numel() for t in batch[:2] if t is not None)
            self.shape = [a + b for a, b in zip(self.shape, (1, len(batch[1]), 0 if batch[0] is None else
                                                              batch[0].shape[1], batch[1].shape[1]))]
            if self.cfg["compile"] and not data.lm:  # after the counts above: they describe the data
                batch = pad_for_compile(batch, data.ids["pad_id"], self.align, self.model.cfg.max_len)
            src, tgt_in, tgt_out = (to_device(t, device) for t in batch)
            n = data.target_tokens(idx)
            # Gradients are all-reduced once per optimizer step, after the last micro-batch.
            sync = self.ddp is self.model or i == len(shard) - 1
            with contextlib.nullcontext() if sync else self.ddp.no_sync():
                with autocast(device, self.precision == "bf16"):
                    _, loss = self.step_model(src, tgt_in, tgt_out)
                # DDP averages gradients over ranks; x world turns that into the token-weighted sum.
                (loss * (n * world / group_tokens)).backward()
            self.loss_sum += loss.detach().float() * n
            self.loss_tokens += n
            # In place with a Python scalar: building a tensor on the GPU here would sync every step.
            self.bad_step.masked_fill_(~torch.isfinite(loss.detach()) & (self.bad_step < 0), s["step"] + 1)
        if self.cfg["clip_grad_norm"]:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg["clip_grad_norm"])
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        s["step"] += 1
        s["tokens"] += group_tokens

    def log(self) -> None:
        """The train loss since the last log, over every rank: a curve row, MLflow, the progress line."""
        s = self.state
        self.check_finite()
        loss_total, tokens_total = all_reduce([float(self.loss_sum), self.loss_tokens], self.device)
        train_loss = loss_total / max(tokens_total, 1)
        lr = self.scheduler.get_last_lr()[0]
        s["train_rows"].append([s["step"], s["tokens"], train_loss, lr])
        now = time.perf_counter()
        tps = s["tokens"] / max(now - self.started, 1e-9)
        eta = (self.total_steps - s["step"]) * (now - self.here[1]) / max(s["step"] - self.here[0], 1)
        if self.tracker:
            self.tracker.log_metrics({"train_loss": train_loss, "lr": lr, "tokens": s["tokens"], "tokens_per_s": tps},
                                     s["step"])
        _report(self.bar, self.say, s["step"], self.total_steps, train_loss, lr, tps, eta, s["step"] - self.last_logged)
        self.last_logged = s["step"]
        self.loss_sum.zero_()
        self.loss_tokens = 0

    def evaluate(self) -> None:
        """The in-loop validation estimate (train.eval_windows): a curve row; the best so far kept."""
        s, cfg = self.state, self.cfg
        if cfg["eval_windows"] == "random":
            self.val_batches = self.data.val_batches(cfg["eval_examples"], "random", s["step"])
        # Validation runs eager: compiled, no_grad and eval mode are a second graph to compile (a
        # minute on CPU) for a pass that runs once every eval_every steps.
        val_loss = evaluate_loss(self.model, self.data, self.val_batches, self.device, self.precision == "bf16",
                                 self.cluster)
        s["val_rows"].append([s["step"], s["tokens"], val_loss])
        if self.bar is None:  # a stage's log (DVC, the grid): the estimates so far, also of a run cut short
            self.say(f"val estimate {val_loss:.4f} at step {s['step']}/{self.total_steps}")
        if cfg["keep"] == "best" and (self.best is None or val_loss < self.best["val_loss"]):
            self.best = {"step": s["step"], "val_loss": val_loss,
                         "state": {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}}
        if self.tracker:
            self.tracker.log_metrics({"val_loss": val_loss}, s["step"])

    def checkpoint(self) -> None:
        """Everything a resumed run needs to continue exactly, each rank's share in it; rank 0 writes."""
        s = self.state
        self.check_finite()
        s["elapsed"] = time.perf_counter() - self.started
        ranks = all_gather({"rng": checkpoint.rng_state(), "loss_acc": [float(self.loss_sum), self.loss_tokens],
                            "pad": list(self.pad), "shape": list(self.shape)})
        if self.cluster.main:
            checkpoint.save(self.ckpt_dir, s["step"], {
                "config_hash": self.run_hash, "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "rng": ranks[0]["rng"], "ranks": ranks, "loop": s, "best": self.best,
            }, self.cfg["keep_checkpoints"])
        self.saved = s["step"]

    def check_finite(self) -> None:
        """Raise on every rank if any rank saw a non-finite loss (the earliest step is named), saying
        which checkpoint, if any, holds the last good state."""
        step = int(self.bad_step)
        step = all_reduce([step if step >= 0 else math.inf], self.device, "min")[0]
        if step < math.inf:
            kept = (f"the checkpoint of step {self.saved} in {self.ckpt_dir} is the last good state"
                    if self.saved is not None else "no checkpoint was written before it")
            raise NonFiniteLoss(f"non-finite loss at step {int(step)}; {kept} (lower train.lr or raise "
                                "train.warmup_steps)")

    def finish(self) -> dict:
        """The run's metrics. train.keep = best loads the best estimate's weights into the model, and
        when that is not the last step, the last step's weights come back beside them (`last_state`)."""
        s, cfg, device = self.state, self.cfg, self.device
        if self.bar is not None:
            self.bar.close()
        wall = time.perf_counter() - self.started
        if self.cluster.world > 1:
            check_replicas_identical(self.model)
        pad = all_reduce(self.pad, device)
        shape = all_reduce(self.shape, device)
        kept_step, last_state = s["step"], None
        if cfg["keep"] == "best" and self.best is not None and self.best["step"] != s["step"]:
            kept_step = self.best["step"]
            last_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
            self.model.load_state_dict(self.best["state"])
        if self.tracker:
            self.tracker.log_metrics({"kept_step": kept_step}, s["step"])
        estimates = [row[2] for row in s["val_rows"]]
        return {
            "steps": s["step"], "tokens_trained": s["tokens"], "budget_tokens": self.budget_tokens,
            # passes over the training data (whole epochs + the share of the next): a seed's claim is
            # compared only within its budget class (pipeline/reporting/claims.py)
            "passes": s["epoch"] + s["index"] / len(self.data.epoch(s["epoch"])),
            "train_loss": s["train_rows"][-1][2] if s["train_rows"] else None,
            "val_loss": s["val_rows"][-1][2] if s["val_rows"] else None,
            "wall_time_s": wall, "tokens_per_s": s["tokens"] / max(wall, 1e-9),
            "padding_ratio": pad[0] / pad[1] if pad[1] else 0.0,
            "processed_tokens_per_s": (pad[1] - pad[0]) / max(wall, 1e-9),  # source + target, no pad, all ranks
            "batch_shape_mean": [x / shape[0] for x in shape[1:]] if shape[0] else None,  # rows, source, target
            "device": str(device), "world_size": self.cluster.world, "resumed": self.resumed,
            "gpu": claimed().record() if device.type == "cuda" and claimed() else None,
            "precision": self.precision, "compile": cfg["compile"], "fused_adamw": uses_fused(device, self.precision),
            "train_rows": s["train_rows"], "val_rows": s["val_rows"],
            # The in-loop estimates (train.eval_windows) and which model model.pt holds (train.keep).
            "eval_windows": cfg["eval_windows"], "eval_examples": cfg["eval_examples"], "keep": cfg["keep"],
            "kept_step": kept_step,
            "val_estimate_best": min(estimates) if estimates else None,
            "val_estimate_best_step": s["val_rows"][estimates.index(min(estimates))][0] if estimates else None,
            "val_estimate_last": estimates[-1] if estimates else None,
            "last_state": last_state,
        }



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
