"""The in-loop estimate and the kept model as nanoGPT's train.py has them (train.eval_windows:
random, train.keep: best): random windows over the whole split, redrawn at each evaluation; the
best estimate's weights kept, also across a resume; the report setting a best-estimate reference
beside our best estimate and saying which step each run kept."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from model import ModelConfig, build_model
from pipeline.training import trainer


def lm_data(seed: int = 0, val_len: int = 5000) -> trainer.Data:
    rng = np.random.default_rng(0)
    return trainer.Data(task="language_modeling", train=None, val=None, ids={"pad_id": 0, "bos_id": 2, "eos_id": 3},
                        batch_tokens=0, batch_size=8, context=16, seed=seed,
                        train_stream=rng.integers(4, 30, 20000), val_stream=rng.integers(4, 30, val_len))


def test_random_eval_windows_cover_the_whole_split_and_are_redrawn_per_step():
    data = lm_data()
    first = data.val_batches(64, "first")
    assert np.concatenate(first).max() < 64 * 16  # the split's first windows only
    draws = [np.concatenate(data.val_batches(3000, "random", step)) for step in (250, 500)]
    for starts in draws:
        assert len(starts) == 3000 and starts.min() >= 0 and starts.max() <= 5000 - 16 - 1
        assert starts.max() > 4500 and starts.min() < 500  # spread over the whole split
    assert not np.array_equal(draws[0], draws[1])  # new windows at each evaluation
    np.testing.assert_array_equal(draws[0], np.concatenate(lm_data().val_batches(3000, "random", 250)))
    assert not np.array_equal(draws[0], np.concatenate(lm_data(seed=1).val_batches(3000, "random", 250)))


def test_random_eval_windows_need_a_language_model():
    data = trainer.Data(task="translation", train=trainer.Split([np.array([5])], [np.array([6])]),
                        val=trainer.Split([np.array([5])], [np.array([6])]), ids={"pad_id": 0, "bos_id": 2, "eos_id": 3},
                        batch_tokens=64, batch_size=8, context=16, seed=0)
    with pytest.raises(ValueError, match="train.eval_windows: random draws language-model windows"):
        data.val_batches(8, "random", 0)


def train_cfg(**over) -> dict:
    from pipeline.params import TrainParams

    cfg = TrainParams(device="cpu", budget_steps=12, batch_size=8, context=16, lr=3e-2, warmup_steps=0,
                      eval_every=2, eval_examples=16, log_every=2, checkpoint_every=4, threads=1).model_dump()
    return {**cfg, **over}


def test_keep_best_hands_on_the_best_estimate_and_the_last_weights(tmp_path):
    """keep best: the returned model holds the weights of the step with the lowest in-loop
    estimate; the last step's weights come back beside them; the record says which step."""
    cfg = ModelConfig(vocab_size=32, d_model=32, n_heads=2, n_encoder_layers=0, n_decoder_layers=1, d_ff=64,
                      max_len=16, arch="decoder_only", dropout=0.0)
    torch.manual_seed(0)
    model = build_model(cfg)
    # lr 3e-2 on a tiny stream overfits: the estimate's best is before the end.
    result = trainer.train(model, lm_data(), train_cfg(keep="best", eval_windows="random"), tmp_path / "ck", "h", log=lambda *a: None)
    estimates = [row[2] for row in result["val_rows"]]
    best_step = result["val_rows"][int(np.argmin(estimates))][0]
    assert result["keep"] == "best" and result["kept_step"] == best_step
    assert result["val_estimate_best"] == min(estimates) and result["val_estimate_last"] == estimates[-1]
    if best_step != result["steps"]:
        assert result["last_state"] is not None
        assert any(not torch.equal(v, model.state_dict()[k]) for k, v in result["last_state"].items())
    # The kept weights give the best estimate again (same windows: drawn from (seed, step)).
    data = lm_data()
    again = trainer.evaluate_loss(model, data, data.val_batches(16, "random", best_step), torch.device("cpu"), False)
    assert again == pytest.approx(min(estimates), rel=1e-6)


def test_keep_last_is_the_default_and_keeps_the_last_step(tmp_path):
    cfg = ModelConfig(vocab_size=32, d_model=32, n_heads=2, n_encoder_layers=0, n_decoder_layers=1, d_ff=64,
                      max_len=16, arch="decoder_only", dropout=0.0)
    torch.manual_seed(0)
    result = trainer.train(build_model(cfg), lm_data(), train_cfg(), tmp_path / "ck", "h", log=lambda *a: None)
    assert (result["keep"], result["kept_step"], result["last_state"], result["eval_windows"]) == ("last", 12, None, "first")


