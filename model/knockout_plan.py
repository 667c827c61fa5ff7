"""Which knock-outs a model has: the parts, modes and counterparts, and `plan`, which lists them.

Plain Python on a ModelConfig, no torch: check_params validates the knockout section with it
before any stage imports torch. The hooks that carry a knock-out out are in model/knockout.py.
- `plan` lists the knock-outs of one model, one at a time, plus the three test-time counterparts
  of train-time ablations: every head but head 0 (`n_heads: 1`), the positions (`positional:
  none`) and every skip connection (`residual: false`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from model.config import ModelConfig

KINDS = ("head", "attention", "ffn", "positional", "residual")
MODES = ("zero", "mean")
ATTENTIONS = ("self", "cross")
# What `plan` can be asked for; heads includes heads_but_one, residual includes residual.all.
PARTS = ("heads", "attention", "ffn", "positional", "residual")
# The knock-out that removes, after training, what each model switch removes before it.
COUNTERPARTS = {"heads_but_one": ("n_heads", 1), "positional": ("positional", "none"),
                "residual.all": ("residual", False)}


@dataclass(frozen=True)
class Knock:
    """One part to knock out. `stack`/`layer` locate it (positional: every stack); `attn` and
    `head` apply to heads and attention sublayers."""

    kind: str
    stack: str = "decoder"  # encoder | decoder
    layer: int = 0
    attn: str = "self"  # self | cross
    head: int = 0
    mode: str = "zero"  # zero | mean

    @property
    def name(self) -> str:
        where = f"{self.stack}.{self.attn}.L{self.layer}"
        return {"head": f"head.{where}.H{self.head}", "attention": f"attention.{where}",
                "ffn": f"ffn.{self.stack}.L{self.layer}", "residual": f"residual.{self.stack}.L{self.layer}",
                "positional": "positional"}[self.kind]


def stacks_of(cfg: ModelConfig) -> dict[str, int]:
    """Stack name -> number of layers."""
    if cfg.arch == "encoder_decoder":
        return {"encoder": cfg.n_encoder_layers, "decoder": cfg.n_decoder_layers}
    return {"decoder": cfg.n_decoder_layers}


def attentions_of(cfg: ModelConfig, stack: str) -> tuple[str, ...]:
    return ("self", "cross") if cfg.arch == "encoder_decoder" and stack == "decoder" else ("self",)


def check(cfg: ModelConfig, knock: Knock) -> None:
    """ValueError naming the Knock field the model `cfg` describes has no part for."""
    if knock.kind not in KINDS:
        raise ValueError(f"kind {knock.kind!r}: one of {', '.join(KINDS)}")
    if knock.mode not in MODES:
        raise ValueError(f"mode {knock.mode!r}: one of {', '.join(MODES)}")
    if knock.kind == "positional":
        if cfg.positional == "none" and not cfg.relative_bias:
            raise ValueError("positional: the model has no position information (positional: none)")
        if knock.mode == "mean" and cfg.positional not in ("sinusoidal", "learned"):
            raise ValueError(f"positional: mean-ablation needs absolute positions, not {cfg.positional!r}")
        return
    stacks = stacks_of(cfg)
    if knock.stack not in stacks:
        raise ValueError(f"stack {knock.stack!r}: a {cfg.arch} model has {', '.join(stacks)}")
    if not 0 <= knock.layer < stacks[knock.stack]:
        raise ValueError(f"layer {knock.layer}: the {knock.stack} has layers 0..{stacks[knock.stack] - 1}")
    if knock.kind == "residual" and not cfg.residual:
        raise ValueError("residual: the model has no residual connections (residual: false)")
    if knock.kind in ("head", "attention") and knock.attn not in attentions_of(cfg, knock.stack):
        raise ValueError(f"attn {knock.attn!r}: the {knock.stack} of a {cfg.arch} model has "
                         f"{' and '.join(attentions_of(cfg, knock.stack))}-attention only")
    if knock.kind == "head" and not 0 <= knock.head < cfg.n_heads:
        raise ValueError(f"head {knock.head}: the model has n_heads={cfg.n_heads} (heads 0..{cfg.n_heads - 1})")


def plan(cfg: ModelConfig, parts: Sequence[str] | None = None, attentions: Sequence[str] | None = None,
         heads: Sequence[int] | None = None,
         modes: Sequence[str] = MODES) -> list[tuple[str, str, tuple[Knock, ...]]]:
    """(name, mode, knocks) for every knock-out of `parts`, one at a time, in each mode.

    parts None: every part the model has; attentions/heads restrict the heads and attention
    sublayers (None: all the model has). A name the model has no part for is a ValueError starting
    with the argument's name. Combinations with no meaning (mean-ablation of RoPE) are left out.
    """
    if parts is None:
        lacks = {"positional": cfg.positional == "none" and not cfg.relative_bias, "residual": not cfg.residual}
        parts = [p for p in PARTS if not lacks.get(p)]
    for part in parts:
        if part not in PARTS:
            raise ValueError(f"parts: {part!r} is not one of {', '.join(PARTS)}")
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"modes: {mode!r} is not one of {', '.join(MODES)}")
    have = {a for s in stacks_of(cfg) for a in attentions_of(cfg, s)}
    for attn in attentions or ():
        if attn not in have:
            raise ValueError(f"attentions: {attn!r}: a {cfg.arch} model has {' and '.join(sorted(have))}-attention only")
    for head in heads or ():
        if not 0 <= head < cfg.n_heads:
            raise ValueError(f"heads: head {head} is beyond the model's n_heads={cfg.n_heads} (heads 0..{cfg.n_heads - 1})")
    if "positional" in parts and cfg.positional == "none" and not cfg.relative_bias:
        raise ValueError("parts: positional: the model has no position information (positional: none)")
    if "residual" in parts and not cfg.residual:
        raise ValueError("parts: residual: the model has no residual connections (residual: false)")
    attentions = list(attentions or ATTENTIONS)
    heads = list(range(cfg.n_heads)) if heads is None else list(heads)
    where = [(s, i, a) for s, n in stacks_of(cfg).items() for i in range(n) for a in attentions_of(cfg, s)
             if a in attentions]
    out = []
    for mode in modes:
        sets: list[tuple[str, tuple[Knock, ...]]] = []
        if "heads" in parts:
            sets += [(k.name, (k,)) for s, i, a in where for h in heads
                     for k in [Knock("head", s, i, a, h, mode)]]
            if cfg.n_heads > 1:
                sets.append(("heads_but_one", tuple(Knock("head", s, i, a, h, mode) for s, n in stacks_of(cfg).items()
                                                    for i in range(n) for a in attentions_of(cfg, s)
                                                    for h in range(1, cfg.n_heads))))
        if "attention" in parts:
            sets += [(k.name, (k,)) for s, i, a in where for k in [Knock("attention", s, i, a, mode=mode)]]
        if "ffn" in parts:
            sets += [(k.name, (k,)) for s, n in stacks_of(cfg).items() for i in range(n)
                     for k in [Knock("ffn", s, i, mode=mode)]]
        if "positional" in parts and (mode == "zero" or cfg.positional in ("sinusoidal", "learned")):
            sets.append(("positional", (Knock("positional", mode=mode),)))
        if "residual" in parts:
            every = tuple(Knock("residual", s, i, mode=mode) for s, n in stacks_of(cfg).items() for i in range(n))
            sets += [(k.name, (k,)) for k in every] + [("residual.all", every)]
        out += [(name, mode, knocks) for name, knocks in sets]
    return out
