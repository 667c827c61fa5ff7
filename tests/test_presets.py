"""Every preset, end to end on tiny fixture data, through the path users take.

`python -m pipeline.preset <name>` writes params.yaml in a scratch project; the preset is then
shrunk the way a conftest fixture shrinks the real config (tiny sizes and budgets, CPU, one seed)
and its source is pointed at fixture files served from 127.0.0.1 (a hub dataset's through
HF_ENDPOINT, as the hub's client is pointed at a mirror); then every stage of dvc.yaml runs
in order, by calling its module's main() with the stage's own command line (matrix expanded).
"""
from __future__ import annotations

import importlib
import json
import re
import shlex
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline import preset
from pipeline.params import ParamsError, load_params
from pipeline.sources import synthetic
from tests.fixtures.sources.server import serve

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "sources"
PRESETS = ROOT / "presets"
SEED_PRESETS = ("cnn_dailymail", "tiny_shakespeare", "tinystories", "iwslt2017", "nanogpt_shakespeare_char",
                "nanogpt_shakespeare_char_gpu", "cnn_dailymail_cpu", "tiny_shakespeare_cpu", "tinystories_cpu", "multi30k_cpu",
                "multi30k_comparisons_cpu", "cnn_dailymail_leak_cpu")
FAST = {"timeout_s": 5.0, "retries": 1}  # a plain URL's download (tiny_shakespeare)
# The task metric each preset exists to measure, as eval.json names it.
TASK_METRICS = {"cnn_dailymail": ("rouge1", "rouge2", "rougeL"), "iwslt2017": ("bleu", "chrf"),
                "tiny_shakespeare": ("bits_per_char", "bits_per_byte"),
                "tinystories": ("bits_per_char", "bits_per_byte"),
                "nanogpt_shakespeare_char": ("bits_per_char", "bits_per_byte")}
TASK_METRICS.update({"nanogpt_shakespeare_char_gpu": TASK_METRICS["nanogpt_shakespeare_char"],"cnn_dailymail_cpu": TASK_METRICS["cnn_dailymail"], "multi30k_cpu": TASK_METRICS["iwslt2017"],
                     "tiny_shakespeare_cpu": TASK_METRICS["tiny_shakespeare"],
                     "tinystories_cpu": TASK_METRICS["tinystories"],
                     "multi30k_comparisons_cpu": TASK_METRICS["iwslt2017"],
                     "cnn_dailymail_leak_cpu": TASK_METRICS["cnn_dailymail"]})


# -- fixture data, served as each source's real files are -----------------------------------
def serve_cnn(root: Path) -> dict:
    """Parquet shards with the hub's columns; synthetic articles stand in for news."""
    files = {}
    for split, (n, seed) in {"train": (160, 1), "validation": (24, 2), "test": (24, 3)}.items():
        frame = synthetic.generate(n, seed)
        (root / "cnn").mkdir(exist_ok=True)
        pq.write_table(pa.table({"id": [f"{split}{i}" for i in range(n)], "article": frame["source"].tolist(),
                                 "highlights": frame["target"].tolist()}), root / "cnn" / f"{split}.parquet")
        files[split] = [f"{split}.parquet"]
    return {"files": files}


def serve_iwslt(root: Path) -> dict:
    """The parquet export's `translation` struct column, with made-up EN/DE sentence pairs."""
    nouns = [("dog", "Hund"), ("cat", "Katze"), ("house", "Haus"), ("tree", "Baum"), ("car", "Auto")]
    adjectives = [("big", "groß"), ("small", "klein"), ("old", "alt"), ("new", "neu")]
    pairs = [{"en": f"The {n} is {a}.", "de": f"Das {m} ist {b}."} for n, m in nouns for a, b in adjectives]
    lines = (FIXTURES / "multi30k_train.jsonl").read_text().splitlines()
    pairs += [json.loads(line) for line in lines if line.strip()]
    files = {}
    for split, rows in {"train": pairs * 4, "validation": pairs[:8], "test": pairs[8:16]}.items():
        (root / "iwslt" / split).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"translation": rows}), root / "iwslt" / split / "0000.parquet")
        files[split] = f"{split}/0000.parquet"
    return {"files": files}


