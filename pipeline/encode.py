"""Stage `encode`: token ids of every split into parquet shards, plus a manifest.

    python -m pipeline.encode --data data/filtered --tokenizer data/tokenizer --out data/shards

Streaming: rows are read, encoded and written in record batches, never the whole corpus at once.
Shards hold bare ids (no bos/eos): where those go is the model layout's business, not the data's.
They also keep each example's raw text (`src_text`, `tgt_text`): evaluation scores against the
dataset's own text, not against ids decoded back (a character outside the vocabulary would come
back as " ⁇ ", and the score would be computed against text that is not the dataset's).
`max_source_tokens` keeps only the first N token ids of each source (lead truncation, as See et
al. 2017 cut CNN/DailyMail articles to 400 tokens: the lead carries most of what the highlights
say); `src_text` stays whole, and the manifest counts the sources that were cut.
`max_target_tokens` does the same to each target's ids (CNN/DailyMail seed study 000 cut both
sides to 512 tokens); `tgt_text`, the reference evaluation scores against, stays whole. The
manifest records it, and the targets cut, only when it is set (unset, the shards are as before).

The manifest also records the unigram plateau (`unigram_val_loss`): the validation cross-entropy,
in nats per target token (eos included, as the training loss counts it), of a model that knows
only the training split's token frequencies (add-one smoothed). A trained model's val_loss is
read against it: a loss near this value means the model has learnt frequencies, not text.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import sentencepiece as spm

from pipeline.io.atomic import atomic_path
from pipeline.io.progress import Progress
from pipeline.params import ParamsError, load_params, stage_error
from pipeline.train_bpe import describe_normalization, file_sha256, load_tokenizer

SPLITS = ("train", "validation", "test")
THREADS = os.cpu_count() or 1  # SentencePiece encodes a batch in this many threads (a stage runs alone)
IDS = pa.list_(pa.int32())
SCHEMA = pa.schema([("src_ids", pa.list_(pa.int32())), ("tgt_ids", pa.list_(pa.int32())),
                    ("src_text", pa.large_string()), ("tgt_text", pa.large_string())])


def encode_split(parquet: Path, sp: spm.SentencePieceProcessor, out_dir: Path, split: str,
                 shard_examples: int, max_source_tokens: int | None = None,
                 counts: np.ndarray | None = None, progress: Progress | None = None,
                 max_target_tokens: int | None = None) -> dict:
    """Write one split's shards; add its target token counts (one eos a row) to `counts`."""
    files, examples, src_tokens, tgt_tokens, truncated, truncated_tgt = [], 0, 0, 0, 0, 0
    writer, in_shard = None, 0
    # Column chunks read piece by piece (by default Arrow reads a whole row group's chunk at once).
    source = pq.ParquetFile(parquet, buffer_size=1 << 20, pre_buffer=False)
    for batch in source.iter_batches(batch_size=min(shard_examples, 4096), columns=["source", "target"]):
        src_text, tgt_text = (batch.column(name).cast(pa.large_string()) for name in ("source", "target"))
        # Encoded in THREADS threads; the ids go straight to Arrow arrays (no Python loop over tokens).
        src, tgt = (pa.array(sp.encode(text.to_pylist(), num_threads=THREADS), IDS) for text in (src_text, tgt_text))
        if max_source_tokens is not None:
            truncated += int(np.count_nonzero(pc.list_value_length(src).to_numpy() > max_source_tokens))
            src = pc.list_slice(src, 0, max_source_tokens)
        if max_target_tokens is not None:
            truncated_tgt += int(np.count_nonzero(pc.list_value_length(tgt).to_numpy() > max_target_tokens))
            tgt = pc.list_slice(tgt, 0, max_target_tokens)
        if counts is not None and len(tgt):
            counts += np.bincount(tgt.flatten().to_numpy(), minlength=len(counts))
            counts[sp.eos_id()] += len(tgt)
        start = 0
        while start < len(src):
            if writer is None:
                name = f"{split}-{len(files):05d}.parquet"
                writer = pq.ParquetWriter(out_dir / name, SCHEMA)
                files.append(name)
                in_shard = 0
            take = min(shard_examples - in_shard, len(src) - start)
            rows = [column.slice(start, take) for column in (src, tgt, src_text, tgt_text)]
            writer.write_table(pa.Table.from_arrays(rows, schema=SCHEMA))
            src_tokens += len(rows[0].flatten())
            tgt_tokens += len(rows[1].flatten())
            examples += take
            in_shard += take
            start += take
            if in_shard == shard_examples:
                writer.close()
                writer = None
        if progress is not None:
            progress.update(batch.num_rows)
    if writer is not None:
        writer.close()
    out = {"files": files, "examples": examples, "src_tokens": src_tokens, "tgt_tokens": tgt_tokens,
           "truncated_sources": truncated}
    if max_target_tokens is not None:
        out["truncated_targets"] = truncated_tgt
    return out


def unigram_loss(train_counts: np.ndarray, eval_counts: np.ndarray) -> float | None:
    """Cross-entropy (nats/token) of `eval_counts` under add-one smoothed `train_counts` frequencies."""
    n = int(eval_counts.sum())
    if n == 0:
        return None
    log_p = np.log(train_counts + 1.0) - math.log(float(train_counts.sum()) + len(train_counts))
    return float(-(eval_counts * log_p).sum() / n)


def encode(data_dir: Path, tokenizer_dir: Path, out: Path, shard_examples: int,
           max_source_tokens: int | None = None, max_target_tokens: int | None = None) -> dict:
    model_file = tokenizer_dir / "spm.model"
    sp = load_tokenizer(tokenizer_dir)
    meta_path = data_dir / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    manifest = {
        "task": meta.get("task", "summarization"),
        "source": meta.get("source"),
        "vocab_size": sp.get_piece_size(),
        "pad_id": sp.pad_id(), "unk_id": sp.unk_id(), "bos_id": sp.bos_id(), "eos_id": sp.eos_id(),
        "tokenizer_sha256": file_sha256(model_file),
        "normalization": describe_normalization(tokenizer_dir),
        "max_source_tokens": max_source_tokens,
        **({"max_target_tokens": max_target_tokens} if max_target_tokens is not None else {}),
        "splits": {},
    }
    # Target token counts of the two splits the plateau needs (test is not counted).
    counts = {split: np.zeros(sp.get_piece_size(), dtype=np.int64) for split in ("train", "validation")}
    rows = sum(pq.ParquetFile(data_dir / f"{split}.parquet").metadata.num_rows for split in SPLITS)
    with atomic_path(out) as tmp, Progress("encode", total=rows, unit="rows") as progress:
        tmp.mkdir(parents=True)
        for split in SPLITS:
            manifest["splits"][split] = encode_split(data_dir / f"{split}.parquet", sp, tmp, split,
                                                      shard_examples, max_source_tokens, counts.get(split),
                                                      progress, max_target_tokens)
        manifest["unigram_val_loss"] = unigram_loss(counts["train"], counts["validation"])
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--data", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        cfg = load_params(args.params).encode
        encode(Path(args.data), Path(args.tokenizer), Path(args.out), cfg.shard_examples,
               cfg.max_source_tokens, cfg.max_target_tokens)
    except (ParamsError, ValueError, OSError) as exc:
        raise stage_error("encode", exc) from None


if __name__ == "__main__":
    from pipeline.warm.exit import run_main

    run_main(main)  # exits at once: no teardown of the imported modules (pipeline/warm/exit.py)
