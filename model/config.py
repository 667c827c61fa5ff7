"""ModelConfig: the one validated description of a model; `build_model` is the only consumer.

Defaults reproduce the base Transformer of "Attention Is All You Need" (Vaswani et al., 2017):
encoder-decoder, post-norm LayerNorm, ReLU FFN, sinusoidal positions, residual connections,
embeddings scaled by sqrt(d_model), source/target embeddings shared and tied to the output layer.
Every other value of a switch is an ablation of that model.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

ARCHS = ("encoder_decoder", "decoder_only", "prefix_lm", "target_lm")
POSITIONALS = ("sinusoidal", "learned", "rope", "relative", "none")
NORMS = ("layernorm", "rmsnorm", "none")  # none: the "no normalization" ablation
NORM_POSITIONS = ("post", "pre")
FFNS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu")
ATTENTION_IMPLS = ("manual", "sdpa")
INITS = ("xavier", "gpt2")
DECODER_MASKS = ("causal", "future_only")

_CHOICES = {
    "arch": ARCHS,
    "positional": POSITIONALS,
    "norm": NORMS,
    "norm_position": NORM_POSITIONS,
    "ffn": FFNS,
    "attention_impl": ATTENTION_IMPLS,
    "init": INITS,
    "decoder_mask": DECODER_MASKS,
}


@dataclass
class ModelConfig:
    """Hyperparameters and switches of the Transformer; validated on construction.

    Layer-count rule: encoder_decoder uses n_encoder_layers + n_decoder_layers; decoder_only,
    prefix_lm and target_lm have a single stack of n_decoder_layers layers and ignore
    n_encoder_layers (to compare at equal size, set n_decoder_layers in the ablation).

    Two switches reproduce defects of the seed studies, to explain their numbers; they are never a
    baseline and their defaults are the correct model: decoder_mask future_only (seed 000's mask
    bug) and arch target_lm (our hypothesis of seed 003's "decoder-only": one that saw no source).
    """

    vocab_size: int = 8000  # one vocabulary for source and target (shared SentencePiece model)
    d_model: int = 512  # residual stream width
    n_heads: int = 8  # d_model must divide evenly; 1 is allowed (single-head ablation)
    n_encoder_layers: int = 6  # encoder_decoder only
    n_decoder_layers: int = 6  # the decoder, or the only stack for decoder_only / prefix_lm
    d_ff: int = 2048  # FFN hidden width; swiglu uses round(2 * d_ff / 3) to keep the parameter count
    dropout: float = 0.1  # on embeddings, sublayer outputs and (unless ffn_dropout says otherwise) the FFN hidden layer
    # On the FFN's hidden layer; None: `dropout`, as before this field existed. GPT-2 and nanoGPT
    # drop out only the FFN's output (the sublayer's), so their recipes set 0 here.
    ffn_dropout: float | None = None
    # On attention weights. The paper has none (only residual and embedding dropout), and without
    # it the fused attention kernel can take its flash path; nn.Transformer uses `dropout` here.
    attention_dropout: float = 0.0
    max_len: int = 512  # longest sequence (decoder_only: source + target) the positions cover
    # encoder_decoder | decoder_only | prefix_lm | target_lm (our hypothesis of seed study 003's
    # "decoder-only", which it does not describe; never a baseline: no encoder and no source, a language model over
    # bos + target alone, trained and scored on the same target tokens; it decodes unconditionally)
    arch: str = "encoder_decoder"  # the single-stack archs ignore n_encoder_layers
    positional: str = "sinusoidal"  # sinusoidal | learned | rope | relative | none
    rope_theta: float = 10000.0  # RoPE base; larger = slower rotation, longer wavelengths
    rel_buckets: int = 32  # T5 relative-bias buckets (half per direction when bidirectional)
    rel_max_distance: int = 128  # distances beyond this share the last bucket
    # Adds the relative bias on top of an absolute scheme (sinusoidal + relative, as in the Tiny
    # Shakespeare study); positional="relative" is the bias alone.
    relative_bias: bool = False
    norm: str = "layernorm"  # layernorm | rmsnorm | none (every norm removed, the final one too)
    norm_position: str = "post"  # post (paper) | pre (adds a final norm after each stack)
    norm_eps: float = 1e-5  # matches torch.nn.LayerNorm / nn.Transformer
    ffn: str = "relu"  # relu | gelu | gelu_tanh (tanh approximation, as GPT-2 and nanoGPT 23a8e701) | silu | swiglu
    residual: bool = True  # False removes every residual connection (ablation; hard to train deep)
    attention_impl: str = "sdpa"  # sdpa (fused kernel) | manual (written-out math); same results
    # RMSNorm on each head's queries and keys before their dot product (a gain per head dimension,
    # shared by the heads, as in Qwen3 and Gemma 3), in self- and cross-attention; the KV cache
    # holds the normed keys. Bounds the attention logits; its gains count as attention parameters.
    qk_norm: bool = False  # false: the paper's attention
    share_embeddings: bool = True  # one token table for encoder and decoder (no effect single-stack)
    tie_output: bool = True  # output projection reuses the (target) token embedding
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model), as in the paper
    bias: bool = True  # biases in linear layers and LayerNorm (False: slightly fewer params)
    # xavier (Xavier-uniform linear layers as nn.Transformer, token tables std d_model^-0.5) | gpt2
    # (GPT-2 and nanoGPT: weights and tables std 0.02, the projections writing into the residual
    # stream std 0.02 / sqrt of their stack's residual sublayers, 2 a layer or 3 with cross-attention)
    init: str = "xavier"  # the initial weights
    # causal | future_only (seed study 000's mask bug, to reproduce its numbers, never a baseline:
    # each target position attends only to later ones, the next token included, and the last one
    # averages every position uniformly; decoding recomputes every step, with no KV cache)
    decoder_mask: str = "causal"  # the decoder's self-attention mask (encoder and cross-attention keep theirs)
    pad_id: int = 0
    bos_id: int = 2  # starts tgt_in; also the source/target separator in decoder-only archs
    eos_id: int = 3  # generation stops here

    def __post_init__(self) -> None:
        self._check_types()
        for name, choices in _CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise ValueError(f"ModelConfig.{name} must be one of {list(choices)}, got {value!r}")
        self._check_positive("vocab_size", "d_model", "n_heads", "n_decoder_layers", "d_ff",
                             "max_len", "rel_buckets", "rel_max_distance")
        if self.n_encoder_layers < 0:
            raise ValueError(f"ModelConfig.n_encoder_layers must be >= 0, got {self.n_encoder_layers}")
        if self.arch == "encoder_decoder" and self.n_encoder_layers < 1:
            raise ValueError("ModelConfig.n_encoder_layers must be >= 1 for arch='encoder_decoder'")
        if self.d_model % self.n_heads:
            raise ValueError(f"ModelConfig.d_model ({self.d_model}) must be divisible by "
                             f"n_heads ({self.n_heads})")
        if self.positional == "rope" and (self.d_model // self.n_heads) % 2:
            raise ValueError(f"ModelConfig.positional='rope' needs an even head size, got "
                             f"d_model/n_heads = {self.d_model // self.n_heads}")
        for name in ("dropout", "attention_dropout", "ffn_dropout"):
            if getattr(self, name) is not None and not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"ModelConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.rope_theta <= 0:
            raise ValueError(f"ModelConfig.rope_theta must be > 0, got {self.rope_theta}")
        if self.norm_eps <= 0:
            raise ValueError(f"ModelConfig.norm_eps must be > 0, got {self.norm_eps}")
        if self.relative_bias and self.positional not in ("sinusoidal", "learned"):
            raise ValueError(f"ModelConfig.relative_bias adds the relative bias to sinusoidal or learned "
                             f"positions, not to positional={self.positional!r} (positional='relative' "
                             "is the bias alone)")
        if self.decoder_mask == "future_only" and self.arch == "prefix_lm":
            raise ValueError("ModelConfig.decoder_mask='future_only' is not defined for arch='prefix_lm' "
                             "(seed 000's bug had no bidirectional prefix): use decoder_only or encoder_decoder")
        if self.rel_buckets < 4:
            raise ValueError(f"ModelConfig.rel_buckets must be >= 4, got {self.rel_buckets}")
        if self.rel_max_distance < self.rel_buckets:
            raise ValueError(f"ModelConfig.rel_max_distance ({self.rel_max_distance}) must be >= "
                             f"rel_buckets ({self.rel_buckets})")
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if not 0 <= value < self.vocab_size:
                raise ValueError(f"ModelConfig.{name} must be in [0, vocab_size={self.vocab_size}), "
                                 f"got {value}")
        for name in ("bos_id", "eos_id"):
            if getattr(self, name) == self.pad_id:
                raise ValueError(f"ModelConfig.{name} must differ from pad_id ({self.pad_id}): "
                                 "padding is detected by id")

    @property
    def ffn_hidden_dropout(self) -> float:
        """The FFN hidden layer's dropout: ffn_dropout, or `dropout` when that is None."""
        return self.dropout if self.ffn_dropout is None else self.ffn_dropout

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ffn_hidden(self) -> int:
        """Hidden width of the FFN. SwiGLU has three matrices instead of two, so 2/3 of d_ff keeps
        the parameter count equal (exactly when 3 divides 2*d_ff, else within rounding)."""
        return max(1, round(2 * self.d_ff / 3)) if self.ffn == "swiglu" else self.d_ff

    def _check_types(self) -> None:
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            expected = hints[field.name]
            value = getattr(self, field.name)
            # bool is a subclass of int: reject True for an int field and 1 for a bool field.
            if expected is bool:
                ok = isinstance(value, bool)
            elif expected is int:
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif expected in (float, float | None):
                ok = (isinstance(value, (int, float)) and not isinstance(value, bool)) or (
                    value is None and expected is not float)
                if ok and value is not None:
                    object.__setattr__(self, field.name, float(value))
            else:
                ok = isinstance(value, expected)
            if not ok:
                raise ValueError(f"ModelConfig.{field.name} must be {getattr(expected, '__name__', str(expected))}, "
                                 f"got {value!r} ({type(value).__name__})")

    def _check_positive(self, *names: str) -> None:
        for name in names:
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name} must be >= 1, got {getattr(self, name)}")
