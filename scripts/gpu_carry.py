"""Fetch, on a machine with a package index, what `bash run.sh gpu` needs on an offline GPU machine.

Run: python scripts/gpu_carry.py [--python-version 3.12] [--have scripts/device_image.txt]
Writes two git-ignored folders to carry along: .whl/, the pinned wheels of every package our
requirements need and the GPU machine's image lacks (--have), for its Python on x86-64 Linux; and
.gpu-cache/, the Tiny Shakespeare text laid out as the download cache is
(docs/gpu.md#set-up-on-an-offline-gpu-machine). The closure is read from this venv's installed
metadata, so run it with the project's .venv.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from the repository: the pipeline's own cache layout
from pipeline.sources.http import cache_path, default_cache_dir  # noqa: E402
from pipeline.sources.tiny_shakespeare import BASE_URL  # noqa: E402

PLATFORMS = ["manylinux1_x86_64", "manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_34_x86_64"]
NEVER_CARRIED = {"torch", "triton"}  # the image's CUDA torch is the point; a carried one would be gigabytes
# Never imported by a GPU part, and the call's working tree (the repository, the wheels, the corpus)
# must stay within 64 MiB: ROUGE (summarization presets only), MLflow's server and model flavours
# (the runs are mirrored through its client and sqlite store, which import none of them).
NOT_NEEDED = frozenset({"rouge-score", "nltk", "docker", "skops", "graphene", "graphql-core", "graphql-relay",
                        "huey", "gunicorn"})
TRAVEL_LIMIT_MIB = 64


def closure(roots: list[str], skip: frozenset[str] = frozenset()) -> set[str]:
    """Canonical names of `roots` and everything they require (this interpreter's markers, no extras),
    leaving out `skip` and what only it requires."""
    seen, todo = set(), [canonicalize_name(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen or name in skip:
            continue
        seen.add(name)
        for line in metadata.requires(name) or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return seen


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            out[canonicalize_name(name)] = version.strip()
    return out


def direct_requirements(path: Path) -> list[str]:
    lines = (re.split(r"[=<>~!\[; ]", line.split("#")[0].strip())[0] for line in path.read_text().splitlines())
    return [name for name in lines if name]


def fetch(pinned: list[str], dest: Path, python_version: str) -> None:
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    platform_args = [a for p in PLATFORMS for a in ("--platform", p)]
    for spec in pinned:
        binary = subprocess.run(pip + ["download", "--no-deps", "--only-binary=:all:", "--implementation", "cp",
                                       "--python-version", python_version, *platform_args, "-d", str(dest), spec],
                                capture_output=True, text=True)
        if binary.returncode:  # published as source only: build it here (these are pure Python)
            subprocess.run(pip + ["wheel", "--no-deps", "-w", str(dest), spec], check=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python-version", default="3.12", help="the GPU machine's python3")
    p.add_argument("--have", type=Path, default=ROOT / "scripts" / "device_image.txt",
                   help="names of the packages the GPU machine's image already has")
    args = p.parse_args()
    have = {canonicalize_name(n) for n in re.split(r"[,\s]+", re.sub(r"#.*", "", args.have.read_text())) if n}
    versions = pins(ROOT / "constraints.txt")
    needed = sorted(closure(direct_requirements(ROOT / "requirements.txt"), NOT_NEEDED) - have - NEVER_CARRIED)
    unpinned = [n for n in needed if n not in versions]
    if unpinned:
        sys.exit(f"gpu_carry: constraints.txt pins no version of {', '.join(unpinned)}")
    wheels = ROOT / ".whl"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir()
    fetch([f"{n}=={versions[n]}" for n in needed], wheels, args.python_version)
    url = f"{BASE_URL}/input.txt"
    src = cache_path(default_cache_dir(), url)
    if not src.exists():
        sys.exit(f"gpu_carry: {src} is missing: run the tiny_shakespeare preset's download once (or put input.txt there)")
    dest = cache_path(ROOT / ".gpu-cache", url)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dest)
    size = sum(f.stat().st_size for f in wheels.iterdir()) / 2 ** 20
    print(f"gpu_carry: {len(needed)} packages, {size:.1f} MiB in .whl/; corpus in .gpu-cache/. "
          f"Device call: carry [\".whl\", \".gpu-cache\"], command `bash run.sh gpu $OUT/gpu.json`")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    travel = (sum((ROOT / f).stat().st_size for f in tracked.decode().split("\0") if f and (ROOT / f).is_file())
              / 2 ** 20 + size + dest.stat().st_size / 2 ** 20)
    if travel > TRAVEL_LIMIT_MIB:
        print(f"gpu_carry: warning: the tracked files, .whl/ and .gpu-cache/ come to {travel:.1f} MiB, over the "
              f"device call's {TRAVEL_LIMIT_MIB} MiB")


if __name__ == "__main__":
    main()
