"""A trained run's files as the evaluate and knockout stages read them: its config.json's batch
shapes and device, its JSON records and its model.pt, each checked, with what is wrong reported
against the file and the stage that wrote it."""
from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path

import torch
from pydantic import ValidationError

from pipeline.params import TrainParams

# What evaluate takes from the run's config.json: the batch shapes and device it trained with.
RUN_SETTINGS = ("threads", "batch_tokens", "context", "batch_size", "device")


def read_object(path: Path, keys: tuple[str, ...] = ()) -> dict:
    """A JSON object the train stage wrote, with `keys`; what is wrong is reported with the file."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); rerun the train stage that wrote it") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
    missing = [k for k in keys if k not in value]
    if missing:
        raise ValueError(f"{path}: no key {missing[0]!r}; rerun the train stage that wrote it")
    return value


def run_settings(run_dir: Path) -> TrainParams:
    """train.* of the run's config.json, checked as params.yaml's train section is."""
    path = run_dir / "config.json"
    train = read_object(path, ("train",))["train"]
    if not isinstance(train, dict):
        raise ValueError(f"{path}: train is {train!r}, not an object")
    missing = [k for k in RUN_SETTINGS if k not in train]
    if missing:
        raise ValueError(f"{path}: no key 'train.{missing[0]}'; rerun the train stage that wrote it")
    try:
        return TrainParams.model_validate({k: train[k] for k in RUN_SETTINGS})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ValueError(f"{path}: train.{err['loc'][0]}: {err['msg']} (got {err['input']!r})") from None


def load_model(run_dir: Path, device: torch.device, name: str = "model.pt"):
    from model import ModelConfig, build_model

    path = run_dir / name
    # torch.load reports a cut file as "[Errno 22] Invalid argument" or a bare EOFError; a
    # PyTorch file is a zip archive, whose directory at the end is the first thing a cut loses.
    if path.is_file() and not zipfile.is_zipfile(path):
        raise ValueError(f"{path}: truncated or not a PyTorch file ({path.stat().st_size} bytes); "
                         f"rerun the train stage that wrote it")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model = build_model(ModelConfig(**state["model_config"]))
        model.load_state_dict(state["state_dict"])
    except (RuntimeError, pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as exc:
        reason = f"no key {exc}" if isinstance(exc, KeyError) else \
            (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{path}: unreadable model file ({reason}); rerun the train stage that wrote it") from None
    return model.to(device).eval()
