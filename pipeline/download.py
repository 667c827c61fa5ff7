"""Stage `download`: produce the raw splits of the configured source in `data/raw/`.

    python -m pipeline.download --out data/raw

`data.source: synthetic` (the default) generates the embedded dataset, with no network. Real
sources (see pipeline/sources) download into a cache first; the output directory is written as a
whole or not at all.

`data.source: local` files must live under `--local-root` (data/local): dvc.yaml lists that folder
as a dependency of this stage, so editing a file there reruns the stage and everything after it.
A file elsewhere would be invisible to DVC (the study would silently keep the old data), so it is
an error. Links are fine: the path is checked as written, not where a link points.
"""
from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from pipeline.atomic import atomic_path, atomic_write_json
from pipeline.params import ParamsError, load_params, stage_error
from pipeline.sources import synthetic
from pipeline.sources.http import default_cache_dir


def write_synthetic(out_dir: Path, n_examples: int, seed: int) -> None:
    frame = synthetic.generate(n_examples, seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out_dir / "train.parquet", index=False)
    atomic_write_json(out_dir / "meta.json", {"source": "synthetic", "task": "summarization",
                                              "n_examples": n_examples, "seed": seed})


def check_local_paths(paths: object, root: Path, key: str = "data.local.paths") -> None:
    """Every path named under `data.local.paths` (strings, lists, {source, target} maps) lies in `root`."""
    if isinstance(paths, dict):
        for name, value in paths.items():
            check_local_paths(value, root, f"{key}.{name}")
    elif isinstance(paths, list):
        for value in paths:
            check_local_paths(value, root, key)
    elif isinstance(paths, str):
        inside = os.path.abspath(os.path.expanduser(paths))
        if os.path.commonpath([inside, os.path.abspath(root)]) != os.path.abspath(root):
            raise ValueError(f"{key}: {paths} is outside {root}/, where DVC tracks local data; move "
                             f"or link it there (an edit elsewhere would not rerun the pipeline)")


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
    parser.add_argument("--local-root", default="data/local",
                        help="the folder dvc.yaml tracks for data.source: local")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # "downloading ... / using cached ..."
    try:
        params = load_params(args.params)
        data = params.data
        options = data.synthetic.model_dump() if data.source == "synthetic" else dict(data.model_extra or {}).get(data.source, {})
        if data.source == "local" and isinstance(options, dict):
            check_local_paths(options.get("paths"), Path(args.local_root))
        cache = Path(data.cache_dir).expanduser() if data.cache_dir else default_cache_dir()
        download(data.source, options, cache, Path(args.out))
    except (ParamsError, ValueError, OSError) as exc:
        raise stage_error("download", exc) from None


if __name__ == "__main__":
    main()
