"""Knock-outs: remove one part of a trained model at evaluation time, without retraining.

    with knockout(model, Knock("head", stack="decoder", attn="cross", layer=1, head=2)):
        logits, loss = model(src, tgt_in, tgt_out)

Design decisions:
- Forward hooks (and one switch, `layers.Sublayer.skip`) added on entry and removed on exit:
  outside the context the model is the trained one, and a knock-out of nothing is the plain
  forward, bit for bit. The hooks sit on the modules the full forward and cached decoding both
  call, so generation sees the same knocked-out model.
- zero-ablation replaces the part's output by zeros; mean-ablation by its mean over the tokens of
  a held-out batch (`record_means`), which keeps the activation's constant offset and removes only
  what depends on the input (zeroing also shifts what every later layer sees).
- The parts: a head (its slice of the concatenated head outputs before the output projection, so
  the other heads are untouched); a whole attention or FFN sublayer (its output; the residual
  around it stays); the positions of every stack (absolute table, RoPE rotation, relative bias);
  a layer's skip connections (the `x +` of each of its sublayers, what `residual: false` removes).
- What a model can have knocked out, and `plan` listing it, are in model/knockout_plan.py
  (no torch: check_params uses them); imported here too, so `model.knockout` has it all.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from model.knockout_plan import (ATTENTIONS, COUNTERPARTS, KINDS, MODES, PARTS, Knock,  # noqa: F401
                                 attentions_of, check, plan, stacks_of)
from model.layers import Sublayer
from model.stack import Stack

def _stacks(model: nn.Module) -> dict[str, Stack]:
    return {name: getattr(model, name) for name in ("encoder", "decoder")
            if isinstance(getattr(model, name, None), Stack)}


def _sublayers(layer: nn.Module) -> dict[str, Sublayer]:
    subs = {"self": layer.self_sub, "cross": layer.cross_sub, "ffn": layer.ffn_sub}
    return {name: sub for name, sub in subs.items() if sub is not None}


def _attention(layer: nn.Module, attn: str) -> nn.Module:
    return layer.self_attn if attn == "self" else layer.cross_attn


def _positions(module: nn.Module, x: Tensor, pos: Tensor) -> Tensor:
    """The vectors AbsolutePositions adds to x, broadcast to x's shape."""
    table = module.embedding(pos) if module.kind == "learned" else module.table[pos]
    return table.to(x.dtype).expand(x.shape)


@contextmanager
def record_means(model: nn.Module) -> Iterator[dict[str, Tensor]]:
    """Mean of every activation a mean-ablation replaces, over all tokens the model is run on
    inside the context (feed it unpadded rows: padding would enter the means). The dict is
    filled on exit; keys name the activation, e.g. "decoder.1.cross.heads"."""
    sums: dict[str, list] = {}

    def add(key: str, t: Tensor) -> None:
        flat = t.detach().reshape(-1, t.shape[-1]).double()  # float64 sums: many tokens, no drift
        acc = sums.setdefault(key, [0.0, 0])
        acc[0], acc[1] = acc[0] + flat.sum(0), acc[1] + flat.shape[0]

    def on_input(key: str):
        return lambda module, args: add(key, args[0])

    def on_output(key: str):
        return lambda module, args, out: add(key, out[0] if isinstance(out, tuple) else out)

    handles = []
    for s, stack in _stacks(model).items():
        if stack.abs_pos is not None:
            handles.append(stack.abs_pos.register_forward_pre_hook(
                lambda module, args, s=s: add(f"{s}.positions", _positions(module, *args))))
        for i, layer in enumerate(stack.layers):
            for attn in ATTENTIONS:
                mha = _attention(layer, attn)
                if mha is not None:
                    handles.append(mha.out_proj.register_forward_pre_hook(on_input(f"{s}.{i}.{attn}.heads")))
                    handles.append(mha.register_forward_hook(on_output(f"{s}.{i}.{attn}.out")))
            handles.append(layer.ffn.register_forward_hook(on_output(f"{s}.{i}.ffn.out")))
            for name, sub in _sublayers(layer).items():
                handles.append(sub.register_forward_pre_hook(on_input(f"{s}.{i}.{name}.skip")))
    means: dict[str, Tensor] = {}
    try:
        yield means
    finally:
        for handle in handles:
            handle.remove()
        means.update({key: (total / n).float() for key, (total, n) in sums.items() if n})


def _mean(means: dict[str, Tensor] | None, key: str) -> Tensor:
    if not means or key not in means:
        raise ValueError(f"mean-ablation needs the mean of {key!r}: run the model inside record_means first")
    return means[key]


def _fill(like: Tensor, value: Tensor | None) -> Tensor:
    """zeros like `like`, or `value` (D,) broadcast to its shape."""
    return torch.zeros_like(like) if value is None else value.to(like).expand(like.shape)


@contextmanager
def knockout(model: nn.Module, *knocks: Knock, means: dict[str, Tensor] | None = None) -> Iterator[nn.Module]:
    """The model with `knocks` applied inside the context, restored on exit (even on error).
    Mean-ablations read `means` from record_means."""
    handles, switched = [], []
    try:
        for knock in knocks:
            check(model.cfg, knock)
            mean = knock.mode == "mean"
            stacks = _stacks(model)
            if knock.kind == "positional":
                for s, stack in stacks.items():
                    if stack.abs_pos is not None:
                        value = _mean(means, f"{s}.positions") if mean else None
                        handles.append(stack.abs_pos.register_forward_hook(
                            lambda m, args, out, value=value: args[0] if value is None else args[0] + value.to(args[0])))
                    if stack.rope is not None:  # no rotation: q and k as projected
                        handles.append(stack.rope.register_forward_hook(lambda m, args, out: args[0]))
                    if stack.rel_bias is not None:  # its mean is a constant per head, which softmax ignores
                        handles.append(stack.rel_bias.register_forward_hook(lambda m, args, out: torch.zeros_like(out)))
                continue
            layer = stacks[knock.stack].layers[knock.layer]
            key = f"{knock.stack}.{knock.layer}"
            if knock.kind == "head":
                mha = _attention(layer, knock.attn)
                cols = slice(knock.head * mha.head_dim, (knock.head + 1) * mha.head_dim)
                value = _mean(means, f"{key}.{knock.attn}.heads")[cols] if mean else None

                def drop_head(m, args, cols=cols, value=value):
                    h = args[0].clone()  # (B, L, H*Dh): the heads side by side
                    h[..., cols] = 0.0 if value is None else value.to(h)
                    return (h, *args[1:])

                handles.append(mha.out_proj.register_forward_pre_hook(drop_head))
            elif knock.kind == "attention":
                value = _mean(means, f"{key}.{knock.attn}.out") if mean else None
                handles.append(_attention(layer, knock.attn).register_forward_hook(
                    lambda m, args, out, value=value: (_fill(out[0], value), out[1])))
            elif knock.kind == "ffn":
                value = _mean(means, f"{key}.ffn.out") if mean else None
                handles.append(layer.ffn.register_forward_hook(lambda m, args, out, value=value: _fill(out, value)))
            else:  # residual: every sublayer's skip connection in this layer
                for name, sub in _sublayers(layer).items():
                    value = _mean(means, f"{key}.{name}.skip") if mean else None
                    sub.skip = lambda x, value=value: _fill(x, value)
                    switched.append(sub)
        yield model
    finally:
        for handle in handles:
            handle.remove()
        for sub in switched:
            sub.skip = None
