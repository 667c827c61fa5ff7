"""LayerNorm whose gradients on CPU do not depend on the number of threads.

torch's CPU LayerNorm backward sums the weight and bias gradients in one partial sum per thread,
so one run trained with 1 thread (`bash run.sh`: two runs side by side on 2 cores) and with 2
(`dvc repro`) differ in the last bits from the first step on and end with other weights and
losses: the same params, seed and machine gave two answers. Here the input gradient still comes
from torch's kernel (it works row by row, so no thread sees another's rows) and the weight and
bias gradients are plain sums over rows, which torch adds up in an order set by the shape alone
(tests/test_model_norm.py; tests/test_trainer.py trains with 1, 2 and 3 threads).
The forward is torch's own kernel, so outputs are unchanged; CUDA keeps torch's fused kernel.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable


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


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm (same parameters, state dict and outputs) with thread-count-free gradients
    when it trains on CPU."""

    def forward(self, x: Tensor) -> Tensor:
        if (x.device.type != "cpu" or self.weight is None or len(self.normalized_shape) != 1
                or not (torch.is_grad_enabled() and self.weight.requires_grad)):
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return _FixedOrderLayerNorm.apply(x, self.weight, self.bias, self.eps)
