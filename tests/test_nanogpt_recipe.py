"""nanoGPT's GPU recipe, like with like: the preset sets every recipe setting, our model in its
configuration is nanoGPT's in training mode (same weights, same torch seed: same loss and
gradients, dropout included), and GPT-2's initialisation has the stds it should. The in-loop
estimate and the kept model: tests/test_best_estimate.py.
"""
from __future__ import annotations

import hashlib
import math

import pytest
import torch

from benchmarks.nanogpt_reference import GPT, GPTShape, copy_weights, lr_at, lr_at_23a8e701, name_map
from model import ModelConfig, build_model
from model.config import INITS
from pipeline.params import load_params, model_config, resolve_variant
from pipeline.training.optim import lr_factor, param_groups

PRESET = "presets/nanogpt_shakespeare_char_gpu.yaml"
# The same recipe as nanoGPT had it at commit 23a8e701, when its README's 1.4697 was written.
PRESET_23A8E701 = "presets/nanogpt_shakespeare_char_gpu_23a8e701.yaml"
# A character vocabulary: 65 characters + pad, unk, bos, eos.
TOKENIZER = {"vocab_size": 69, "pad_id": 0, "bos_id": 2, "eos_id": 3}
SMALL = {"d_model": 64, "n_heads": 4, "n_decoder_layers": 2, "d_ff": 256, "max_len": 32}


def preset_model(preset: str = PRESET, **shape) -> tuple[ModelConfig, dict]:
    """Our model as the preset configures it (params validation included), at a test shape."""
    resolved = resolve_variant(load_params(preset), "baseline")
    return model_config({**resolved["model"], **shape}, TOKENIZER, "test"), resolved


def reference_for(cfg: ModelConfig, gelu: str = "none") -> GPT:
    return GPT(GPTShape(vocab_size=cfg.vocab_size, block_size=cfg.max_len, n_layer=cfg.n_decoder_layers,
                        n_head=cfg.n_heads, n_embd=cfg.d_model, dropout=cfg.dropout, gelu=gelu))


def test_preset_sets_every_recipe_setting():
    """config/train_shakespeare_char.py and nanoGPT's train.py/model.py defaults, one by one."""
    cfg, resolved = preset_model()
    model = {k: getattr(cfg, k) for k in ("arch", "d_model", "n_heads", "n_decoder_layers", "d_ff", "dropout",
                                          "attention_dropout", "ffn_hidden_dropout", "init", "scale_embeddings",
                                          "positional", "norm", "norm_position", "ffn", "bias", "tie_output", "max_len")}
    assert model == {"arch": "decoder_only", "d_model": 384, "n_heads": 6, "n_decoder_layers": 6, "d_ff": 4 * 384,
                     "dropout": 0.2, "attention_dropout": 0.2, "ffn_hidden_dropout": 0.0, "init": "gpt2",
                     "scale_embeddings": False, "positional": "learned", "norm": "layernorm", "norm_position": "pre",
                     "ffn": "gelu", "bias": False, "tie_output": True, "max_len": 256}
    t = resolved["train"]
    train = {k: t[k] for k in ("budget_steps", "batch_size", "context", "lm_windows", "grad_accum", "lr", "betas",
                               "weight_decay", "decay_embeddings", "schedule", "warmup_steps", "min_lr_ratio",
                               "clip_grad_norm", "precision", "eval_every", "eval_examples", "eval_windows", "keep")}
    assert train == {"budget_steps": 5000, "batch_size": 64, "context": 256, "lm_windows": "random", "grad_accum": 1,
                     "lr": 1e-3, "betas": (0.9, 0.99), "weight_decay": 0.1, "decay_embeddings": True,
                     "schedule": "cosine", "warmup_steps": 100, "min_lr_ratio": 0.1, "clip_grad_norm": 1.0,
                     "precision": "bf16", "eval_every": 250, "eval_examples": 200 * 64, "eval_windows": "random",
                     "keep": "best"}
    ref = load_params(PRESET).report.reference
    assert (ref.metric, ref.value, ref.quantity) == ("val_loss", 1.4697, "best_estimate")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_training_mode_loss_and_gradients_equal_nanogpts(seed):
    """Same weights, same torch seed, training mode: every dropout site draws the same mask in the
    same order, so the loss and every gradient agree to float32 rounding."""
    cfg, _ = preset_model(**SMALL)
    torch.manual_seed(100 + seed)
    ref = reference_for(cfg).train()
    ours = build_model(cfg).train()
    copy_weights(ref, ours)
    tokens = torch.randint(4, cfg.vocab_size, (6, cfg.max_len + 1), generator=torch.Generator().manual_seed(seed))
    x, y = tokens[:, :-1], tokens[:, 1:]
    torch.manual_seed(seed)
    loss_ref = ref(x, y)
    torch.manual_seed(seed)
    loss_ours = ours(None, x, y)[1]
    assert loss_ours.item() == pytest.approx(loss_ref.item(), rel=1e-6, abs=1e-6)
    loss_ref.backward()
    loss_ours.backward()
    theirs = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs[name_map(cfg.n_decoder_layers)[name]].grad, rtol=1e-4, atol=1e-6,
                                   msg=lambda m, name=name: f"{name}: {m}")
    # Eval mode too (no dropout): the logits of the whole model.
    ours.eval(), ref.eval()
    with torch.no_grad():
        assert ours(None, x, y)[1].item() == pytest.approx(ref(x, y).item(), rel=1e-6)