def serve_tiny_shakespeare(root: Path) -> dict:
    (root / "ts").mkdir()
    text = (FIXTURES / "tiny_shakespeare_input.txt").read_text()
    (root / "ts" / "input.txt").write_text("\n\n".join([text.strip()] * 6) + "\n")  # 120 speeches
    return {}


def serve_tinystories(root: Path) -> dict:
    (root / "tiny").mkdir()
    stories = [f"Once upon a time, a little fox named Tom found {i} red berries. He shared them "
               f"with his friend, and they were happy." for i in range(80)]
    (root / "tiny" / "train.txt").write_text("".join(f"{s}\n<|endoftext|>\n" for s in stories))
    valid = (FIXTURES / "tinystories_valid.txt").read_text()
    (root / "tiny" / "valid.txt").write_text(valid + "".join(f"\n<|endoftext|>\n{s}" for s in stories[:8]))
    return {"files": {"train": "train.txt", "validation": "valid.txt"}}


HUB = {"cnn_dailymail", "iwslt2017", "tinystories"}  # served as hub dataset fixtures/<folder>
SERVE = {"cnn_dailymail": ("cnn", serve_cnn), "iwslt2017": ("iwslt", serve_iwslt),
         "tiny_shakespeare": ("ts", serve_tiny_shakespeare), "tinystories": ("tiny", serve_tinystories),
         "nanogpt_shakespeare_char": ("ts", serve_tiny_shakespeare),
         "nanogpt_shakespeare_char_gpu": ("ts", serve_tiny_shakespeare),
         "tiny_shakespeare_cpu": ("ts", serve_tiny_shakespeare)}


# -- fixture files where the `local` presets read theirs (data/local/README.md's layout) ------
def local_cnn(local: Path) -> None:
    frame = synthetic.generate(120, 1)
    (local / "cnn_dailymail").mkdir(parents=True)
    frame.rename(columns={"source": "article", "target": "highlights"}).to_csv(
        local / "cnn_dailymail" / "train300.csv", index=False)


def local_tinystories(local: Path) -> None:
    (local / "tinystories").mkdir(parents=True)
    text = (FIXTURES / "tinystories_valid.txt").read_text().replace("<|endoftext|>", "")
    (local / "tinystories" / "valid-head.txt").write_text("\n\n".join([text.strip()] * 20) + "\n")


