"""The CUDA path: bf16 autocast training, the fused attention kernel, KV-cache decoding, compile.

Marked `gpu`: skipped without CUDA (tests/conftest.py), run on any machine that has a GPU with
`bash run.sh test -m gpu`.
"""
from __future__ import annotations

import json

import pytest
import torch

from model import ModelConfig, build_model
from model.config import ARCHS
from model.generate import _greedy_pick, decode_loop
from tests.test_trainer import resolved

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def no_mlflow(monkeypatch):
    monkeypatch.setenv("ABLATION_LAB_TRACKING", "0")


@pytest.mark.parametrize("arch", ARCHS)
def test_manual_and_sdpa_agree_in_bf16_on_cuda(arch):
    torch.manual_seed(0)
    cfg = dict(vocab_size=50, d_model=64, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=128,
               dropout=0.0, arch=arch)
    manual = build_model(ModelConfig(**cfg, attention_impl="manual")).cuda()
    fused = build_model(ModelConfig(**cfg, attention_impl="sdpa")).cuda()
    fused.load_state_dict(manual.state_dict())
    src = torch.randint(4, 50, (8, 20), device="cuda")
    tgt = torch.randint(4, 50, (8, 12), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        (a, _), (b, _) = manual(src, tgt[:, :-1]), fused(src, tgt[:, :-1])
    a, b = a.float(), b.float()
    assert torch.isfinite(a).all()
    # bf16 rounds differently along the two paths; a wiring error would differ by O(1).
    assert (a - b).abs().max() <= 0.05 * a.abs().max() + 0.05


def test_kv_cache_decoding_matches_recomputation_on_cuda(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # full float32 for the comparison
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=50, d_model=64, n_heads=4, n_encoder_layers=2, n_decoder_layers=2,
                                    d_ff=128, dropout=0.0)).cuda().eval()
    src = torch.randint(4, 50, (4, 15), device="cuda")
    with torch.no_grad():
        cached, cached_logits = decode_loop(model, src, 10, _greedy_pick, use_cache=True)
        full, full_logits = decode_loop(model, src, 10, _greedy_pick, use_cache=False)
    assert torch.equal(cached, full)
    torch.testing.assert_close(cached_logits, full_logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("compile_model", [False, True], ids=["eager", "compiled"])
def test_training_on_cuda_in_bf16(tiny_shards, tmp_path, compile_model):
    """Compiled, the length-bucketed batches of many shapes compile the step once (tests/test_compile.py
    counts it on CPU, with the attention alignment guards inductor adds on CUDA; a second compilation
    here costs tens of seconds)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from pipeline.train import run

    torch._dynamo.reset()
    counters.clear()
    torch._logging.set_logs(recompiles=True, graph_breaks=True)  # a failure shows why, in its captured stderr
    try:
        metrics = run(tiny_shards / "shards", "v", 0, resolved(device="cuda", compile=compile_model), "x",
                      tmp_path / "out", tmp_path / "ckpt")
    finally:
        torch._logging.set_logs()
    assert counters["stats"]["unique_graphs"] == (1 if compile_model else 0)
    assert metrics["device"].startswith("cuda")
    assert 0 < metrics["val_loss"] < 10 and metrics["tokens_trained"] >= 3000
    info = json.loads((tmp_path / "out" / "train.json").read_text())
    assert info["peak_flops_per_s"] is None or 0 < info["mfu"] < 1  # None: a GPU without a stated peak