@pytest.mark.parametrize("change", [{"ffn_dropout": None}, {"attention_dropout": 0.0}, {"scale_embeddings": True}])
def test_each_setting_the_preset_fixed_breaks_the_equality(change):
    """The check has teeth: each old setting (FFN hidden dropout, no attention dropout, scaled
    embeddings) makes the training-mode loss differ from nanoGPT's."""
    cfg, _ = preset_model(**SMALL, **change)
    torch.manual_seed(0)
    ref = reference_for(cfg).train()
    ours = build_model(cfg).train()
    copy_weights(ref, ours)
    tokens = torch.randint(4, cfg.vocab_size, (6, cfg.max_len + 1), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    loss_ref = ref(tokens[:, :-1], tokens[:, 1:]).item()
    torch.manual_seed(0)
    loss_ours = ours(None, tokens[:, :-1], tokens[:, 1:])[1].item()
    assert abs(loss_ours - loss_ref) > 1e-4


def test_gpt2_init_stds_match_the_scheme_and_nanogpts_model():
    """init gpt2: every linear weight and embedding table std 0.02, residual projections
    0.02 / sqrt(2 * layers), norms one; nanoGPT's model built the same shape agrees tensor by tensor."""
    shape = {"d_model": 256, "n_heads": 4, "n_decoder_layers": 4, "d_ff": 1024, "max_len": 256}
    cfg, _ = preset_model(**shape)
    cfg = ModelConfig(**{**cfg.__dict__, "vocab_size": 512})
    torch.manual_seed(0)
    ours = build_model(cfg)
    ref = reference_for(cfg)
    theirs = dict(ref.named_parameters())
    residual = 0.02 / math.sqrt(2 * cfg.n_decoder_layers)
    for name, p in ours.named_parameters():
        if name.endswith("norm.weight"):
            assert torch.all(p == 1), name
            continue
        want = residual if name.endswith(("out_proj.weight", "w_out.weight")) else 0.02
        assert p.std().item() == pytest.approx(want, rel=0.05), name
        assert abs(p.mean().item()) < 0.1 * want, name
        assert theirs[name_map(cfg.n_decoder_layers)[name]].std().item() == pytest.approx(want, rel=0.05), name


def test_gpt2_init_counts_cross_attention_as_a_residual_sublayer():
    """Encoder-decoder: the decoder's three residual writers per layer share 0.02 / sqrt(3 * layers)."""
    cfg = ModelConfig(vocab_size=512, d_model=256, n_heads=4, n_encoder_layers=2, n_decoder_layers=3, d_ff=1024,
                      init="gpt2")
    torch.manual_seed(0)
    model = build_model(cfg)
    assert model.encoder.layers[0].ffn.w_out.weight.std().item() == pytest.approx(0.02 / math.sqrt(4), rel=0.05)
    for proj in (model.decoder.layers[0].cross_attn.out_proj, model.decoder.layers[0].self_attn.out_proj):
        assert proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(9), rel=0.05)
    assert model.embed.weight.std().item() == pytest.approx(0.02, rel=0.05)