def local_multi30k(local: Path) -> None:
    import gzip
    (local / "multi30k").mkdir(parents=True)
    pairs = [json.loads(line) for line in (FIXTURES / "multi30k_train.jsonl").read_text().splitlines() if line]
    for split, rows in {"train": pairs * 8, "val": pairs, "test_2016_flickr": pairs[::-1]}.items():
        for lang in ("en", "de"):
            with gzip.open(local / "multi30k" / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("".join(row[lang] + "\n" for row in rows))


LOCAL = {"cnn_dailymail_cpu": local_cnn, "tinystories_cpu": local_tinystories, "multi30k_cpu": local_multi30k,
         "multi30k_comparisons_cpu": local_multi30k, "cnn_dailymail_leak_cpu": local_cnn}


# -- the conftest-style shrink ----------------------------------------------------------------
def deep_update(base: dict, overrides: dict) -> dict:
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            deep_update(base[key], value)
        else:
            base[key] = value
    return base


def shrink(params: dict, source_options: dict, cache: Path) -> dict:
    """The preset at toy scale: same sections, switches and ablations; tiny sizes and budgets."""
    model = params["model"]
    tiny = {
        "data": {"cache_dir": str(cache), params["data"]["source"]: source_options},
        "model": {"d_model": 32, "d_ff": 64, "n_heads": min(model["n_heads"], 4),
                  "n_decoder_layers": min(model["n_decoder_layers"], 2), "dropout": 0.0},
        "train": {"device": "cpu", "threads": 1, "budget_steps": 3, "batch_tokens": 1024, "compile": False,
                  "batch_size": 4, "context": 48, "warmup_steps": 1, "eval_every": 2,
                  "eval_examples": 8, "log_every": 1, "checkpoint_every": 100},
        "evaluate": {"max_examples": 4, "max_new_tokens": 12, "n_samples": 2, "batch_size": 4},
        # Knock-outs stay as the preset has them (knockout.seeds follows seeds): on for the one seed kept.
        "seeds": params["seeds"][:1],
    }
    if params.get("decide", {}).get("looks"):  # seeds until decided needs its first look's seeds: off at one
        tiny["decide"] = {"looks": [], "runs": {}}
    if params["train_bpe"]["model_type"] == "bpe":
        tiny["train_bpe"] = {"vocab_size": 150}
    deep_update(params, tiny)
    params["data"][params["data"]["source"]].pop("sha256", None)  # fixtures are not the pinned files
    if params["train"].get("budget_flops"):  # a FLOP budget stays one, at a few steps' worth
        del params["train"]["budget_steps"]
        params["train"]["budget_flops"] = 2e8
    for overrides in [*params["ablations"].values(), *params["scales"].values()]:  # resizing, at toy size
        if "d_model" in (overrides or {}).get("model", {}):
            overrides["model"].update(d_model=16 if overrides["model"]["d_model"] <= 64 else 48,
                                      d_ff=32 if overrides["model"]["d_model"] <= 64 else 96)
    return params


# -- dvc.yaml, run in-process ---------------------------------------------------------------
def stage_commands(params: dict) -> list[tuple[str, str]]:
    """(stage, command line) in dvc.yaml order, the matrices expanded as DVC does (a mapping
    gives its keys; an empty list, no stage)."""
    def lookup(ref: str):  # "knockout.seeds" -> params["knockout"]["seeds"]
        value = params
        for part in ref.split("."):
            value = value[part]
        return value

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    out = []
    for name, stage in stages.items():
        cmds = [stage["cmd"]]
        for key, ref in (stage.get("matrix") or {}).items():
            values = lookup(ref.removeprefix("${").removesuffix("}"))
            cmds = [cmd.replace(f"${{item.{key}}}", str(v)) for cmd in cmds for v in values]
        # Other ${section.key} references (e.g. ${report.baseline}) read params like DVC does.
        cmds = [re.sub(r"\$\{([\w.]+)\}", lambda m: str(lookup(m[1])), cmd) for cmd in cmds]
        out += [(name, cmd) for cmd in cmds]
    return out


def run_stage(cmd: str) -> None:
    argv = shlex.split(cmd)
    assert argv[:3] == ["python", "-m", "pipeline"], cmd
    importlib.import_module(f"pipeline.{argv[3]}").main(argv[4:])


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory) -> str:
    # One store for the module: the report stage still links its runs, and creating a store costs
    # seconds.
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture
def project(tmp_path, monkeypatch, mlflow_uri):
    """A scratch project directory (the stages read params.yaml and write data/ relative to it)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ABLATION_LAB_TRACKING", "0")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("name", SEED_PRESETS)
def test_preset_runs_every_stage_and_reports_its_task_metric(name, project, capsys, monkeypatch):
    preset.main([name, "--presets-dir", str(PRESETS)])
    assert "changed sections:" in capsys.readouterr().out
    params = yaml.safe_load(Path("params.yaml").read_text())
    assert params == yaml.safe_load((PRESETS / f"{name}.yaml").read_text())

    www = project / "www"
    www.mkdir()
    if name in LOCAL:  # the files a user copies to data/local/, at the preset's own paths
        LOCAL[name](project / "data" / "local")
        Path("params.yaml").write_text(yaml.safe_dump(shrink(params, {}, project / "cache"), sort_keys=False))
        for _, cmd in stage_commands(params):
            run_stage(cmd)
    else:
        folder, make = SERVE[name]
        with serve(www) as hub:
            if name in HUB:  # the server plays the hub's endpoint; the client caches in the project
                monkeypatch.setenv("HF_ENDPOINT", hub.url().rstrip("/"))
                monkeypatch.setenv("HF_HOME", str(project / "hf_home"))
                (www / "fixtures").mkdir()
                options = {"repo": f"fixtures/{folder}", "subfolder": "", **make(www / "fixtures")}
            else:
                options = {"base_url": hub.url(folder), **FAST, **make(www)}
            Path("params.yaml").write_text(yaml.safe_dump(shrink(params, options, project / "cache"),
                                                          sort_keys=False))
            for _, cmd in stage_commands(params):
                run_stage(cmd)

    task = {"cnn_dailymail": "summarization", "iwslt2017": "translation", "cnn_dailymail_cpu": "summarization",
            "cnn_dailymail_leak_cpu": "summarization", "multi30k_cpu": "translation", "multi30k_comparisons_cpu": "translation"}.get(name, "language_modeling")
    for variant in params["ablations"]:
        run_dir = f"{variant}-{params['seeds'][0]}"
        ev = json.loads(Path("data/eval", run_dir, "eval.json").read_text())
        assert ev["task"] == task and ev["variant"] == variant
        for metric in TASK_METRICS[name]:
            assert isinstance(ev[metric], float) and ev[metric] >= 0, (variant, metric, ev)
        samples = json.loads(Path("data/eval", run_dir, "samples.json").read_text())
        assert samples and all(s["source"] and s["reference"] for s in samples), samples
        maps = json.loads(Path("data/eval", run_dir, "attention.json").read_text())["maps"]
        assert "decoder.self" in maps
    if task == "language_modeling":
        ev = json.loads(Path("data/eval", f"baseline-{params['seeds'][0]}", "eval.json").read_text())
        assert ev["bits_per_byte"] <= ev["bits_per_char"] + 1e-9  # a character is >= 1 byte
    # dvc.yaml's last stage: each variant's task metrics, as the eval files hold them, in the report.
    summary = json.loads(Path("reports/details.json").read_text())["variants"]
    report = Path("reports/report.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| variant | val_loss"))
    for variant in params["ablations"]:
        ev = json.loads(Path("data/eval", f"{variant}-{params['seeds'][0]}", "eval.json").read_text())
        row = next(line for line in report.splitlines() if line.startswith(f"| {variant} | ")
                   and "n=1: no interval" in line)  # the results table: one seed, so no interval
        for metric in TASK_METRICS[name]:
            assert summary[variant][metric]["mean"] == pytest.approx(ev[metric]), (variant, metric)
            assert f" {metric} " in header
        assert len(row.split("|")) == len(header.split("|"))
    # The sweep stages ran too: every variant at each further rate and size, in the report.
    assert ("## Fair learning rates" in report) == bool(params["lr_sweep"])
    assert ("## Across scales" in report) == bool(params["scales"])
    if params["train"].get("budget_flops"):
        assert "FLOP-matched" in report


# -- the command itself -------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(p.stem for p in PRESETS.glob("*.yaml")))
def test_every_preset_is_a_valid_params_file(name):
    params = preset.validate(PRESETS / f"{name}.yaml")
    assert "baseline" in params.ablations and params.ablations["baseline"] == {}
    assert preset.summary(PRESETS / f"{name}.yaml")  # what --list shows


def test_the_gpu_recipe_preset_is_nanogpts_train_shakespeare_char_and_plans_on_an_h100(capsys):
    """nanoGPT's config/train_shakespeare_char.py, on the CPU recipe's data, tokenizer and evaluation."""
    from pipeline import plan

    gpu = yaml.safe_load((PRESETS / "nanogpt_shakespeare_char_gpu.yaml").read_text())
    cpu = yaml.safe_load((PRESETS / "nanogpt_shakespeare_char.yaml").read_text())
    for section in ("data", "filter", "train_bpe", "encode"):
        assert gpu[section] == cpu[section], section
    m, t = gpu["model"], gpu["train"]
    assert (m["n_decoder_layers"], m["n_heads"], m["d_model"], m["d_ff"], m["dropout"], m["max_len"]) == \
        (6, 6, 384, 1536, 0.2, 256)
    assert (m["bias"], m["tie_output"], m["norm_position"], m["ffn"]) == (False, True, "pre", "gelu")
    assert (t["budget_steps"], t["batch_size"], t["context"], t["lr"], t["betas"], t["weight_decay"]) == \
        (5000, 64, 256, 1e-3, [0.9, 0.99], 0.1)
    assert (t["warmup_steps"], t["schedule"], t["min_lr_ratio"], t["precision"], t["compile"]) == \
        (100, "cosine", 0.1, "bf16", True)
    assert t["budget_tokens"] == 5000 * 64 * 256
    # nanoGPT's estimate, as its train.py takes it (tests/test_nanogpt_recipe.py checks every setting)
    assert (t["eval_every"], t["eval_examples"], t["eval_windows"], t["keep"]) == (250, 12800, "random", "best")
    assert gpu["evaluate"]["prompt_tokens"] + gpu["evaluate"]["max_new_tokens"] <= m["max_len"]
    assert list(gpu["ablations"]) == ["baseline"] and len(gpu["seeds"]) == 1 and gpu["knockout"]["seeds"] == []
    assert gpu["report"]["reference"]["value"] == 1.4697
    plan.main(["--params", str(PRESETS / "nanogpt_shakespeare_char_gpu.yaml"), "--device", "h100", "--json"])
    planned = json.loads(capsys.readouterr().out)
    (row,) = planned["rows"]
    assert (row["variant"], row["steps_per_run"], row["tokens_per_run"], row["fits"]) == ("baseline", 5000, 81920000, True)
    assert 10e6 < row["params"] < 11e6  # nanoGPT prints 10.65M (it leaves the position table out)
    assert 0 < planned["total"]["seconds"] < 180  # the planner expects it inside nanoGPT's 3 minutes


def test_list_names_every_preset(capsys):
    preset.main(["--list", "--presets-dir", str(PRESETS)])
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()] == sorted(p.stem for p in PRESETS.glob("*.yaml"))


def test_apply_writes_params_and_reports_changed_sections(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text((PRESETS / "cnn_dailymail.yaml").read_text())
    changed = preset.apply("tiny_shakespeare", params, PRESETS)
    assert params.read_text() == (PRESETS / "tiny_shakespeare.yaml").read_text()
    before, after = (yaml.safe_load((PRESETS / f"{n}.yaml").read_text())
                     for n in ("cnn_dailymail", "tiny_shakespeare"))
    assert changed == [k for k in after if before.get(k) != after[k]]  # params.yaml order, once each
    assert "knockout" not in changed and {"data", "model", "train", "ablations"} <= set(changed)
    assert load_params(params).data.source == "tiny_shakespeare"
    assert preset.apply("tiny_shakespeare", params, PRESETS) == []


@pytest.mark.parametrize("edit, message", [
    ({"model": {"n_heads": 3}}, r"ablations\.baseline: ModelConfig\.d_model \(64\) must be divisible"),
    ({"ablations": {"bad": {"model": {"n_head": 1}}}}, r"ablations\.bad\.model\.n_head: unknown key"),
    ({"model": {"arch": "encoder_decoder"}}, r"encoder_decoder needs a source text"),
    ({"train": {"context": 4096}}, r"train\.context 4096 exceeds model\.max_len"),
    ({"evaluate": {"decode": "beam"}}, r"evaluate\.decode: beam is not supported"),
    ({"train": {"lr": -1}}, r"train\.lr"),
    ({"data": {"tiny_shakespeare": {"doc_char": 0}}}, r"data\.tiny_shakespeare\.doc_char: unknown option"),
])
def test_a_bad_preset_is_refused_and_params_yaml_left_alone(tmp_path, edit, message):
    presets = tmp_path / "presets"
    presets.mkdir()
    bad = deep_update(yaml.safe_load((PRESETS / "tiny_shakespeare.yaml").read_text()),
                      {"model": {"d_model": 64}})
    (presets / "bad.yaml").write_text(yaml.safe_dump(deep_update(bad, edit)))
    params = tmp_path / "params.yaml"
    params.write_text("untouched")
    with pytest.raises(ParamsError, match=message):
        preset.apply("bad", params, presets)
    assert params.read_text() == "untouched"
    with pytest.raises(SystemExit, match=r"^preset: .*bad\.yaml") as info:
        preset.main(["bad", "--params", str(params), "--presets-dir", str(presets)])
    assert "\n" not in str(info.value)


def test_unknown_preset_names_the_available_ones(tmp_path):
    with pytest.raises(SystemExit, match=r"no preset 'nope' in .*\(available: .*tinystories"):
        preset.main(["nope", "--params", str(tmp_path / "params.yaml"), "--presets-dir", str(PRESETS)])


def test_a_preset_without_a_key_the_dvc_matrices_read_is_refused(tmp_path):
    text = (PRESETS / "synthetic.yaml").read_text()
    assert "\nlr_sweep: []\n" in text
    (tmp_path / "x.yaml").write_text(text.replace("\nlr_sweep: []\n", "\n"))
    with pytest.raises(ParamsError, match=r"x\.yaml: lr_sweep: missing; dvc\.yaml lays out its stages from it"):
        preset.validate(tmp_path / "x.yaml")
