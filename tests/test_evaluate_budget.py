"""The evaluate stage at scale: progress on stderr, a short summary on stdout, and the loss budget
`evaluate.max_loss_tokens` (a seed-independent subset, recorded in eval.json and the report)."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import pipeline.evaluate as ev_stage
from pipeline.check_params import check
from pipeline.evaluate import evaluate, example_subset, lm_stream, lm_windows, main
from pipeline.params import Params, ParamsError, load_params
from pipeline.report import render_report
from pipeline.reporting.inputs import Run
from pipeline.reporting.loss_budget import loss_budget_blocks
from pipeline.reporting.study import Study, read_inputs
from pipeline.training import trainer
from pipeline.training.batching import Split, load_split, read_manifest
from tests.fixtures.report.fake_runs import make_project
from tests.test_evaluate_lm import CFG, CONTEXT, lm_shards, make_model, save_run, seq2seq_shards  # noqa: F401

CPU = torch.device("cpu")


def run_eval(shards: Path, tokenizer: Path, model, tmp_path: Path, name: str, cap: int | None = None,
             seed: int = 0) -> dict:
    run = save_run(model, tmp_path / f"run-{name}")
    info = json.loads((run / "train.json").read_text())
    (run / "train.json").write_text(json.dumps({**info, "seed": seed}))
    evaluate(shards, tokenizer, run, tmp_path / f"eval-{name}", CFG.model_copy(update={"max_loss_tokens": cap}),
             1024, CONTEXT, 4)
    return json.loads((tmp_path / f"eval-{name}" / "eval.json").read_text())


def spy_on_inputs(monkeypatch) -> list:
    """Every decoder input the models that evaluate loads see (the windows / batches it scores)."""
    seen = []
    load = ev_stage.load_model

    def loaded(run_dir, device):
        model = load(run_dir, device)
        model.register_forward_hook(lambda m, args, out: seen.append(args[1].clone()))
        return model

    monkeypatch.setattr(ev_stage, "load_model", loaded)
    return seen


def test_progress_lines_on_stderr_when_it_is_not_a_terminal(lm_shards, tiny_shards, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ev_stage, "PROGRESS_EVERY_S", 0.0)  # a log line on every update
    manifest = read_manifest(lm_shards / "shards")
    run_eval(lm_shards / "shards", lm_shards / "tokenizer", make_model(manifest, "decoder_only"), tmp_path, "lm")
    err = capsys.readouterr().err
    total = sum(len(d) + 1 for d in load_split(lm_shards / "shards", manifest, "validation").tgt)
    assert f"evaluate: val loss: scoring all {total:,} target tokens" in err  # said before the first batch
    assert re.search(rf"evaluate: val loss: [\d,]+ tok/{total:,} tok \(\d+%\) .* ETA \d:\d\d:\d\d", err)
    assert re.search(r"evaluate: test loss: [\d,]+ tok/[\d,]+ tok \(100%\)", err)
    assert "evaluate: continuations:" in err

    shards = seq2seq_shards(tiny_shards, "summarization", tmp_path)
    run_eval(shards, tiny_shards / "tokenizer", make_model(read_manifest(shards), "encoder_decoder"), tmp_path, "s2s")
    err = capsys.readouterr().err
    assert re.search(r"evaluate: val loss: [\d,]+ tok/[\d,]+ tok \(\d+%\)", err)
    assert f"evaluate: decoding: {CFG.max_examples} ex/{CFG.max_examples} ex (100%)" in err


def test_lm_cap_scores_the_same_evenly_spaced_windows_for_every_seed(lm_shards, tmp_path, monkeypatch):
    shards, manifest = lm_shards / "shards", read_manifest(lm_shards / "shards")
    total = sum(len(d) + 1 for d in load_split(shards, manifest, "validation").tgt)
    cap = 3 * CONTEXT + 5
    assert total > 2 * cap  # the fixture's split is long enough to be capped
    seen = spy_on_inputs(monkeypatch)
    records, inputs = [], []
    for seed in (0, 1):
        records.append(run_eval(shards, lm_shards / "tokenizer", make_model(manifest, "decoder_only", seed=seed),
                                tmp_path, f"seed{seed}", cap, seed=seed))
        inputs.append([t for t in seen])
        seen.clear()
    # The loss batches are the same tokens for both seeds (the continuations differ, so compare those
    # of the two loss passes: the first batches, all of width CONTEXT).
    loss_inputs = [[t for t in run if t.shape[1] == CONTEXT] for run in inputs]
    assert len(loss_inputs[0]) == len(loss_inputs[1]) >= 2
    assert all(torch.equal(a, b) for a, b in zip(*loss_inputs))
    for record in records:
        budget = record["loss_tokens"]
        assert budget["max_loss_tokens"] == cap
        assert budget["val"] == {"scored": 3 * CONTEXT, "total": total, "capped": True}
        # The fixture's test split is shorter than the cap: scored whole, and recorded so.
        assert budget["test"] == {"scored": budget["test"]["total"], "total": budget["test"]["total"],
                                  "capped": False} and budget["test"]["total"] <= cap
    assert records[0]["val_loss"] != records[1]["val_loss"]  # two models, the same tokens
    # Evenly spaced: window i of k at i * n // k, from the start of the split to its end.
    starts = lm_windows(total, CONTEXT, cap)
    n = math.ceil(total / CONTEXT)
    assert starts == [i * n // 3 * CONTEXT for i in range(3)] and starts[0] == 0 and starts[-1] >= total // 2


def test_capped_lm_loss_is_the_loss_of_the_chosen_windows_of_the_stream(lm_shards):
    shards, manifest = lm_shards / "shards", read_manifest(lm_shards / "shards")
    docs, eos = load_split(shards, manifest, "validation").tgt, manifest["eos_id"]
    model = make_model(manifest, "decoder_only", seed=4)
    stream = torch.from_numpy(lm_stream(docs, eos))
    starts = lm_windows(len(stream) - 1, CONTEXT, 4 * CONTEXT - 1)
    assert len(starts) == 3 and len(set(starts)) == 3
    want = 0.0
    for start in starts:  # each window alone, as the uncapped pass scores it
        piece = stream[start:start + CONTEXT + 1][None]
        logits, _ = model(None, piece[:, :-1])
        want += torch.nn.functional.cross_entropy(logits[0].double(), piece[0, 1:], reduction="sum").item()
    nats, scored = ev_stage.lm_nats(model, docs, eos, CONTEXT, 2, CPU, 4 * CONTEXT - 1)
    assert scored == 3 * CONTEXT and nats == pytest.approx(want, rel=1e-5)


def test_a_uniform_model_gives_the_same_bits_per_char_capped_or_not(lm_shards, tmp_path):
    """Zero weights: ln V nats on every token, so the subset's mean is the split's exactly."""
    shards, manifest = lm_shards / "shards", read_manifest(lm_shards / "shards")
    model = make_model(manifest, "decoder_only")
    for p in model.parameters():
        torch.nn.init.zeros_(p)
    whole = run_eval(shards, lm_shards / "tokenizer", model, tmp_path, "whole")
    capped = run_eval(shards, lm_shards / "tokenizer", model, tmp_path, "capped", CONTEXT)
    assert capped["loss_tokens"]["test"]["capped"] and not whole["loss_tokens"]["test"]["capped"]
    for key in ("test_loss", "bits_per_char", "bits_per_byte"):
        assert capped[key] == pytest.approx(whole[key], rel=1e-6)  # float32 logits


def test_a_cap_at_or_above_the_split_scores_everything_as_without_one(lm_shards, tmp_path):
    shards, manifest = lm_shards / "shards", read_manifest(lm_shards / "shards")
    model = make_model(manifest, "decoder_only", seed=2)
    whole = run_eval(shards, lm_shards / "tokenizer", model, tmp_path, "none")
    big = whole["loss_tokens"]["val"]["total"] + whole["loss_tokens"]["test"]["total"]
    same = run_eval(shards, lm_shards / "tokenizer", model, tmp_path, "big", big)
    assert not whole["loss_tokens"]["val"]["capped"] and whole["loss_tokens"]["max_loss_tokens"] is None
    assert {**same, "loss_tokens": None} == {**whole, "loss_tokens": None}  # every number bit-identical
    assert same["loss_tokens"]["val"] == whole["loss_tokens"]["val"]


def test_seq2seq_cap_takes_evenly_spaced_examples_within_the_cap():
    tgt = [np.arange(n, dtype=np.int32) for n in [5, 9, 2, 7, 7, 3, 11, 4, 6, 8]]  # 62 + 10 eos = 72 tokens
    split = Split([np.zeros(1, np.int32)] * len(tgt), tgt)
    assert example_subset(split, None, "validation") == (split, 72, 72)
    assert example_subset(split, 72, "validation") == (split, 72, 72)
    for cap in (6, 20, 40, 71):
        subset, scored, total = example_subset(split, cap, "validation")
        k = len(subset.tgt)
        picked = [i * 10 // k for i in range(k)]
        assert [len(t) for t in subset.tgt] == [len(tgt[i]) for i in picked] and picked[0] == 0
        assert scored == sum(len(tgt[i]) + 1 for i in picked) <= cap and total == 72
        assert sum(len(tgt[i]) + 1 for i in [j * 10 // (k + 1) for j in range(k + 1)]) > cap or k == 9
    with pytest.raises(ValueError, match=r"^evaluate.max_loss_tokens: 5 is below one example \(6 target tokens"):
        example_subset(split, 5, "validation")


def test_seq2seq_cap_is_recorded_and_uncapped_loss_is_the_whole_split(tiny_shards, tmp_path):
    shards = seq2seq_shards(tiny_shards, "summarization", tmp_path)
    manifest = read_manifest(shards)
    model = make_model(manifest, "encoder_decoder")
    whole = run_eval(shards, tiny_shards / "tokenizer", model, tmp_path, "whole")
    # Uncapped: the loss of every validation example, as the trainer scores a validation set.
    data = trainer.Data(task="summarization", train=load_split(shards, manifest, "train", limit=1),
                        val=load_split(shards, manifest, "validation"),
                        ids={k: manifest[k] for k in ("pad_id", "bos_id", "eos_id")},
                        batch_tokens=1024, batch_size=4, context=CONTEXT, seed=0)
    assert whole["val_loss"] == trainer.evaluate_loss(model, data, data.val_batches(10 ** 9), CPU, False)
    total = whole["loss_tokens"]["val"]["total"]
    assert whole["loss_tokens"]["val"] == {"scored": total, "total": total, "capped": False}
    capped = run_eval(shards, tiny_shards / "tokenizer", model, tmp_path, "capped", total // 3)
    assert capped["loss_tokens"]["val"]["scored"] <= total // 3 and capped["loss_tokens"]["val"]["capped"]
    assert capped["val_loss"] != whole["val_loss"] and capped["rouge1"] == whole["rouge1"]


@pytest.mark.parametrize("value", ["0", "-3", "lots", "1.5"])
def test_a_bad_cap_is_one_line_naming_the_key(tmp_path, value):
    path = tmp_path / "params.yaml"
    path.write_text(f"evaluate:\n  max_loss_tokens: {value}\n")
    with pytest.raises(ParamsError) as err:
        load_params(path)
    assert "evaluate.max_loss_tokens" in str(err.value) and "\n" not in str(err.value)


def lm_params(cap: int, text: Path) -> Params:
    return Params.model_validate({
        "data": {"source": "local", "local": {"task": "language_modeling", "paths": {"train": str(text)}}},
        "train": {"context": 64}, "evaluate": {"max_loss_tokens": cap},
        "ablations": {"baseline": {}, "long": {"train": {"context": 128}}}})


def test_check_params_rejects_a_cap_below_one_window_of_any_variant(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("x\n")
    check(lm_params(128, text), tmp_path)  # one window of the longest context fits
    with pytest.raises(ParamsError, match=r"^evaluate.max_loss_tokens: 100 is below one evaluation window of "
                                          r"ablations.long \(train.context 128 tokens\)"):
        check(lm_params(100, text), tmp_path)
    # Summarization scores whole examples (checked by evaluate, which has the data).
    check(Params.model_validate({"evaluate": {"max_loss_tokens": 10}}), tmp_path)


def test_cli_prints_a_short_summary_and_a_cap_below_a_window_is_one_line(lm_shards, tmp_path, capsys):
    manifest = read_manifest(lm_shards / "shards")
    run = save_run(make_model(manifest, "decoder_only"), tmp_path / "run")
    (run / "config.json").write_text(json.dumps({"train": {
        "threads": 1, "batch_tokens": 1024, "context": CONTEXT, "batch_size": 4, "device": "cpu"}}))
    args = ["--shards", str(lm_shards / "shards"), "--tokenizer", str(lm_shards / "tokenizer"), "--run", str(run)]
    params = tmp_path / "params.yaml"
    params.write_text(f"evaluate: {{max_new_tokens: 8, n_samples: 2, max_loss_tokens: {2 * CONTEXT}}}\n")
    main(["--params", str(params), *args, "--out", str(tmp_path / "eval")])
    out = capsys.readouterr().out
    record = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert len(out.splitlines()) <= 5 and "{" not in out  # a summary, not the JSON
    assert f"val loss {record['val_loss']:.4f}" in out and f"bits_per_char {record['bits_per_char']:.4f}" in out
    assert f"capped by evaluate.max_loss_tokens = {2 * CONTEXT}" in out
    params.write_text(f"evaluate: {{max_loss_tokens: {CONTEXT - 1}}}\n")
    with pytest.raises(SystemExit) as exc:
        main(["--params", str(params), *args, "--out", str(tmp_path / "eval2")])
    assert str(exc.value).startswith(f"evaluate: evaluate.max_loss_tokens: {CONTEXT - 1} is below one window")
    assert "\n" not in str(exc.value) and not (tmp_path / "eval2").exists()


def capped_record(scored: int) -> dict:
    return {"max_loss_tokens": 1000, "val": {"scored": scored, "total": 50_000, "capped": True},
            "test": {"scored": 1000, "total": 40_000, "capped": True}}


NOTE = ("Loss scoring capped (evaluate.max_loss_tokens = 1,000) in every run: val_loss on 900–1,000 of "
        "50,000 target tokens (1.8–2.0%); test_loss on 1,000 of 40,000 target tokens (2.5%).")


def test_loss_budget_note_says_when_and_how_much_loss_was_capped():
    uncapped = {"max_loss_tokens": None, "val": {"scored": 5, "total": 5, "capped": False},
                "test": {"scored": 4, "total": 4, "capped": False}}
    runs = {("a", s): Run("a", s, eval={"val_loss": 1.0, "loss_tokens": uncapped}) for s in (0, 1)}
    runs[("old", 0)] = Run("old", 0, eval={"val_loss": 1.0})  # an eval.json from before the budget
    assert loss_budget_blocks(runs) == []
    runs = {("a", s): Run("a", s, eval={"loss_tokens": capped_record(1000 if s else 900)}) for s in (0, 1)}
    assert [b.text for b in loss_budget_blocks(runs)][0].startswith(NOTE)
    runs[("b", 0)] = Run("b", 0, eval={"loss_tokens": uncapped})
    assert "in 2 of 3 runs" in loss_budget_blocks(runs)[0].text


@pytest.mark.slow
def test_report_shows_the_loss_budget_note(tmp_path):
    p = make_project(tmp_path)
    for i, path in enumerate(sorted(p.evals.glob("*/eval.json"))):
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "loss_tokens": capped_record(1000 if i else 900)}))
    out = tmp_path / "reports"
    render_report(read_inputs(Study(p.runs, p.evals, p.filter_metrics, p.variants, p.seeds, "baseline")), out)
    for name in ("report.md", "report.html"):
        assert NOTE in (out / name).read_text(encoding="utf-8").replace("&#x27;", "'")