# SHA-256 (first 16 hex digits) of the float32 bytes of every parameter, in named_parameters()
# order, of build_model(SMALL_INIT, arch=...) after torch.manual_seed(0), as model/ built it at
# 431bfae (34863b8^: before the init and ffn_dropout fields existed). Recorded once by running that
# commit's model/ on this machine; CPU random draws do not depend on the CPU or thread count.
SMALL_INIT = dict(vocab_size=64, d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64)
INIT_BEFORE_THE_FIELDS = {"encoder_decoder": ("8a8b3e04bed2f61b", 33, 23424),
                          "decoder_only": ("3a566ffe8f7a41d6", 13, 10592)}


def init_fingerprint(model: torch.nn.Module) -> tuple[str, int, int]:
    digest = hashlib.sha256()
    for _, p in model.named_parameters():
        digest.update(p.detach().float().contiguous().numpy().tobytes())
    params = list(model.parameters())
    return digest.hexdigest()[:16], len(params), sum(p.numel() for p in params)


@pytest.mark.parametrize("arch", sorted(INIT_BEFORE_THE_FIELDS))
def test_xavier_init_unchanged_by_the_new_fields(arch):
    """Defaults (init xavier, ffn_dropout None) build exactly the model the code built before those
    fields existed: the same weights from the same seed (against hashes recorded from that code),
    and FFN hidden dropout = dropout."""
    cfg = ModelConfig(**SMALL_INIT, arch=arch)
    for fields in ({}, {"init": "xavier", "ffn_dropout": None}):  # the defaults, and spelt out
        torch.manual_seed(0)
        model = build_model(ModelConfig(**{**cfg.__dict__, **fields}))
        assert init_fingerprint(model) == INIT_BEFORE_THE_FIELDS[arch], fields
    assert model.decoder.layers[0].ffn.dropout.p == cfg.dropout
    assert build_model(ModelConfig(**{**cfg.__dict__, "ffn_dropout": 0.0})).decoder.layers[0].ffn.dropout is None
    torch.manual_seed(0)  # the check can fail: another init gives other weights from the same seed
    assert init_fingerprint(build_model(ModelConfig(**{**cfg.__dict__, "init": "gpt2"})))[0] != \
        INIT_BEFORE_THE_FIELDS[arch][0]


@pytest.mark.parametrize("field, value, message", [
    ("init", "he", f"ModelConfig.init must be one of {list(INITS)}, got 'he'"),
    ("ffn_dropout", 1.0, "ModelConfig.ffn_dropout must be in [0, 1), got 1.0"),
    ("ffn_dropout", "0.1", "ModelConfig.ffn_dropout must be float | None, got '0.1' (str)"),
])
def test_new_fields_are_validated(field, value, message):
    with pytest.raises(ValueError) as err:
        ModelConfig(vocab_size=64, d_model=32, n_heads=2, d_ff=64, **{field: value})
    assert str(err.value) == message


def test_optimizer_and_schedule_follow_nanogpts():
    """decay_embeddings: true decays exactly nanoGPT's set (every tensor of 2+ dims); the schedule
    is nanoGPT's cosine but for the warmup's denominator (100 here, 101 there)."""
    cfg, resolved = preset_model(**SMALL)
    ours, ref = build_model(cfg), reference_for(cfg)
    decayed = {id(p) for p in param_groups(ours, 0.1, decay_embeddings=True)[0]["params"]}
    names = name_map(cfg.n_decoder_layers)
    theirs = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        assert (id(p) in decayed) == (theirs[names[name]].dim() >= 2), name
    t = resolved["train"]
    for step in (100, 101, 1000, 2500, 4999):
        ours_lr = t["lr"] * lr_factor(step, t["schedule"], t["warmup_steps"], t["budget_steps"], t["min_lr_ratio"])
        want = lr_at(step, t["lr"], t["warmup_steps"], t["budget_steps"], t["lr"] * t["min_lr_ratio"])
        assert ours_lr == pytest.approx(want, rel=1e-9), step
    assert t["lr"] * lr_factor(0, "cosine", 100, 5000, 0.1) == pytest.approx(1e-3 / 100)


