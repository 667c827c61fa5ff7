"""A GPT written to nanoGPT's recipe (model.py and train.py, commit 3adf61e), to check ours against.

This project's own few lines, not nanoGPT's code, kept faithful where results depend on it: where
dropout falls (none on the MLP's hidden layer), the init (residual output projections scaled by
1/sqrt(2 * n_layer)), the optimizer's decay groups and get_lr; no biases (the Shakespeare recipe's
bias=False). `copy_weights(ref, ours)` loads these weights into our decoder-only model of the same
shape, for tests/test_nanogpt_recipe.py's training-mode equivalence and benchmarks/nanogpt_proxy.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class GPTShape:
    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float
    # F.gelu's approximate: "none", nn.GELU() today; "tanh", new_gelu at nanoGPT's commit 23a8e701.
    gelu: str = "none"


class SelfAttention(nn.Module):
    def __init__(self, s: GPTShape) -> None:
        super().__init__()
        self.n_head, self.dropout = s.n_head, s.dropout
        self.c_attn = nn.Linear(s.n_embd, 3 * s.n_embd, bias=False)
        self.c_proj = nn.Linear(s.n_embd, s.n_embd, bias=False)
        self.resid_dropout = nn.Dropout(s.dropout)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
                   for z in self.c_attn(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c)))


class MLP(nn.Module):
    def __init__(self, s: GPTShape) -> None:
        super().__init__()
        self.c_fc = nn.Linear(s.n_embd, 4 * s.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * s.n_embd, s.n_embd, bias=False)
        self.dropout = nn.Dropout(s.dropout)
        self.gelu = s.gelu

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate=self.gelu)))


class Block(nn.Module):
    def __init__(self, s: GPTShape) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(s.n_embd, bias=False), nn.LayerNorm(s.n_embd, bias=False)
        self.attn, self.mlp = SelfAttention(s), MLP(s)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, s: GPTShape) -> None:
        super().__init__()
        self.shape = s
        self.wte, self.wpe = nn.Embedding(s.vocab_size, s.n_embd), nn.Embedding(s.block_size, s.n_embd)
        self.drop = nn.Dropout(s.dropout)
        self.h = nn.ModuleList(Block(s) for _ in range(s.n_layer))
        self.ln_f = nn.LayerNorm(s.n_embd, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
        for block in self.h:
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * s.n_layer))

    def forward(self, idx: Tensor, targets: Tensor) -> Tensor:
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device)))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied output layer
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)


def optimizer(model: GPT, lr: float, betas: tuple[float, float], weight_decay: float) -> torch.optim.AdamW:
    """nanoGPT's groups: decay on every parameter of 2 or more dimensions, none on the rest."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


def lr_at(it: int, lr: float, warmup: int, decay_iters: int, min_lr: float) -> float:
    """nanoGPT's get_lr: linear warmup, cosine decay to min_lr, then min_lr."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay_iters:
        return min_lr
    ratio = (it - warmup) / (decay_iters - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def lr_at_23a8e701(it: int, lr: float, warmup: int, decay_iters: int, min_lr: float) -> float:
    """get_lr at nanoGPT's commit 23a8e701: the warmup lr * it / warmup (it = 0 trains at lr 0), then as lr_at."""
    if it < warmup:
        return lr * it / warmup
    return lr_at(it, lr, warmup, decay_iters, min_lr)


# Our parameter name -> nanoGPT's, per layer i (decoder-only, pre-norm, no biases, tied output).
LAYER_NAMES = {
    "decoder.layers.{i}.self_sub.norm.weight": "h.{i}.ln_1.weight",
    "decoder.layers.{i}.self_attn.qkv_proj.weight": "h.{i}.attn.c_attn.weight",
    "decoder.layers.{i}.self_attn.out_proj.weight": "h.{i}.attn.c_proj.weight",
    "decoder.layers.{i}.ffn_sub.norm.weight": "h.{i}.ln_2.weight",
    "decoder.layers.{i}.ffn.w_in.weight": "h.{i}.mlp.c_fc.weight",
    "decoder.layers.{i}.ffn.w_out.weight": "h.{i}.mlp.c_proj.weight",
}
MODEL_NAMES = {"embed.weight": "wte.weight", "decoder.abs_pos.embedding.weight": "wpe.weight",
               "decoder.final_norm.weight": "ln_f.weight"}


def name_map(n_layer: int) -> dict[str, str]:
    """Every parameter of our model -> the nanoGPT parameter it corresponds to."""
    names = dict(MODEL_NAMES)
    for i in range(n_layer):
        names.update({ours.format(i=i): ref.format(i=i) for ours, ref in LAYER_NAMES.items()})
    return names


def copy_weights(ref: GPT, ours: nn.Module) -> None:
    """Load `ref`'s weights into `ours`; every parameter of ours must have its counterpart."""
    theirs = dict(ref.named_parameters())
    names = name_map(ref.shape.n_layer)
    mine = dict(ours.named_parameters())
    if set(mine) != set(names):
        raise ValueError(f"parameters without a nanoGPT counterpart: {sorted(set(mine) ^ set(names))}")
    with torch.no_grad():
        for name, p in mine.items():
            p.copy_(theirs[names[name]])
