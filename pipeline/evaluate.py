"""Stage `evaluate`: losses, the task metric, sample outputs and attention maps of one trained run.

    python -m pipeline.evaluate --shards data/shards --tokenizer data/tokenizer \
        --run data/runs/baseline-0 --out data/eval/baseline-0

Task metrics come from the reference libraries: ROUGE-1/2/L F1 (rouge-score) for summarization,
BLEU and chrF (sacrebleu) for translation, bits per token/character for language modelling.
Results are added to the variant's MLflow run from the train stage.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import sentencepiece as spm
import torch

from pipeline import trainer
from pipeline.atomic import atomic_path
from pipeline.batching import collate, load_split, read_manifest
from pipeline.params import EvaluateParams, ParamsError, load_params
from pipeline.tracking import Tracker


def load_model(run_dir: Path):
    from model import ModelConfig, build_model

    state = torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True)
    model = build_model(ModelConfig(**state["model_config"]))
    model.load_state_dict(state["state_dict"])
    return model.eval()


def split_loss(model, shards: Path, manifest: dict, split: str, batch_tokens: int, context: int,
               batch_size: int) -> float:
    data = trainer.Data(task=manifest["task"], train=load_split(shards, manifest, "train", limit=1),
                        val=load_split(shards, manifest, split),
                        ids={k: manifest[k] for k in ("pad_id", "bos_id", "eos_id")},
                        batch_tokens=batch_tokens, batch_size=batch_size, context=context, seed=0)
    return trainer.evaluate_loss(model, data, data.val_batches(10 ** 9), torch.device("cpu"), False)


def decode(model, split, ids: dict, cfg: EvaluateParams, sp) -> tuple[list[str], list[str], list[str]]:
    n = min(cfg.max_examples, len(split.src))
    sources, references, predictions = [], [], []
    generator = torch.Generator().manual_seed(0)
    for start in range(0, n, cfg.batch_size):
        idx = list(range(start, min(n, start + cfg.batch_size)))
        src, _, _ = collate(split, idx, **ids)
        out = model.generate(src, max_new_tokens=cfg.max_new_tokens, strategy=cfg.decode, beam_size=cfg.beam_size,
                             length_penalty=cfg.length_penalty, temperature=cfg.temperature, top_k=cfg.top_k,
                             top_p=cfg.top_p, generator=generator)
        for i, tokens in zip(idx, out):
            sources.append(sp.decode(split.src[i].tolist()))
            references.append(sp.decode(split.tgt[i].tolist()))
            predictions.append(sp.decode(list(tokens)))
    return sources, references, predictions


def task_metrics(task: str, references: list[str], predictions: list[str]) -> dict:
    if task == "summarization":
        from rouge_score import rouge_scorer

        scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
        scores = [scorer.score(r, p) for r, p in zip(references, predictions)]
        return {k: sum(s[k].fmeasure for s in scores) / max(1, len(scores)) for k in ("rouge1", "rouge2", "rougeL")}
    if task == "translation":
        import sacrebleu

        return {"bleu": sacrebleu.corpus_bleu(predictions, [references]).score,
                "chrf": sacrebleu.corpus_chrf(predictions, [references]).score}
    return {}


def attention_example(model, split, ids: dict, sp) -> dict:
    src, tgt_in, _ = collate(split, [0], **ids)
    with torch.no_grad():
        maps = model.attention_maps(src, tgt_in)
    return {"src_tokens": [sp.id_to_piece(int(t)) for t in split.src[0]],
            "tgt_tokens": ["<s>"] + [sp.id_to_piece(int(t)) for t in split.tgt[0]],
            "maps": {name: m.float().tolist() for name, m in maps.items()}}


def evaluate(shards: Path, tokenizer: Path, run_dir: Path, out: Path, cfg: EvaluateParams, batch_tokens: int,
             context: int, batch_size: int) -> dict:
    manifest = read_manifest(shards)
    info = json.loads((run_dir / "train.json").read_text())
    model = load_model(run_dir)
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer / "spm.model"))
    ids = {k: manifest[k] for k in ("pad_id", "bos_id", "eos_id")}
    task = manifest["task"]
    metrics = {"variant": info["variant"], "seed": info["seed"], "task": task}
    for split, name in (("validation", "val"), ("test", "test")):
        loss = split_loss(model, shards, manifest, split, batch_tokens, context, batch_size)
        metrics[f"{name}_loss"], metrics[f"{name}_ppl"] = loss, math.exp(min(loss, 50))
    metrics["bits_per_token"] = metrics["test_loss"] / math.log(2)
    test = load_split(shards, manifest, "test")
    samples, attention = [], None
    if task != "language_modeling":
        sources, references, predictions = decode(model, test, ids, cfg, sp)
        metrics.update(task_metrics(task, references, predictions))
        metrics["n_decoded"] = len(predictions)
        samples = [{"source": s, "reference": r, "prediction": p}
                   for s, r, p in list(zip(sources, references, predictions))[:cfg.n_samples]]
        attention = attention_example(model, load_split(shards, manifest, "validation", limit=1), ids, sp)
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        (tmp / "eval.json").write_text(json.dumps(metrics, indent=2) + "\n")
        (tmp / "samples.json").write_text(json.dumps(samples, indent=2, ensure_ascii=False) + "\n")
        (tmp / "attention.json").write_text(json.dumps(attention) + "\n")
    return {**metrics, "mlflow_run_id": info.get("mlflow_run_id")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--shards", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        params = load_params(args.params)
        t = params.train
        torch.set_num_threads(t.threads or torch.get_num_threads())
        metrics = evaluate(Path(args.shards), Path(args.tokenizer), Path(args.run), Path(args.out),
                           params.evaluate, t.batch_tokens, t.context, t.batch_size)
    except (ParamsError, ValueError, OSError, KeyError) as exc:
        raise SystemExit(f"evaluate: {exc}")
    if metrics["mlflow_run_id"]:
        tracker = Tracker()
        tracker.start(params.report.experiment, "", {"evaluated": "true"}, run_id=metrics["mlflow_run_id"])
        tracker.log_metrics({k: v for k, v in metrics.items() if isinstance(v, float)}, step=0)
        for name in ("eval.json", "samples.json"):
            tracker.log_artifact(Path(args.out) / name)
        tracker.end()
    print(json.dumps({k: v for k, v in metrics.items() if k != "mlflow_run_id"}))


if __name__ == "__main__":
    main()