def leaves(tree, path=()) -> dict:
    """Every setting of a params dump as (section, ..., key) -> value."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in leaves(sub, (*path, key)).items()}
    return {path: tree}


# What nanoGPT changed after commit 23a8e701, as (today's, then).
CHANGED_SINCE_23A8E701 = {("model", "ffn"): ("gelu", "gelu_tanh"),
                          ("train", "weight_decay"): (0.1, 0.01),
                          ("train", "decay_embeddings"): (True, False),
                          ("train", "warmup_start"): ("one", "zero")}


def test_the_23a8e701_recipe_differs_from_todays_in_exactly_four_settings():
    """Every setting of the two presets, defaults included, and every resolved model and train
    setting: the same but for nanoGPT's four changes since 23a8e701. The report's experiment name
    and notes (words, not settings) are the only other differences."""
    today, then = (leaves(load_params(p).model_dump()) for p in (PRESET, PRESET_23A8E701))
    assert set(today) == set(then)
    differ = {k: (today[k], then[k]) for k in today if today[k] != then[k]}
    words = {k for k in differ if k in (("report", "experiment"), ("report", "notes"))}
    assert {k: v for k, v in differ.items() if k not in words} == CHANGED_SINCE_23A8E701
    ours, theirs = (leaves(resolve_variant(load_params(p), "baseline")) for p in (PRESET, PRESET_23A8E701))
    assert {k: (ours[k], theirs[k]) for k in ours if ours[k] != theirs[k]} == CHANGED_SINCE_23A8E701
    assert load_params(PRESET_23A8E701).report.reference == load_params(PRESET).report.reference


@pytest.mark.parametrize("seed", [0, 1])
def test_the_23a8e701_recipe_in_training_mode_equals_nanogpts_with_tanh_gelu(seed):
    """The 23a8e701 preset's model against a nanoGPT-faithful GPT with new_gelu (the tanh GELU):
    same weights, same torch seed, training mode: the same loss and gradients; against the exact
    GELU's reference the loss differs (the check has teeth: the weights are scaled up from GPT-2's
    N(0, 0.02), at which the MLP's inputs are so near 0 that the two GELUs all but agree)."""
    cfg, _ = preset_model(PRESET_23A8E701, **SMALL)
    assert cfg.ffn == "gelu_tanh"
    torch.manual_seed(100 + seed)
    ref = reference_for(cfg, gelu="tanh").train()
    with torch.no_grad():
        for p in ref.parameters():
            p.mul_(10 if p.dim() >= 2 else 1)
    exact = reference_for(cfg).train()
    exact.load_state_dict(ref.state_dict())
    ours = build_model(cfg).train()
    copy_weights(ref, ours)
    tokens = torch.randint(4, cfg.vocab_size, (6, cfg.max_len + 1), generator=torch.Generator().manual_seed(seed))
    x, y = tokens[:, :-1], tokens[:, 1:]
    losses = {}
    for name, model in {"ref": ref, "exact": exact, "ours": lambda a, b: ours(None, a, b)[1]}.items():
        torch.manual_seed(seed)
        losses[name] = model(x, y)
    assert losses["ours"].item() == pytest.approx(losses["ref"].item(), rel=1e-6, abs=1e-6)
    for loss in losses.values():
        loss.backward()
    theirs = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs[name_map(cfg.n_decoder_layers)[name]].grad, rtol=1e-4, atol=1e-6,
                                   msg=lambda m, name=name: f"{name}: {m}")
    # The exact GELU's gradients of the MLP's input layer are not nanoGPT's then, at that tolerance.
    fc = [(dict(exact.named_parameters())[f"h.{i}.mlp.c_fc.weight"].grad, theirs[f"h.{i}.mlp.c_fc.weight"].grad)
          for i in range(cfg.n_decoder_layers)]
    assert not all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in fc)


