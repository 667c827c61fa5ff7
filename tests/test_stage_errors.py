"""Bad input at every stage: one line naming the offending key or file, a non-zero exit, no output."""
from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def params(tmp_path: Path, text: str = "") -> str:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return str(path)


def fails(module: str, argv: list[str], pattern: str) -> str:
    with pytest.raises(SystemExit) as info:
        importlib.import_module(f"pipeline.{module}").main(argv)
    message = str(info.value.code)
    assert message.startswith(f"{module}: ") and "\n" not in message, message
    assert pattern in message, message
    return message


def test_download_names_the_unknown_source(tmp_path):
    fails("download", ["--params", params(tmp_path, "data:\n  source: nope\n"), "--out", str(tmp_path / "raw")],
          "nope")
    assert not (tmp_path / "raw").exists()


def test_filter_names_the_missing_split_file(tmp_path):
    (tmp_path / "raw").mkdir()
    fails("filter", ["--params", params(tmp_path), "--raw", str(tmp_path / "raw"), "--out", str(tmp_path / "f"),
                     "--metrics", str(tmp_path / "m.json")], "train.parquet")
    assert not (tmp_path / "f").exists() and not (tmp_path / "m.json").exists()


def test_filter_names_the_bad_params_key(tmp_path):
    fails("filter", ["--params", params(tmp_path, "filter:\n  subsample: 2\n"), "--raw", str(tmp_path),
                     "--out", str(tmp_path / "f"), "--metrics", str(tmp_path / "m.json")], "filter.subsample")


def test_train_bpe_names_the_missing_input(tmp_path):
    fails("train_bpe", ["--params", params(tmp_path), "--data", str(tmp_path / "nowhere"),
                        "--out", str(tmp_path / "tok")], "nowhere")
    assert not (tmp_path / "tok").exists()


def test_encode_names_the_missing_tokenizer(tiny_shards, tmp_path):
    fails("encode", ["--params", params(tmp_path), "--data", str(tiny_shards / "filtered"),
                     "--tokenizer", str(tmp_path / "no-tokenizer"), "--out", str(tmp_path / "shards")],
          "no-tokenizer")
    assert not (tmp_path / "shards").exists()


@pytest.mark.parametrize("variant, text, pattern", [
    ("one_head", "ablations:\n  baseline: {}\n  one_head: {model: {n_head: 1}}\n",
     "ablations.one_head.model.n_head"),  # a typo never silently trains the baseline again
    ("three", "model: {d_model: 32, n_heads: 2}\nablations:\n  baseline: {}\n  three: {model: {n_heads: 3}}\n",
     "ablations.three: ModelConfig.d_model (32)"),  # a combination that makes no sense
])
def test_train_names_the_variant_and_key(tiny_shards, tmp_path, variant, text, pattern):
    fails("train", ["--params", params(tmp_path, text), "--shards", str(tiny_shards / "shards"),
                    "--variant", variant, "--seed", "0", "--out", str(tmp_path / "run"),
                    "--checkpoints", str(tmp_path / "ckpt")], pattern)
    assert not (tmp_path / "run").exists()


def test_evaluate_names_the_missing_run(tiny_shards, tmp_path):
    fails("evaluate", ["--params", params(tmp_path), "--shards", str(tiny_shards / "shards"),
                       "--tokenizer", str(tiny_shards / "tokenizer"), "--run", str(tmp_path / "no-run"),
                       "--out", str(tmp_path / "eval")], "no-run")
    assert not (tmp_path / "eval").exists()


@pytest.mark.multiprocess
def test_the_process_exits_non_zero_with_one_line_on_stderr(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pipeline.filter", "--params", params(tmp_path, "filter: [1]\n"),
                           "--raw", str(tmp_path), "--out", str(tmp_path / "f"), "--metrics", str(tmp_path / "m")],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("filter: ") and "filter" in done.stderr[8:]


# -- a full disk: the same one line from any stage -----------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_train_on_a_full_disk_names_the_checkpoint_and_keeps_the_one_before(tiny_shards, tmp_path, monkeypatch):
    from pipeline.training import checkpoint

    opened = []

    def fill_up(path, mode="r", *args, **kwargs):  # the second checkpoint meets a full disk (ENOSPC)
        opened.append(path)
        return open("/dev/full" if len(opened) == 2 else path, mode, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "open", fill_up, raising=False)
    ckpt = tmp_path / "ckpt"
    message = fails("train", ["--params", params(tmp_path, "train: {budget_steps: 4, checkpoint_every: 1, threads: 1}\n"),
                              "--shards", str(tiny_shards / "shards"), "--variant", "baseline", "--seed", "0",
                              "--out", str(tmp_path / "run"), "--checkpoints", str(ckpt)],
                    f"train: {ckpt / 'step-00000002.pt'}: no space left on the device (needs ")
    assert "free there" in message and "train.keep_checkpoints" in message and "train.checkpoint_every" in message
    assert [p.name for p in ckpt.iterdir()] == ["step-00000001.pt"]  # the one before, whole
    assert checkpoint.load(ckpt / "step-00000001.pt")["loop"]["step"] == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_the_report_on_a_full_disk_names_its_file_and_keeps_the_last_report(tmp_path, monkeypatch):
    import errno

    from tests.fixtures.report.fake_runs import VARIANTS, make_project

    p = make_project(tmp_path, seeds=(0, 1), missing_runs=())
    text = f"seeds: [0, 1]\nablations: {{{', '.join(f'{v}: {{}}' for v in VARIANTS)}}}\n"
    argv = ["--runs", str(p.runs), "--evals", str(p.evals), "--filter-metrics", str(p.filter_metrics),
            "--params", params(tmp_path, text), "--out-dir", str(tmp_path / "reports")]
    monkeypatch.setenv("ABLATION_LAB_TRACKING", "0")
    importlib.import_module("pipeline.report").main(argv)
    before = (tmp_path / "reports" / "report.md").read_text()
    write_text = Path.write_text

    def no_space(self, data, *args, **kwargs):
        if self.name == "details.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_text(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", no_space)
    assert "free there" in fails("report", argv, f"report: {tmp_path / 'reports'}: no space left on the device (")
    assert (tmp_path / "reports" / "report.md").read_text() == before
    assert not list((tmp_path / "reports").glob(".*"))  # no build folder or temporary left


def test_check_params_on_a_full_disk_is_one_line(tmp_path, monkeypatch):
    import errno

    def no_space(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", no_space)
    fails("check_params", ["--params", params(tmp_path), "--out", str(tmp_path / "checked")],
          f"check_params: {tmp_path / 'checked'}: no space left on the device (needs ")
    assert not (tmp_path / "checked").exists()
