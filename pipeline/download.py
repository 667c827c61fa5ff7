"""Stage `download`: produce the raw splits of the configured source in `data/raw/`.

    python -m pipeline.download --out data/raw

`data.source: synthetic` (the default) generates the embedded dataset, with no network. Real
sources (see pipeline/sources) download into a cache first; the output directory is written as a
whole or not at all.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from pipeline.atomic import atomic_path, atomic_write_json
from pipeline.fetch import default_cache_dir
from pipeline.params import ParamsError, load_params, stage_error
from pipeline.sources import synthetic


def write_synthetic(out_dir: Path, n_examples: int, seed: int) -> None:
    frame = synthetic.generate(n_examples, seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out_dir / "train.parquet", index=False)
    atomic_write_json(out_dir / "meta.json", {"source": "synthetic", "task": "summarization",
                                              "n_examples": n_examples, "seed": seed})


def download(source: str, options: dict, cache_dir: Path, out: Path) -> None:
    """Write the raw splits of `source` to `out` atomically (a directory swap)."""
    with atomic_path(out) as tmp:
        if source == "synthetic":
            write_synthetic(tmp, options["n_examples"], options["seed"])
            return
        from pipeline.sources import get_source  # real sources: imported only when used

        tmp.mkdir(parents=True)
        get_source(source).fetch(options, cache_dir, tmp)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # "downloading ... / using cached ..."
    try:
        params = load_params(args.params)
        data = params.data
        options = data.synthetic.model_dump() if data.source == "synthetic" else dict(data.model_extra or {}).get(data.source, {})
        cache = Path(data.cache_dir).expanduser() if data.cache_dir else default_cache_dir()
        download(data.source, options, cache, Path(args.out))
    except (ParamsError, ValueError, OSError) as exc:
        raise stage_error("download", exc) from None


if __name__ == "__main__":
    main()
