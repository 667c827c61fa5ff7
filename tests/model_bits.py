"""The bits of today's models, so that a refactor or a new switch provably leaves them alone.

A fingerprint of one ModelConfig: sha256 of the initial state dict at torch seed 0 (names, shapes
and values: module creation order and random-number use at init both show), of the logits and
loss of one training-mode forward at seed 1 (dropout draws included), and of every parameter's
gradient after its backward. tests/fixtures/model_bits.json holds them for
- every architecture x attention path x every switch of model/config.py flipped one at a time
  (booleans negated, each other value of a named choice), at a tiny size,
- the default study (presets/synthetic.yaml) at its own size, every ablation x attention path,
- every variant of every preset, shrunk to the tiny size (the combinations studies use).
The recorded configs hold only what differed from ModelConfig's defaults when they were recorded,
so a field added since builds at its default: its default must reproduce these bits
(tests/test_model_every_switch.py). The first record was taken before MultiHeadAttention was
built from the ModelConfig and before qk_norm existed; rerecorded after, it only gained qk_norm's
eight models.

    python -m tests.model_bits   # rewrite the fixture from the code as it is

Rerecording after adding a switch adds its models and changes no recorded one (the fixture's diff
is additions only); a changed line means a model changed: only when that is meant.

The forward and gradient bits hold where torch's CPU kernels are pinned and its matrix products
routed (pipeline/cpu_numerics.py: x86-64 with AVX2), at any thread count; the initial weights anywhere.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from pathlib import Path

import pipeline  # noqa: F401  (first: pins the CPU kernels' code path before torch is imported)
import torch

from model import ModelConfig, build_model
from model.config import _CHOICES
from pipeline import cpu_numerics

cpu_numerics.engage()  # as every stage runs its models (pipeline/cpu_numerics.py)

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "model_bits.json"
AXES = ("arch", "attention_impl")  # every switch runs in each of these; they are not switches here
TINY = dict(vocab_size=23, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=2, d_ff=24, max_len=32,
            rel_buckets=8, rel_max_distance=16)


def switch_variants() -> list[dict]:
    """Every switch of ModelConfig flipped one at a time, read from the dataclass: each bool field
    negated, each field of _CHOICES at each of its other values (AXES excepted)."""
    hints, default = typing.get_type_hints(ModelConfig), ModelConfig()
    out = []
    for f in dataclasses.fields(ModelConfig):
        if f.name in AXES:
            continue
        value = getattr(default, f.name)
        if f.name in _CHOICES:
            out += [{f.name: v} for v in _CHOICES[f.name] if v != value]
        elif hints[f.name] is bool:
            out.append({f.name: not value})
    return out


def variant_id(variant: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in variant.items()) or "default"


def valid(**fields) -> ModelConfig | None:
    """The config, or None where ModelConfig refuses the combination (future_only with prefix_lm)."""
    try:
        return ModelConfig(**fields)
    except ValueError:
        return None


def batch(vocab: int, seed: int = 0, b: int = 3, s: int = 7, t: int = 6) -> tuple[torch.Tensor, ...]:
    """src (B, S) right-padded, tgt_in starting with bos (2), tgt_out with pad (0) after each target."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (b, s), generator=g)
    src[1, s - 2:] = 0
    src[2, 2:] = 0
    tgt = torch.randint(4, vocab, (b, t + 1), generator=g)
    tgt[:, 0] = 2
    tgt[1, t - 1:] = 0
    tgt[1, t - 2] = 3
    return src, tgt[:, :-1].contiguous(), tgt[:, 1:].contiguous()


def digest(named: typing.Iterable[tuple[str, torch.Tensor]]) -> str:
    h = hashlib.sha256()
    for name, tensor in named:
        t = tensor.detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def fingerprint(config: dict) -> dict[str, str]:
    """init, forward and grads digests of ModelConfig(**config) (module docstring)."""
    cfg = ModelConfig(**config)
    torch.manual_seed(0)
    model = build_model(cfg)
    init = digest(model.state_dict().items())
    src, tgt_in, tgt_out = batch(cfg.vocab_size)
    torch.manual_seed(1)
    model.train()
    logits, loss = model(src, tgt_in, tgt_out)
    loss.backward()
    return {"init": init, "forward": digest([("logits", logits), ("loss", loss)]),
            "grads": digest((n, p.grad) for n, p in model.named_parameters())}


def non_default(fields: dict) -> dict:
    default = dataclasses.asdict(ModelConfig())
    return {k: v for k, v in fields.items() if default.get(k, object()) != v}


def shrink(model: dict) -> dict:
    """A preset variant's model at the tiny size, its switches kept."""
    return {**model, **TINY, "n_heads": 1 if model["n_heads"] == 1 else 2,
            "n_encoder_layers": min(model["n_encoder_layers"], 1),
            "n_decoder_layers": min(model["n_decoder_layers"], 2)}


def cases() -> dict[str, dict]:
    """Name -> the (non-default) config fields of every fingerprinted model (module docstring)."""
    from pipeline.params import FROM_TOKENIZER, load_params, resolve_variant

    out = {}
    for arch in _CHOICES["arch"]:
        for impl in _CHOICES["attention_impl"]:
            for variant in [{}, *switch_variants()]:
                fields = {**TINY, "arch": arch, "attention_impl": impl, **variant}
                if valid(**fields) is not None:
                    out[f"tiny/{arch}/{impl}/{variant_id(variant)}"] = non_default(fields)
    study = load_params(ROOT / "presets" / "synthetic.yaml")
    for name in study.ablations:
        for impl in _CHOICES["attention_impl"]:
            model = {**resolve_variant(study, name)["model"], "vocab_size": study.train_bpe.vocab_size,
                     "attention_impl": impl}
            out[f"study/{name}/{impl}"] = non_default(model)
    seen = set()
    for preset in sorted((ROOT / "presets").glob("*.yaml")):
        params = load_params(preset)
        for name in params.ablations:
            model = shrink({k: v for k, v in resolve_variant(params, name)["model"].items() if k not in FROM_TOKENIZER})
            for impl in _CHOICES["attention_impl"]:
                fields = non_default({**model, "attention_impl": impl})
                key = json.dumps(fields, sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    out[f"preset/{preset.stem}/{name}/{impl}"] = fields
    return out


def record() -> None:
    torch.set_num_threads(1)  # as the suite runs (tests/conftest.py)
    found = {name: {"config": config, **fingerprint(config)} for name, config in cases().items()}
    FIXTURE.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{FIXTURE.relative_to(ROOT)}: {len(found)} models")


if __name__ == "__main__":
    record()
