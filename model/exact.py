"""Kernels whose CPU bits depend neither on the thread count nor on the CPU's maker, so that `bash
run.sh` (one thread a run), `dvc repro` (two) and another machine train the same weights. Each fix
computes the same maths in a fixed order; the forward is torch's own kernel, CUDA keeps torch's:

- `softmax`: ATen's CPU softmax backward splits a row across threads when the last dim is not a
  multiple of the vector width (8 floats on AVX2). Ours keeps torch's forward and writes out the
  backward, y * (g - sum(g * y)), each row summed whole in one thread.
- `one_thread_per_pair`: ATen's CPU kernels (flash-attention backward, bmm at some lengths) split a
  lone (batch, head) pair across threads; two pairs each stay in one. A lone pair gets a detached
  copy as a second batch row: masks broadcast, row 0 computes what the pair alone would, the copy
  gets no gradient. It costs one pair more on the rare step with one (one head, one sequence).
- `layer_norm`: torch's CPU LayerNorm backward sums the weight and bias gradients in one partial sum
  per thread. Ours takes the input gradient from torch's kernel (row by row: no thread sees
  another's rows) and the weight and bias gradients as plain sums over rows, whose order the shape
  alone sets (tests/test_model_norm.py).
- `writes_out`: torch's fused CPU kernel runs attention dropout through its math path (ATen's
  softmax backward) and multiplies in MKL, whose bits differ between CPU makers, out of reach of
  the products pipeline/cpu_numerics.py routes: there the written-out formula runs instead.

model/ stays pure torch, so this sits here and pipeline.cpu_numerics.engage fills WRITTEN_OUT_ON.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

# Device types where fused attention runs the written-out formula: "cpu" once cpu_numerics is
# engaged, and "meta" while the memory planner traces what the CPU's path keeps.
WRITTEN_OUT_ON: set[str] = set()


def backward_on_cpu(t: Tensor) -> bool:
    return t.device.type == "cpu" and t.requires_grad and torch.is_grad_enabled()


class _FixedOrderSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        y = torch.softmax(x, dim=-1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return y * (grad - (grad * y).sum(dim=-1, keepdim=True))


def softmax(x: Tensor) -> Tensor:
    """Softmax over the last dim; on the CPU, a backward summed row by row in one thread."""
    if backward_on_cpu(x):
        return _FixedOrderSoftmax.apply(x)
    return torch.softmax(x, dim=-1)  # CUDA, and no backward: torch's kernel


def one_thread_per_pair(attend: Callable) -> Callable:
    """`attend(q, k, v, **kw) -> (out, weights or None)`, run with a detached copy beside a lone
    (batch, head) pair whose gradients the CPU will compute."""
    @functools.wraps(attend)
    def wrapped(q: Tensor, k: Tensor, v: Tensor, **kw) -> tuple[Tensor, Tensor | None]:
        if q.shape[0] * q.shape[1] != 1 or not backward_on_cpu(q):
            return attend(q, k, v, **kw)
        out, weights = attend(*[torch.cat([t, t.detach()]) for t in (q, k, v)], **kw)
        return out[:1], None if weights is None else weights[:1]
    return wrapped


def writes_out(q: Tensor, dropout_p: float) -> bool:
    """Whether fused attention runs the written-out formula instead of torch's kernel."""
    return q.device.type in WRITTEN_OUT_ON or (dropout_p > 0 and backward_on_cpu(q))


class _FixedOrderLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, eps: float) -> Tensor:
        y, mean, rstd = torch.native_layer_norm(x, weight.shape, weight, bias, eps)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: Tensor):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = torch.ops.aten.native_layer_norm_backward(
                dy, x, weight.shape, mean, rstd, weight, bias, [True, False, False])[0]
        if dy.dtype != weight.dtype:  # bf16 autocast: x and dy bf16, the parameters float32
            dy, x = dy.to(weight.dtype), x.to(weight.dtype)
        rows = dy.reshape(-1, weight.shape[0])
        if ctx.needs_input_grad[1]:
            dw = (x - mean).mul_(rstd).mul_(dy).reshape_as(rows).sum(0)  # one new tensor, the rest in place
        if bias is not None and ctx.needs_input_grad[2]:
            db = rows.sum(0)
        return dx, dw, db, None


def layer_norm(x: Tensor, shape: tuple[int, ...], weight: Tensor | None, bias: Tensor | None,
               eps: float) -> Tensor:
    """F.layer_norm; training on the CPU, weight and bias gradients summed in a fixed order."""
    if (x.device.type != "cpu" or weight is None or len(shape) != 1
            or not (torch.is_grad_enabled() and weight.requires_grad)):
        return F.layer_norm(x, shape, weight, bias, eps)
    return _FixedOrderLayerNorm.apply(x, weight, bias, eps)
