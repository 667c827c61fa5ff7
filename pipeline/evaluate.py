"""Stage `evaluate`: losses, the task metric, sample outputs and attention maps of one trained run.

    python -m pipeline.evaluate --shards data/shards --tokenizer data/tokenizer \
        --run data/runs/baseline-0 --out data/eval/baseline-0

Task metrics come from the reference libraries: ROUGE-1/2/L and ROUGE-Lsum F1 (rouge-score) for
summarization, BLEU and chrF (sacrebleu) for translation, always against the dataset's raw
reference text (kept in the shards), never against ids decoded back. Generated outputs are also
checked for degeneracy (pipeline.scoring.output_checks): eval.json's `degenerate` lists what looks wrong.
Language modelling reports bits per token, character and UTF-8 byte of the test text, and
sampled continuations of the first test documents.
MLflow receives these metrics and files from the report stage (in the run the train stage opened).

Language modelling, how it is measured:
- Loss: every token of every document and each document's closing eos is predicted once, in
  non-overlapping windows of the training context over [eos, doc 1, eos, doc 2, eos, ...]: the
  stream the model was trained on, with a leading eos so the first document is scored too.
- bits_per_char = total test nats / ln 2 / characters of the raw test text (each document as
  the dataset has it, plus one character for the separator its eos stands for);
  bits_per_byte likewise over UTF-8 bytes. Unlike bits per token they compare across tokenizers.
- Continuations: the first `evaluate.prompt_tokens` tokens (at most context / 2) of the first test
  documents are fed causally, as in training (after the separating eos; no bos, which the LM
  stream never contains), and continued with the evaluate settings (greedy or sample);
  reference = the document's true continuation. Prompt + continuation stay within the context.

The loss budget, `evaluate.max_loss_tokens` (unset: every token of both splits, as above): a cap
scores the loss on a subset of each split, chosen from the split alone (never from the seed or the
model), so every run scores the same tokens and paired comparisons stay paired: evenly spaced LM
windows (window i of k at index i * n // k; k = cap // context whole windows), or evenly spaced
seq2seq examples (the largest such k whose target tokens fit the cap). bits_per_char/byte then
take the subset's mean loss as the whole test split's. eval.json's `loss_tokens` records, per
split, the tokens scored out of the split's total and whether the cap applied.

Progress (pipeline.io.progress) goes to stderr: a line when each phase starts, then a tqdm bar on a
terminal or a log line with ETA every PROGRESS_EVERY_S seconds under DVC/CI; stdout gets a short
summary at the end (eval.json holds the data).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from model.generate import decode_loop, next_token_picker
from pipeline.io.atomic import atomic_path
from pipeline.io.progress import Progress
from pipeline.params import EvaluateParams, ParamsError, load_params, stage_error
from pipeline.scoring.metrics import task_metrics
from pipeline.scoring.output_checks import flags, output_stats
from pipeline.scoring.run_files import load_model, read_object, run_settings
from pipeline.train_bpe import load_tokenizer
from pipeline.training import trainer
from pipeline.training.batching import Split, collate, load_split, load_texts, read_manifest
from pipeline.training.batching import lm_stream as training_stream
from pipeline.training.checkpoint import LAST_MODEL
from pipeline.training.device import recorded_slots, resolve_device, set_up_cpu
from pipeline.training.gpu_lock import claimed

# The LM attention map: the first tokens of a validation document (at most context / 2); a
# candidate for an `evaluate.prompt_tokens` param.
ATTENTION_TOKENS = 64


# Seconds between progress log lines under DVC/CI (tests lower it to see lines at once).
PROGRESS_EVERY_S = 10.0


def note(text: str) -> None:
    """A line on stderr at the start of a phase, so a long evaluation says what it is doing at once."""
    print(f"evaluate: {text}", file=sys.stderr, flush=True)


def progress(what: str, total: float, unit: str) -> Progress:
    return Progress(f"evaluate: {what}", total=total, unit=unit, every_s=PROGRESS_EVERY_S)


SWEEP_KEYS = ("lr", "scale")  # where a sweep run sits (train.json), carried into eval.json


def cap_error(cap: int, unit: str, tokens: int, key_hint: str) -> ValueError:
    return ValueError(f"evaluate.max_loss_tokens: {cap:,} is below one {unit} ({tokens:,} target tokens"
                      f"{key_hint}); raise it or leave it unset to score the whole split")


def example_subset(split: Split, cap: int | None, name: str) -> tuple[Split, int, int]:
    """(the examples scored, their target tokens, the split's target tokens). Under a cap: k evenly
    spaced examples (i * n // k), k the largest whose target tokens (each + eos) fit the cap, by
    bisection (the sum grows with k only nearly monotonically; the k found fits, whatever it is)."""
    tokens = np.fromiter((len(t) + 1 for t in split.tgt), dtype=np.int64, count=len(split.tgt))
    total, n = int(tokens.sum()), len(tokens)
    if cap is None or total <= cap:
        return split, total, total
    lo, hi, k = 1, n - 1, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if tokens[np.arange(mid) * n // mid].sum() <= cap:
            k, lo = mid, mid + 1
        else:
            hi = mid - 1
    if k == 0:
        raise cap_error(cap, "example", int(tokens[0]), f", the first of the {name} split")
    pick = np.arange(k) * n // k
    return Split([split.src[i] for i in pick], [split.tgt[i] for i in pick]), int(tokens[pick].sum()), total


def split_loss(model, train_head: Split, split: Split, ids: dict, task: str, batch_tokens: int, context: int,
               batch_size: int, device: torch.device, what: str, total_tokens: int) -> float:
    data = trainer.Data(task=task, train=train_head, val=split, ids=ids,
                        batch_tokens=batch_tokens, batch_size=batch_size, context=context, seed=0)
    with progress(what, total_tokens, "tok") as bar:
        return trainer.evaluate_loss(model, data, data.val_batches(10 ** 9), device, False, on_batch=bar.update)


def decode(model, split, texts: tuple[list[str], list[str]], ids: dict, cfg: EvaluateParams, sp,
           device: torch.device) -> tuple[list[str], list[str], list[str]]:
    """Generate for the first examples; sources and references are the raw dataset texts."""
    n = min(cfg.max_examples, len(split.src))
    sources, references, predictions = [], [], []
    generator = torch.Generator(device).manual_seed(0)
    note(f"decoding {n:,} test examples ({cfg.decode}, at most {cfg.max_new_tokens} new tokens each)")
    with progress("decoding", n, "ex") as bar:
        for start in range(0, n, cfg.batch_size):
            idx = list(range(start, min(n, start + cfg.batch_size)))
            src, _, _ = collate(split, idx, **ids)
            out = model.generate(src.to(device), max_new_tokens=cfg.max_new_tokens, strategy=cfg.decode,
                                 beam_size=cfg.beam_size, length_penalty=cfg.length_penalty,
                                 temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                                 generator=generator)
            for i, tokens in zip(idx, out):
                sources.append(texts[0][i])
                references.append(texts[1][i])
                predictions.append(sp.decode(list(tokens)))
            bar.update(len(idx))
    return sources, references, predictions


def attention_example(model, split, ids: dict, sp, device: torch.device) -> dict:
    src, tgt_in, _ = collate(split, [0], **ids)
    maps = model.attention_maps(src.to(device), tgt_in.to(device))
    return {"src_tokens": [sp.id_to_piece(int(t)) for t in split.src[0]],
            "tgt_tokens": ["<s>"] + [sp.id_to_piece(int(t)) for t in split.tgt[0]],
            "maps": {name: m.float().tolist() for name, m in maps.items()}}


# -- language modelling ------------------------------------------------------------------------
def lm_stream(docs: list[np.ndarray], eos_id: int) -> np.ndarray:
    """[eos, doc 1, eos, doc 2, eos, ...]: the training stream, plus a leading eos."""
    return np.concatenate([[eos_id], training_stream(Split(docs, docs), eos_id)]).astype(np.int64)


def lm_windows(n_pred: int, context: int, cap: int | None) -> list[int]:
    """Start of each window scored: all of them, or under a cap k = cap // context evenly spaced
    ones (window i * n // k of n), chosen from the stream's length alone."""
    starts = list(range(0, n_pred, context))
    if cap is None or n_pred <= cap:
        return starts
    k = cap // context
    if k < 1:
        raise cap_error(cap, "window", context, ", train.context")
    return [starts[i * len(starts) // k] for i in range(k)]


@torch.no_grad()
def lm_nats(model, docs: list[np.ndarray], eos_id: int, context: int, batch_size: int,
            device: torch.device, max_tokens: int | None = None, what: str = "loss") -> tuple[float, int]:
    """(summed next-token loss in nats, tokens predicted) over every token after the leading eos,
    or over the windows `lm_windows` picks under `max_tokens`."""
    stream = torch.from_numpy(lm_stream(docs, eos_id))
    n_pred = len(stream) - 1
    starts = lm_windows(n_pred, context, max_tokens)
    scored = sum(min(context, n_pred - s) for s in starts)
    note(scoring(what, scored, n_pred, len(starts), f"windows of {context}"))
    total = torch.zeros((), dtype=torch.float64, device=device)
    with progress(what, scored, "tok") as bar:
        for i in range(0, len(starts), batch_size):
            rows = starts[i:i + batch_size]
            inp = torch.full((len(rows), context), eos_id, dtype=torch.long)
            out = torch.full((len(rows), context), -100, dtype=torch.long)  # -100: not scored
            for r, s in enumerate(rows):
                piece = stream[s:s + context + 1]
                inp[r, :len(piece) - 1], out[r, :len(piece) - 1] = piece[:-1], piece[1:]
            logits, _ = model(None, inp.to(device))
            nll = F.cross_entropy(logits.flatten(0, 1).float(), out.flatten().to(device), reduction="sum")
            total += nll.double()
            bar.update(sum(min(context, n_pred - s) for s in rows))
    return float(total), scored


def loss_tokens(scored: int, total: int) -> dict:
    """eval.json's record of one split's loss budget."""
    return {"scored": scored, "total": total, "capped": scored < total}


def lm_metrics(model, val: Split, test: Split, test_texts: list[str], eos_id: int, context: int,
               batch_size: int, device: torch.device, max_tokens: int | None = None) -> tuple[dict, dict]:
    """(metrics, loss_tokens per split)."""
    metrics, nats, counted = {}, {}, {}
    for split, name in ((val, "val"), (test, "test")):
        total = sum(len(d) + 1 for d in split.tgt)  # each document and its eos, after the leading eos
        nats[name], n = lm_nats(model, split.tgt, eos_id, context, batch_size, device, max_tokens, f"{name} loss")
        metrics[f"{name}_loss"] = nats[name] / max(n, 1)
        metrics[f"{name}_ppl"] = math.exp(min(metrics[f"{name}_loss"], 50))
        counted[name] = loss_tokens(n, total)
    texts = [t + "\n" for t in test_texts]  # raw text; "\n": the separator eos predicts
    bits = nats["test"] / math.log(2)
    if counted["test"]["capped"]:  # the subset's mean loss, taken as the whole split's
        bits *= counted["test"]["total"] / max(counted["test"]["scored"], 1)
    metrics["bits_per_char"] = bits / max(1, sum(map(len, texts)))
    metrics["bits_per_byte"] = bits / max(1, sum(len(t.encode("utf-8")) for t in texts))
    return metrics, counted


def scoring(what: str, scored: int, total: int, pieces: int, unit: str) -> str:
    """What a loss phase is about to score: its first progress line."""
    if scored == total:
        return f"{what}: scoring all {total:,} target tokens ({pieces:,} {unit})"
    return (f"{what}: scoring {scored:,} of {total:,} target tokens ({pieces:,} evenly spaced {unit}; "
            f"evaluate.max_loss_tokens)")


def pick_next(cfg: EvaluateParams, generator: torch.Generator):
    """logits (B, V) -> next tokens (B,): model.generate's greedy pick or its draw with temperature /
    top-k / top-p, as the evaluate settings say."""
    if cfg.decode == "beam":
        raise ValueError("evaluate.decode: beam is not supported for language-model continuations "
                         "(use greedy or sample)")
    return next_token_picker(cfg.decode, cfg.temperature, cfg.top_k, cfg.top_p, generator)


@torch.no_grad()
def continue_prompts(model, prompts: torch.Tensor, max_new_tokens: int, pick,
                     eos_id: int) -> list[list[int]]:
    """Feed prompts (B, P) one token at a time (causally, as in training; prefix_lm's bidirectional
    prefix would be a context it never trained on), then extend each row until eos: model.generate's
    decoding loop, the prompt in place of bos."""
    # Steps: one per token fed, the prompt's and then all but the last new one.
    with progress("continuations", prompts.shape[1] - 1 + max_new_tokens, "step") as bar:
        tokens, _ = decode_loop(model, prompts[:, :0], max_new_tokens, pick, prompt=prompts,
                                on_step=lambda: bar.update(1))
    return [row[:row.index(eos_id)] if eos_id in row else row for row in tokens.tolist()]


def lm_samples(model, test: Split, sp, cfg: EvaluateParams, eos_id: int, context: int,
               device: torch.device) -> list[dict]:
    """Continuations of the first test documents longer than the prompt; prompt + continuation
    stays within the training context (positions beyond it were never trained). A split with fewer
    documents than `n_samples` (one long text) gives passages spread evenly through its text."""
    p = min(cfg.prompt_tokens, context // 2)  # short contexts (tests) still leave room to continue
    # Fed: eos + prompt + all but the last new token, so p + n_new positions in all.
    n_new = min(cfg.max_new_tokens, context - p, model.cfg.max_len - p)
    docs = [d for d in test.tgt if len(d) > p][:cfg.n_samples]
    if 0 < len(docs) < cfg.n_samples and n_new >= 1:
        passages = [d[i:] for d in docs for i in range(0, len(d) - p, p + n_new)]
        picks = np.linspace(0, len(passages) - 1, min(cfg.n_samples, len(passages))).round()
        docs = [passages[int(i)] for i in picks]
    if not docs or n_new < 1:
        return []
    prompts = torch.tensor(np.stack([lm_stream([d[:p]], eos_id)[:-1] for d in docs]), device=device)
    generator = torch.Generator(device).manual_seed(0)
    note(f"continuing {len(docs)} test prompts ({cfg.decode}, at most {n_new} new tokens each)")
    outputs = continue_prompts(model, prompts, n_new, pick_next(cfg, generator), eos_id)
    return [{"source": sp.decode(d[:p].tolist()), "reference": sp.decode(d[p:p + n_new].tolist()),
             "prediction": sp.decode(out)} for d, out in zip(docs, outputs)]


def lm_attention(model, val: Split, sp, eos_id: int, context: int, device: torch.device) -> dict:
    """decoder.self of the first window of the validation stream (starting at its leading eos)."""
    window = lm_stream(val.tgt[:1], eos_id)[:min(context, ATTENTION_TOKENS)]
    maps = model.attention_maps(None, torch.from_numpy(window)[None].to(device))
    return {"src_tokens": [], "tgt_tokens": [sp.id_to_piece(int(t)) for t in window],
            "maps": {name: m.float().tolist() for name, m in maps.items()}}


def evaluate(shards: Path, tokenizer: Path, run_dir: Path, out: Path, cfg: EvaluateParams, batch_tokens: int,
             context: int, batch_size: int, device: torch.device = torch.device("cpu")) -> dict:
    manifest = read_manifest(shards)
    info = read_object(run_dir / "train.json", ("variant", "seed"))
    task = manifest["task"]
    point = {k: info[k] for k in SWEEP_KEYS if k in info}
    metrics = {"variant": info["variant"], "seed": info["seed"], **point, "task": task}
    if info.get("diverged"):  # a learning-rate sweep's rate too high: a result, with no model to score
        metrics["diverged"] = info["diverged"]
        with atomic_path(out) as tmp:
            tmp.mkdir(parents=True)
            (tmp / "eval.json").write_text(json.dumps(metrics, indent=2) + "\n")
        return metrics
    note(f"{run_dir}: loading the model and the {task} splits")
    model = load_model(run_dir, device)
    sp = load_tokenizer(tokenizer)
    ids = {k: manifest[k] for k in ("pad_id", "bos_id", "eos_id")}
    test = load_split(shards, manifest, "test")
    if task == "language_modeling":
        eos, val = ids["eos_id"], load_split(shards, manifest, "validation")
        test_texts = load_texts(shards, manifest, "test")[1]
        lm, counted = lm_metrics(model, val, test, test_texts, eos, context, batch_size, device, cfg.max_loss_tokens)
        metrics.update(lm)
        if (run_dir / LAST_MODEL).exists():  # train.keep = best kept an earlier step: the last one too
            nats, n = lm_nats(load_model(run_dir, device, LAST_MODEL), val.tgt, eos, context, batch_size, device,
                              cfg.max_loss_tokens, "val loss, last step's model")
            metrics["val_loss_last"] = nats / max(n, 1)
        samples = lm_samples(model, test, sp, cfg, eos, context, device)
        attention = lm_attention(model, val, sp, eos, context, device)
        metrics["n_decoded"] = len(samples)
        predictions = [s["prediction"] for s in samples]
    else:
        counted, train_head = {}, load_split(shards, manifest, "train", limit=1)
        for split, name in (("validation", "val"), ("test", "test")):
            whole = test if split == "test" else load_split(shards, manifest, split)
            subset, scored, total = example_subset(whole, cfg.max_loss_tokens, split)
            note(scoring(f"{name} loss", scored, total, len(subset.tgt), "examples"))
            loss = split_loss(model, train_head, subset, ids, task, batch_tokens, context, batch_size, device,
                              f"{name} loss", scored)
            metrics[f"{name}_loss"], metrics[f"{name}_ppl"] = loss, math.exp(min(loss, 50))
            counted[name] = loss_tokens(scored, total)
            if name == "val" and (run_dir / LAST_MODEL).exists():  # train.keep = best: the last step's too
                metrics["val_loss_last"] = split_loss(load_model(run_dir, device, LAST_MODEL), train_head, subset, ids,
                                                      task, batch_tokens, context, batch_size, device,
                                                      "val loss, last step's model", scored)
        texts = load_texts(shards, manifest, "test", limit=cfg.max_examples)
        sources, references, predictions = decode(model, test, texts, ids, cfg, sp, device)
        metrics.update(task_metrics(task, references, predictions))
        metrics["n_decoded"] = len(predictions)
        samples = [{"source": s, "reference": r, "prediction": p}
                   for s, r, p in list(zip(sources, references, predictions))[:cfg.n_samples]]
        first_val = load_split(shards, manifest, "validation", limit=1)
        attention = attention_example(model, first_val, ids, sp, device)
    metrics["bits_per_token"] = metrics["test_loss"] / math.log(2)
    # Degeneracy of what the model wrote (summaries, translations or LM continuations).
    metrics["outputs"] = output_stats(predictions)
    metrics["degenerate"] = flags(metrics["outputs"], len(predictions))
    metrics["normalization"] = manifest.get("normalization", "not recorded")
    if device.type == "cuda" and claimed():  # which GPU of the machine, and why (gpu_lock)
        metrics["gpu"] = claimed().record()
    if manifest.get("unigram_val_loss") is not None:  # the plateau the report reads val_loss against
        metrics["unigram_val_loss"] = manifest["unigram_val_loss"]
    # Last, so an uncapped eval.json reads as before up to here.
    metrics["loss_tokens"] = {"max_loss_tokens": cfg.max_loss_tokens, **counted}
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        (tmp / "eval.json").write_text(json.dumps(metrics, indent=2) + "\n")
        (tmp / "samples.json").write_text(json.dumps(samples, indent=2, ensure_ascii=False) + "\n")
        (tmp / "attention.json").write_text(json.dumps(attention) + "\n")
    return metrics


# The task metric the summary prints, per task (eval.json has them all).
SUMMARY_METRICS = {"summarization": ("rouge1", "rouge2", "rougeL", "rougeLsum"), "translation": ("bleu", "chrf"),
                   "language_modeling": ("bits_per_char", "bits_per_byte")}


def summary(metrics: dict, out: Path) -> str:
    """The few lines evaluate prints on stdout when it is done; eval.json holds the data."""
    point = "".join(f" {k} {metrics[k]}" for k in SWEEP_KEYS if k in metrics)
    head = f"evaluate: {metrics['variant']} seed {metrics['seed']}{point} ({metrics['task']})"
    if metrics.get("diverged"):
        return f"{head}: training diverged ({metrics['diverged']}), nothing to score\n  wrote {out / 'eval.json'}"
    lines = [f"{head}: val loss {metrics['val_loss']:.4f} (ppl {metrics['val_ppl']:.2f}), "
             f"test loss {metrics['test_loss']:.4f} (ppl {metrics['test_ppl']:.2f})"]
    task = ", ".join(f"{k} {metrics[k]:.4f}" for k in SUMMARY_METRICS.get(metrics["task"], ()) if k in metrics)
    lines.append(f"  {task + '; ' if task else ''}{metrics['n_decoded']} outputs generated"
                 + (f"; degenerate: {'; '.join(metrics['degenerate'])}" if metrics["degenerate"] else ""))
    budget = metrics["loss_tokens"]
    splits = [f"{name} {budget[name]['scored']:,} of {budget[name]['total']:,} "
              f"({budget[name]['scored'] / max(budget[name]['total'], 1):.1%})" for name in ("val", "test")]
    if any(budget[name]["capped"] for name in ("val", "test")):
        lines.append(f"  loss capped by evaluate.max_loss_tokens = {budget['max_loss_tokens']:,}: "
                     f"target tokens scored {', '.join(splits)}")
    else:
        lines.append(f"  loss over every target token: val {budget['val']['total']:,}, test {budget['test']['total']:,}")
    lines.append(f"  wrote {out / 'eval.json'}")
    return "\n".join(lines)


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
        # Batch shapes come from the variant's own resolved training settings (written by train).
        t = run_settings(Path(args.run))
        set_up_cpu(t.threads)  # the threads, kernels and allocator training ran with
        metrics = evaluate(Path(args.shards), Path(args.tokenizer), Path(args.run), Path(args.out),
                           params.evaluate, t.batch_tokens, t.context, t.batch_size,
                           resolve_device(t.device, slots=recorded_slots(Path(args.run))))
    except (ParamsError, ValueError, OSError, KeyError) as exc:
        raise stage_error("evaluate", exc) from None
    # MLflow gets these from the report stage, in one process for all runs: importing MLflow and
    # opening its store here cost ~2 s in each of the study's evaluate stages.
    print(summary(metrics, Path(args.out)))


if __name__ == "__main__":
    from pipeline.warm.exit import run_main

    run_main(main)  # exits at once: no teardown of the imported modules (pipeline/warm/exit.py)
