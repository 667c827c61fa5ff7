"""The `train` section: the budget every variant trains to, the optimizer, its schedule, the
in-loop estimate and where and how the runs execute."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.params.section import Section


class TrainParams(Section):
    device: Literal["auto", "cpu", "cuda"] = "auto"
    budget_tokens: int = Field(1_000_000, gt=0)  # target tokens seen by every variant (fair budget)
    budget_steps: int | None = Field(None, gt=0)  # if set, train this many optimizer steps instead
    # If set, every run trains to this many training FLOPs (pipeline.train.flops_per_target_token, the
    # count behind MFU) instead: a variant cheaper per token sees more tokens.
    budget_flops: float | None = Field(None, gt=0)
    batch_tokens: int = Field(4096, gt=0)  # seq2seq: cap on padded tokens per batch
    batch_size: int = Field(32, gt=0)  # language modelling: windows per batch
    context: int = Field(256, gt=1)  # language modelling: window length
    # language modelling: `grid`, non-overlapping windows shuffled each epoch; `random`, as many at random
    # starts (nanoGPT's sampling): over many epochs a model overfits a fixed grid's windows.
    lm_windows: Literal["grid", "random"] = "grid"
    grad_accum: int = Field(1, gt=0)
    lr: float = Field(1e-3, gt=0)
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.98)  # AdamW
    eps: float = Field(1e-9, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    decay_embeddings: bool = False  # decay embedding tables too (nanoGPT's rule); default: exempt
    schedule: Literal["constant", "cosine", "inverse_sqrt", "linear"] = "cosine"
    warmup_steps: int = Field(100, ge=0)
    # The warmup's first step: one, lr * (step + 1) / warmup_steps (the first step trains at lr / warmup_steps);
    # zero, lr * step / warmup_steps (the first step at lr 0: nanoGPT's get_lr at commit 23a8e701). step from 0.
    warmup_start: Literal["one", "zero"] = "one"
    min_lr_ratio: float = Field(0.1, ge=0, le=1)  # cosine/linear floor as a fraction of lr
    clip_grad_norm: float | None = Field(1.0, gt=0)
    eval_every: int = Field(100, gt=0)  # steps between validation passes
    eval_examples: int = Field(256, gt=0)  # validation examples / LM windows of each in-loop estimate
    # Language modelling: which windows the in-loop estimate scores. first: the split's first
    # eval_examples non-overlapping windows, the same at every evaluation (a low-noise curve for
    # comparing variants). random: eval_examples windows at random starts over the whole split,
    # drawn anew at every evaluation from (seed, step): nanoGPT's estimate of the whole-split loss.
    eval_windows: Literal["first", "random"] = "first"
    # The model the stage hands on (model.pt): last, the final step's (equal budgets for every
    # variant); best, the one with the lowest in-loop estimate (nanoGPT keeps its best checkpoint).
    keep: Literal["last", "best"] = "last"
    log_every: int = Field(20, gt=0)
    checkpoint_every: int = Field(200, gt=0)
    keep_checkpoints: int = Field(2, gt=0)
    compile: bool = False  # torch.compile (inductor) of the training step, on CUDA or CPU (needs a C++ compiler)
    # bf16 autocast or float32. auto: bf16 on CUDA, fp32 on CPU (bit-identical to earlier CPU
    # results). bf16 on CPU also takes the fused AdamW kernel (pipeline.training.optim says why).
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    threads: int = Field(0, ge=0)  # CPU threads for torch; 0 = auto: the cores free when the stage starts
    # Runs sharing a GPU, each under a slot lock (pipeline.training.gpu_lock): auto = as many as its memory
    # holds by the run's estimated peak, at most one per CPU core of the GPU's share and 16. Reruns training.
    runs_per_gpu: int | str = "auto"

    @field_validator("runs_per_gpu", mode="before")
    @classmethod
    def _runs_per_gpu(cls, value: Any) -> int | str:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            return value
        raise ValueError("must be auto or a whole number of runs, at least 1")

    @model_validator(mode="after")
    def _one_budget(self) -> "TrainParams":
        if self.budget_flops is not None and self.budget_steps is not None:
            raise ValueError("train.budget_flops and train.budget_steps are both set; keep one "
                             "(budget_tokens is the default when neither is)")
        return self