def test_keep_best_survives_a_resume(tmp_path):
    """The best so far is in the checkpoint: a run resumed after step 4 keeps the same step as an
    uninterrupted one."""
    cfg = ModelConfig(vocab_size=32, d_model=32, n_heads=2, n_encoder_layers=0, n_decoder_layers=1, d_ff=64,
                      max_len=16, arch="decoder_only", dropout=0.0)
    torch.manual_seed(0)
    whole = trainer.train(build_model(cfg), lm_data(), train_cfg(keep="best", eval_windows="random"),
                          tmp_path / "a", "h", log=lambda *a: None)
    torch.manual_seed(0)
    trainer.train(build_model(cfg), lm_data(), train_cfg(keep="best", eval_windows="random", budget_steps=12,
                                                        checkpoint_every=4),
                  tmp_path / "b", "h", log=lambda *a: None)
    # Resume from the step-4 checkpoint of a second run: drop the later ones.
    for path in sorted((tmp_path / "b").glob("step-*.pt"))[1:]:
        path.unlink()
    torch.manual_seed(0)
    resumed = trainer.train(build_model(cfg), lm_data(), train_cfg(keep="best", eval_windows="random"),
                            tmp_path / "b", "h", log=lambda *a: None)
    assert resumed["resumed"] and resumed["kept_step"] == whole["kept_step"]
    assert resumed["val_estimate_best"] == pytest.approx(whole["val_estimate_best"], rel=1e-6)


def reference_runs(keep: str = "best") -> dict:
    from pipeline.reporting.inputs import Run

    runs = {}
    for seed, (whole, best, last) in enumerate([(1.50, 1.44, 1.46), (1.52, 1.45, 1.47), (1.51, 1.43, 1.45)]):
        runs[("baseline", seed)] = Run("baseline", seed, train={"keep": keep, "val_estimate_best": best, "kept_step": 4000},
                                       eval={"val_loss": whole, "val_loss_last": last})
    return runs


def test_report_sets_a_best_estimate_reference_beside_our_best_estimate_and_shows_the_whole_split():
    from pipeline.reporting.render import to_markdown
    from pipeline.reporting.results import compute_results
    from pipeline.reporting.tables import reference_blocks, reference_summary

    runs = reference_runs()
    results = compute_results(runs, ["baseline"], [0, 1, 2], "baseline")
    ref = {"metric": "val_loss", "value": 1.4697, "source": "nanoGPT", "quantity": "best_estimate"}
    text = to_markdown("t", reference_blocks(results, "baseline", ref, runs, [0, 1, 2]))
    assert "as best estimate" in text and "baseline, val_estimate_best: 1.44" in text
    assert "over the whole split (the kept model): 1.51" in text and "not the reference's quantity" in text
    summary = reference_summary(results, "baseline", ref, runs, [0, 1, 2])
    assert summary["ours_key"] == "val_estimate_best" and summary["ours"]["mean"] == pytest.approx(1.44)
    assert summary["ours_whole_split"]["mean"] == pytest.approx(1.51)
    assert summary["ours_whole_split_last_step"]["mean"] == pytest.approx(1.46)
    # A whole-split reference (the default) sits beside the whole-split loss, as before.
    whole = reference_summary(results, "baseline", {**ref, "quantity": "whole_split"}, runs, [0, 1, 2])
    assert whole["ours_key"] == "val_loss" and whole["ours"]["mean"] == pytest.approx(1.51)


def test_a_best_estimate_reference_must_be_a_validation_loss():
    from pipeline.params import Reference

    with pytest.raises(ValueError, match="quantity best_estimate is an in-loop validation loss: metric must be val_loss"):
        Reference(metric="bleu", value=30.0, source="x", quantity="best_estimate")


def test_per_run_table_says_which_step_was_kept():
    from pipeline.reporting.render import to_markdown
    from pipeline.reporting.tables import per_run_blocks

    text = to_markdown("t", per_run_blocks(reference_runs(), ["baseline"], [0, 1, 2], ["val_loss"]))
    assert "kept step" in text and "| 4,000 |" in text and "val_loss of the last step's model" in text
    assert "kept step" not in to_markdown("t", per_run_blocks(reference_runs("last"), ["baseline"], [0, 1, 2], ["val_loss"]))