def test_the_23a8e701_optimizer_and_schedule_are_nanogpts_then():
    """weight decay 1e-2 on the Linear weights only (configure_optimizers at 23a8e701: LayerNorm
    and Embedding weights, the tied token table and the position table, not decayed), and
    get_lr's warmup lr * it / 100 from it = 0: the learning rate at every step is nanoGPT's then."""
    cfg, resolved = preset_model(PRESET_23A8E701, **SMALL)
    ours, ref = build_model(cfg), reference_for(cfg, gelu="tanh")
    t = resolved["train"]
    groups = param_groups(ours, t["weight_decay"], decay_embeddings=t["decay_embeddings"])
    assert groups[0]["weight_decay"] == 0.01
    decayed = {id(p) for p in groups[0]["params"]}
    linear = {id(m.weight) for m in ref.modules() if isinstance(m, torch.nn.Linear)}
    names = name_map(cfg.n_decoder_layers)
    theirs = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        assert (id(p) in decayed) == (id(theirs[names[name]]) in linear), name
    for step in (0, 1, 50, 99, 100, 101, 1000, 2500, 4999):
        ours_lr = t["lr"] * lr_factor(step, t["schedule"], t["warmup_steps"], t["budget_steps"], t["min_lr_ratio"],
                                      t["warmup_start"])
        want = lr_at_23a8e701(step, t["lr"], t["warmup_steps"], t["budget_steps"], t["lr"] * t["min_lr_ratio"])
        assert ours_lr == pytest.approx(want, rel=1e-9, abs=1e-15), step
    assert t["lr"] * lr_factor(0, t["schedule"], 100, 5000, 0.1, t["warmup_start"]) == 0.0


def test_the_cpu_proxy_trains_both_models_on_the_same_windows_and_compares_them(tmp_path, capsys):
    """benchmarks/nanogpt_proxy.py at a toy size: both models, every quantity, the agreement rule."""
    import json
    from pathlib import Path

    from benchmarks import nanogpt_proxy

    text = Path(__file__).parent / "fixtures" / "sources" / "tiny_shakespeare_input.txt"
    nanogpt_proxy.main(["--text", str(text), "--steps", "6", "--eval-every", "3", "--seeds", "0", "1",
                        "--d-model", "16", "--heads", "2", "--layers", "1", "--context", "8", "--batch", "4",
                        "--eval-batches", "2", "--train-chars", "2000", "--warmup", "2", "--out", str(tmp_path / "p.json")])
    out = json.loads((tmp_path / "p.json").read_text())
    assert json.loads(capsys.readouterr().out) == out
    for name in ("ours", "nanogpt"):
        assert [r["seed"] for r in out["runs"][name]] == [0, 1]
        for r in out["runs"][name]:
            assert [step for step, _ in r["curve"]] == [3, 6]
            assert r["best_estimate"] == min(v for _, v in r["curve"]) and r["last_estimate"] == r["curve"][-1][1]
    for q in nanogpt_proxy.QUANTITIES:
        c = out["comparison"][q]
        assert c["within_spread"] == (abs(c["ours_minus_nanogpt"]) <= c["seed_spread"])
    assert out["agree"] == all(c["within_spread"] for c in out["comparison"].values())


def test_the_cpu_proxy_names_a_missing_text(tmp_path):
    from benchmarks import nanogpt_proxy

    with pytest.raises(SystemExit, match=r"nanogpt_proxy: .*nope.txt: no such file"):
        nanogpt_proxy.main(["--text", str(tmp_path / "nope.txt")])


@pytest.mark.slow
def test_the_new_model_fields_leave_the_plan_and_the_flop_count_alone(tmp_path, capsys):
    """init and ffn_dropout change no shape: the planner's parameters and FLOPs and the train
    stage's FLOPs per token are the same with and without them, and init changes nothing else.
    (Dropout masks are activations autograd keeps: the memory estimate rightly follows them.)"""
    import json

    import yaml

    from pipeline import plan
    from pipeline.train import flops_per_target_token

    raw = yaml.safe_load(open(PRESET).read())
    plans = {}
    for name, extra in {"xavier": {"init": "xavier"}, "recipe": {},
                        "old_dropouts": {"ffn_dropout": None, "attention_dropout": 0.0}}.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**raw, "model": {**raw["model"], **extra}}))
        plan.main(["--params", str(path), "--device", "h100", "--json"])
        plans[name] = json.loads(capsys.readouterr().out)["rows"]
    assert plans["xavier"] == plans["recipe"]
    shape = ("params", "flops_per_token", "tokens_per_run", "steps_per_run")
    assert [{k: r[k] for k in shape} for r in plans["old_dropouts"]] == [{k: r[k] for k in shape} for r in plans["recipe"]]
    recipe, _ = preset_model(**SMALL)
    plain = ModelConfig(**{**recipe.__dict__, "init": "xavier", "ffn_dropout": None, "attention_dropout": 0.0})
    assert flops_per_target_token(build_model(recipe), recipe, 0, 32) == flops_per_target_token(build_model(plain), plain, 0, 32)
