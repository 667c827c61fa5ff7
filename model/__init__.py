"""Hand-built Transformer (pure torch): the paper's encoder-decoder and its ablations.

Design: one validated `ModelConfig`; `build_model` is the only place config meets classes.
Every switch and its values are written down once, in model/config.py (the table in
docs/pipeline-and-params.md is generated from it; docs/adding-a-switch.md adds one).
Attention is written out by hand (`attention.scaled_dot_product_attention`) next to PyTorch's
fused kernel, chosen once per module (`attention_impl`); heads run batched with fused q/k/v
projections. Residual/norm placement lives in one wrapper (`layers.Sublayer`). Decoder-only archs
run source + bos + target as one sequence, loss on the target. Decoding (greedy / beam / sampling)
runs on a KV cache, tested against full recomputation.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from typing import TYPE_CHECKING

from model.config import ModelConfig

if TYPE_CHECKING:
    from model.transformer import TransformerBase

__all__ = ["ModelConfig", "build_model", "TransformerBase", "EncoderDecoder", "DecoderOnly"]
# The classes import torch; the config does not. Imported when first used, so that checking a
# config (check_params, before any stage imports torch) costs no torch import.
_CLASSES = {"TransformerBase": "model.transformer", "EncoderDecoder": "model.encoder_decoder",
            "DecoderOnly": "model.decoder_only"}


def __getattr__(name: str):
    if name in _CLASSES:
        import importlib

        return getattr(importlib.import_module(_CLASSES[name]), name)
    raise AttributeError(f"module 'model' has no attribute {name!r}")


def build_model(cfg: ModelConfig | dict[str, Any]) -> TransformerBase:
    """Build the model a config describes. A dict (e.g. "model_config" from model.pt) is
    validated into a ModelConfig first; an unknown key is an error naming it."""
    from model.decoder_only import DecoderOnly
    from model.encoder_decoder import EncoderDecoder

    if isinstance(cfg, dict):
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise ValueError(f"ModelConfig has no field {unknown[0]!r}")
        cfg = ModelConfig(**cfg)
    if cfg.arch == "encoder_decoder":
        return EncoderDecoder(cfg)
    return DecoderOnly(cfg)
