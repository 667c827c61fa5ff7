"""The output layer and its cross-entropy in one pass over row chunks: the logits of the whole batch
never exist at once (docs/gpu.md#the-124m-model-mfu's logits hypothesis, one step past the
loss-only step).

At GPT-2 small's 32 x 1024 tokens the logits are 32768 x 50304: 3.3 GB in bf16, twice that as the
float32 the loss reads, and their gradient as much again, each written and read back. Here each
chunk of rows makes its logits, its part of the loss and its gradients (the layer's input and
weight) in the forward pass and drops its logits; the backward pass only scales what was saved.
The products are a plain output layer's (one forward, two backward), so the FLOPs counted for MFU
are the same. Not used by the train stage: a benchmark runner until a GPU shows it pays.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

CHUNK_ROWS = 8192  # 32768 x 50304's logits in 4 pieces of 0.8 GB (bf16)


class LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, targets: Tensor, ignore_index: int, chunk: int) -> Tensor:
        device = h.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else h.dtype
        with torch.autocast(device, enabled=False):  # the casts below are autocast's, made once
            x, w = h.to(dtype), weight.to(dtype)
            keep = targets != ignore_index
            count = keep.sum().clamp(min=1)
            picked_at = targets.clamp(min=0)[:, None]  # an ignored row's target: any column, weighed 0
            loss = torch.zeros((), dtype=torch.float32, device=h.device)
            grad_h = torch.empty(h.shape, dtype=dtype, device=h.device)
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=h.device)
            for start in range(0, h.shape[0], chunk):
                rows = slice(start, start + chunk)
                logits = (x[rows] @ w.t()).float()  # as the model's loss reads them: float32
                lse = torch.logsumexp(logits, dim=-1)
                weigh = keep[rows].float() / count
                loss = loss + ((lse - logits.gather(1, picked_at[rows]).squeeze(1)) * weigh).sum()
                grad = torch.exp(logits - lse[:, None])  # softmax, minus one at the target, per row's weight
                grad.scatter_add_(1, picked_at[rows], torch.full_like(lse[:, None], -1.0))
                grad = (grad * weigh[:, None]).to(dtype)
                grad_h[rows] = grad @ w
                grad_w += (grad.t() @ x[rows]).float()
        ctx.save_for_backward(grad_h.to(h.dtype), grad_w.to(weight.dtype))
        return loss

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_loss, grad_w * grad_loss, None, None, None


def linear_cross_entropy(h: Tensor, weight: Tensor, targets: Tensor, ignore_index: int = -100,
                         chunk: int = CHUNK_ROWS) -> Tensor:
    """F.cross_entropy(F.linear(h, weight).float(), targets, ignore_index=ignore_index): h (N, D),
    weight (V, D), targets (N,)."""
    return LinearCrossEntropy.apply(h, weight, targets, ignore_index, chunk)


class FusedHead(nn.Module):
    """Our decoder-only model with its output layer and loss taken by linear_cross_entropy; called
    as the model is, (src, tgt_in, tgt_out) -> (None, loss)."""

    def __init__(self, model: nn.Module, chunk: int = CHUNK_ROWS) -> None:
        super().__init__()
        self.model, self.chunk = model, chunk

    def forward(self, src, x: Tensor, y: Tensor) -> tuple[None, Tensor]:
        h, _, _ = self.model._run(src, x)
        weight = self.model.head.weight if self.model.head is not None else self.model.embed.weight
        loss = linear_cross_entropy(h.reshape(-1, h.shape[-1]), weight, y.reshape(-1), self.model.cfg.pad_id,
                                    self.chunk)
        return None, loss
