"""The report stage renders from fake run files: numbers, missing values, HTML, atomicity, errors."""
import base64
import json
import math
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from pipeline.report import _read_params, main, render_report
from pipeline.reporting.figures import _attention_panel
from pipeline.reporting.inputs import ReportInputError, load_run
from pipeline.reporting.stats import detectable_effect, seeds_needed
from tests.fixtures.report.fake_runs import make_project

REPO = Path(__file__).resolve().parents[1]


def render(p, out: Path | None = None, budget=None) -> Path:
    out = out or p.root / "reports"
    render_report(p.runs, p.evals, p.filter_metrics, p.variants, p.seeds, "baseline",
                  budget if budget is not None else {"budget_tokens": 200_000}, out)
    return out


def md_table(md: str, first_header: str, second_header: str) -> list[dict[str, str]]:
    """Rows (header -> cell) of the Markdown table whose header starts with the two given names."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} | {second_header}"))
    headers = [h.strip() for h in lines[start].strip("|").split(" | ")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(headers, (c.strip() for c in line.strip("|").split(" | ")))))
    return rows


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    p = make_project(tmp_path_factory.mktemp("report"))
    out = render(p)
    return p, out, (out / "report.md").read_text(encoding="utf-8")


def test_metric_table_shows_mean_and_t_interval_computed_from_files(rendered):
    p, _, md = rendered
    rows = {r["variant"]: r for r in md_table(md, "variant", "val_loss ↓")}
    x = np.array([p.eval_values[("baseline", s)]["val_loss"] for s in p.seeds])
    half = sps.t.ppf(0.975, len(x) - 1) * sps.sem(x)
    assert rows["baseline"]["val_loss ↓"] == f"{x.mean():.4g} ± {half:.2g} (n=3)"
    assert list(rows) == p.variants
    assert rows["single_head"]["val_loss ↓"].endswith("(n=2)")  # seed 2 is missing, not zero


def test_delta_table_has_paired_p_value_and_verdict(rendered):
    p, _, md = rendered
    rows = {(r["variant"], r["metric"]): r for r in md_table(md, "variant", "metric")}
    b = [p.eval_values[("baseline", s)]["val_loss"] for s in p.seeds]
    v = [p.eval_values[("no_ffn", s)]["val_loss"] for s in p.seeds]
    pval = sps.ttest_rel(v, b).pvalue
    row = rows[("no_ffn", "val_loss ↓")]
    assert row["p (paired t)"] == ("<0.001" if pval < 0.001 else f"{pval:.3f}")
    assert row["verdict"] == ("worse" if pval < 0.05 else "no significant difference at 5%")
    assert row["paired seeds"] == "3"
    assert rows[("single_head", "val_loss ↓")]["paired seeds"] == "2"
    assert ("baseline", "val_loss ↓") not in rows


def test_missing_metric_and_missing_run_are_shown_as_missing_not_zero(rendered):
    _, _, md = rendered
    metrics = {r["variant"]: r for r in md_table(md, "variant", "val_loss ↓")}
    assert metrics["no_rouge"]["rougeL ↑"] == "—"
    assert metrics["no_rouge"]["rouge1 ↑"] != "—"
    deltas = {(r["variant"], r["metric"]): r for r in md_table(md, "variant", "metric")}
    assert deltas[("no_rouge", "rougeL ↑")]["Δ mean"] == "—"
    assert deltas[("no_rouge", "rougeL ↑")]["verdict"] == "no paired seeds"
    runs = {r["variant"]: r for r in md_table(md, "variant", "parameters")}
    assert runs["single_head"]["runs found"] == "2/3" and "seed 2: run missing" in runs["single_head"]["missing"]
    per_run = {(r["variant"], r["seed"]): r for r in md_table(md, "variant", "seed")}
    missing = per_run[("single_head", "2")]
    assert set(missing.values()) - {"single_head", "2"} == {"—"}
    assert per_run[("no_rouge", "0")]["rougeL"] == "—"


def test_report_states_budget_parameters_cost_and_data(rendered):
    p, _, md = rendered
    assert "budget_tokens = 200,000" in md
    runs = {r["variant"]: r for r in md_table(md, "variant", "parameters")}
    assert runs["no_ffn"]["parameters"] == f"{p.train_values[('no_ffn', 0)]['params_total']:,}"
    comps = {r["variant"]: r for r in md_table(md, "variant", "embeddings")}
    assert comps["no_ffn"]["ffn"] == f"{p.train_values[('no_ffn', 0)]['params_by_component']['ffn']:,}"
    cost = {r["variant"]: r for r in md_table(md, "variant", "tokens trained")}
    tokens = [p.train_values[("baseline", s)]["tokens_trained"] for s in p.seeds]
    assert cost["baseline"]["tokens trained"] == f"{min(tokens):,}–{max(tokens):,}"  # counts: range, not mean
    filt = json.loads(p.filter_metrics.read_text())
    splits = {r["split"]: r for r in md_table(md, "split", "raw")}
    assert splits["train"]["kept"] == f"{filt['splits']['train']['kept']:,}"
    assert splits["train"]["dropped by length"] == "150" and splits["train"]["dropped %"] == "4.7%"
    lengths = [r for r in md_table(md, "sequence", "examples") if r["sequence"] == "source"]
    assert [(r["examples"], r["max"]) for r in lengths] == [("before filtering", "240"), ("kept", "128")]
    assert "no_ffn prediction 0" in md and "\\|" in md  # sample table, pipes escaped


def test_html_is_self_contained_and_embeds_every_figure(rendered):
    _, out, md = rendered

    class Collect(HTMLParser):
        def __init__(self):
            super().__init__()
            self.imgs, self.external = [], []

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if tag == "img":
                self.imgs.append(attrs.get("src", ""))
            if tag in ("script", "link") or any(
                    (attrs.get(k) or "").startswith(("http:", "https:", "//")) for k in ("src", "href")):
                self.external.append(tag)

    parser = Collect()
    parser.feed((out / "report.html").read_text(encoding="utf-8"))
    parser.close()
    pngs = sorted((out / "figures").glob("*.png"))
    assert [p.name for p in pngs] == ["attention.png", "curves.png", "deltas.png", "params_vs_loss.png"]
    prefix = "data:image/png;base64,"
    assert len(parser.imgs) == len(pngs) and all(src.startswith(prefix) for src in parser.imgs)
    embedded = {base64.b64decode(src[len(prefix):]) for src in parser.imgs}
    assert embedded == {p.read_bytes() for p in pngs}
    assert parser.external == []
    assert all(f"(figures/{p.name})" in md for p in pngs)


def test_one_seed_report_gives_no_interval_and_no_test(tmp_path):
    p = make_project(tmp_path, seeds=(0,), missing_runs=())
    md = (render(p) / "report.md").read_text(encoding="utf-8")
    metrics = md_table(md, "variant", "val_loss ↓")
    assert all(r["val_loss ↓"].endswith("(n=1: no interval)") for r in metrics)
    assert not any("±" in cell for r in metrics for cell in r.values())
    deltas = md_table(md, "variant", "metric")
    tested = [r for r in deltas if not r["verdict"].startswith("derived from")]
    assert {r["verdict"] for r in tested} == {"n=1: no test", "no paired seeds"}
    assert {r["detectable \\|Δ\\| (80% power)"] for r in deltas} == {"—"}
    assert {r["p (paired t)"] for r in deltas} == {"—"}
    assert len(list((tmp_path / "reports/figures").glob("*.png"))) == 4


def test_bad_json_names_the_file_and_keeps_the_previous_report(tmp_path):
    p = make_project(tmp_path)
    out = render(p)
    before = (out / "report.md").read_text(encoding="utf-8")
    bad = p.evals / "no_ffn-1" / "eval.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ReportInputError, match="no_ffn-1/eval.json"):
        render(p, out)
    assert (out / "report.md").read_text(encoding="utf-8") == before
    assert [c.name for c in tmp_path.iterdir() if c.name.startswith(".reports")] == []


@pytest.mark.multiprocess
def test_cli_exits_1_with_one_line_on_bad_input(tmp_path):
    p = make_project(tmp_path, seeds=(0,), missing_runs=())
    params = tmp_path / "params.yaml"
    params.write_text("seeds: [0]\nablations: [baseline]\nreport: {baseline: baseline}\n", encoding="utf-8")
    args = ["--runs", str(p.runs), "--evals", str(p.evals), "--filter-metrics", str(p.filter_metrics),
            "--params", str(params), "--out-dir", str(tmp_path / "reports")]
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert str(exc.value.code).startswith(f"report: {params}: ablations: ") and "\n" not in str(exc.value.code)
    params.write_text("seeds: [0]\nablations: {baseline: {}}\nreport: {baseline: base}\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="report.baseline: 'base' is not a variant in ablations"):
        main(args)
    params.write_text("seeds: [0]\nablations: {baseline: {}, no_ffn: {}}\n", encoding="utf-8")
    (p.runs / "baseline-0" / "train_curve.csv").write_text("step,tokens\n1,2\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "pipeline.report", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"report: {p.runs / 'baseline-0' / 'train_curve.csv'}: missing column(s) train_loss"]
    assert not (tmp_path / "reports").exists()


def test_attention_prefers_cross_then_decoder_self(tmp_path):
    p = make_project(tmp_path, seeds=(0,), missing_runs=())
    run = load_run(p.runs, p.evals, "baseline", 0)
    title, matrix, keys, queries = _attention_panel(run)
    assert title.endswith("decoder.cross") and matrix.shape == (len(queries), len(keys))
    del run.attention["maps"]["decoder.cross"]
    title, matrix, keys, queries = _attention_panel(run)
    assert title.endswith("decoder.self") and keys == queries


def test_unigram_plateau_table_reads_the_plateau_from_eval_json(tmp_path):
    p = make_project(tmp_path)
    for path in p.evals.glob("*/eval.json"):
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "unigram_val_loss": 5.0}))
    out = render(p)
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "Unigram plateau: val_loss 5 nats/token" in md
    section = md[md.index("Unigram plateau"):]
    rows = {r["variant"]: r for r in md_table(section, "variant", "val_loss | below")}
    mean = np.mean([p.eval_values[("baseline", s)]["val_loss"] for s in p.seeds])
    assert rows["baseline"]["below the plateau (nats/token)"] == f"{5.0 - mean:.3g}"
    assert rows["baseline"]["below (% of plateau)"] == f"{100 * (5.0 - mean) / 5.0:.0f}%"
    assert json.loads((out / "details.json").read_text())["unigram_val_loss"] == 5.0


def test_no_plateau_section_without_the_plateau(rendered):
    _, out, md = rendered
    assert "Unigram plateau" not in md and "unigram_val_loss" not in json.loads((out / "details.json").read_text())


def delta_rows(md: str) -> dict[tuple[str, str], dict[str, str]]:
    """(variant, metric) -> row of the Δ table, with Markdown's escaped pipes (|Δ|) read back."""
    def plain(text: str) -> str:
        return text.replace("\\|", "|")
    return {(r["variant"], r["metric"].split()[0]): {plain(k): plain(c) for k, c in r.items()}
            for r in md_table(md, "variant", "metric")}


def paired(p, variant: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(variant, baseline) values of `metric` on the seeds both have, from the fake files."""
    seeds = [s for s in p.seeds if metric in p.eval_values.get((variant, s), {})
             and metric in p.eval_values.get(("baseline", s), {})]
    return (np.array([p.eval_values[(variant, s)][metric] for s in seeds]),
            np.array([p.eval_values[("baseline", s)][metric] for s in seeds]))


def test_derived_metrics_are_shown_without_a_verdict_of_their_own(rendered):
    p, out, md = rendered
    rows = delta_rows(md)
    for metric, source in (("val_ppl", "val_loss"), ("test_ppl", "test_loss")):
        row = rows[("no_ffn", metric)]
        assert row["verdict"] == f"derived from {source}: no test of its own"
        assert row["p (paired t)"] == row["p (Holm)"] == row["detectable |Δ| (80% power)"] == "—"
        v, b = paired(p, "no_ffn", metric)
        assert row["Δ mean"] == f"{np.mean(v - b):.3g}"  # its Δ is still shown
    summary = json.loads((out / "details.json").read_text())
    entry = summary["variants"]["no_ffn"]["val_ppl"]
    assert (entry["role"], entry["derived_from"], entry["p"]) == ("derived", "val_loss", None)
    assert "val_ppl from val_loss, test_ppl from test_loss" in md


def holm_by_hand(pvals: list[float]) -> list[float]:
    """Holm step-down written out directly: adjusted p_(i) = max over j <= i of (m - j) p_(j)."""
    order = np.argsort(pvals)
    m = len(pvals)
    adjusted = np.empty(m)
    for rank, i in enumerate(order):
        adjusted[i] = min(1.0, max((m - j) * pvals[order[j]] for j in range(rank + 1)))
    return list(adjusted)


def test_primary_metric_is_uncorrected_and_the_rest_are_holm_corrected_together(rendered):
    p, out, md = rendered
    rows = delta_rows(md)
    family = [(v, m) for v in ("no_ffn", "single_head", "no_rouge") for m in ("test_loss", "rouge1", "rouge2", "rougeL")
              if len(paired(p, v, m)[0]) >= 2]
    raw = [sps.ttest_rel(*paired(p, v, m)).pvalue for v, m in family]
    for (v, m), adj in zip(family, holm_by_hand(raw)):
        row = rows[(v, m)]
        assert row["p (Holm)"] == ("<0.001" if adj < 0.001 else f"{adj:.3f}")
        assert row["verdict"] in ("better", "worse") if adj < 0.05 else row["verdict"].startswith(
            "no significant difference at 5% after Holm")
    assert f"one Holm family of {len(family)} tests" in md
    primary = rows[("no_rouge", "val_loss")]
    pval = sps.ttest_rel(*paired(p, "no_rouge", "val_loss")).pvalue
    assert primary["p (Holm)"] == "primary: uncorrected" and primary["p (paired t)"] == f"{pval:.3f}"
    assert primary["verdict"].startswith("no significant difference at 5%:") and pval >= 0.05
    summary = json.loads((out / "details.json").read_text())
    assert (summary["primary_metric"], summary["holm_family_size"]) == ("val_loss", len(family))
    assert summary["variants"]["no_ffn"]["rouge1"]["role"] == "secondary"


def test_report_primary_metric_moves_the_uncorrected_test(tmp_path):
    p = make_project(tmp_path)
    render_report(p.runs, p.evals, p.filter_metrics, p.variants, p.seeds, "baseline", {}, tmp_path / "reports",
                  primary_metric="rouge1")
    rows = delta_rows((tmp_path / "reports" / "report.md").read_text(encoding="utf-8"))
    assert rows[("no_ffn", "rouge1")]["p (Holm)"] == "primary: uncorrected"
    assert rows[("no_ffn", "val_loss")]["p (Holm)"] not in ("primary: uncorrected", "—")


def test_primary_metric_must_be_a_reported_metric_with_its_own_test(tmp_path):
    params = tmp_path / "params.yaml"
    for name, message in (("val_ppl", "derived from 'val_loss'"), ("accuracy", "not a reported metric")):
        params.write_text(f"seeds: [0]\nablations: {{baseline: {{}}}}\nreport: {{primary_metric: {name}}}\n")
        with pytest.raises(ReportInputError, match=message):
            _read_params(params)


def test_power_columns_follow_from_the_sd_of_the_paired_differences(rendered):
    p, _, md = rendered
    rows = delta_rows(md)
    v, b = paired(p, "no_rouge", "val_loss")
    sd = np.std(v - b, ddof=1)
    row = rows[("no_rouge", "val_loss")]
    assert row["sd of Δ"] == f"{sd:.3g}"
    assert row["detectable |Δ| (80% power)"] == f"{detectable_effect(len(v)) * sd:.3g}"  # primary: at 5%
    assert row["seeds for this Δ (80% power)"] == str(seeds_needed(abs(np.mean(v - b)) / sd))
    assert f"with {len(v)} seeds only a true |Δ| ≥ {detectable_effect(len(v)) * sd:.3g}" in row["verdict"]
    m = int(json.loads((p.root / "reports" / "details.json").read_text())["holm_family_size"])
    v, b = paired(p, "no_rouge", "rouge1")
    sd = np.std(v - b, ddof=1)  # secondary: at 5% / m, where Holm surely rejects
    detectable = detectable_effect(len(v), alpha=0.05 / m) * sd
    assert rows[("no_rouge", "rouge1")]["detectable |Δ| (80% power)"] == f"{detectable:.3g}"


def test_steps_column_shows_the_range_over_seeds_not_a_mean(tmp_path):
    p = make_project(tmp_path)
    for seed, steps in zip(p.seeds, (111, 113, 113)):
        path = p.runs / f"baseline-{seed}" / "train.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "steps": steps}))
    md = (render(p) / "report.md").read_text(encoding="utf-8")
    cost = {r["variant"]: r for r in md_table(md, "variant", "tokens trained")}
    assert cost["baseline"]["steps"] == "111–113"
    assert cost["no_ffn"]["steps"] == f"{p.train_values[('no_ffn', 0)]['steps']:,}"  # all seeds agree


def test_validation_curve_and_table_val_loss_say_what_they_measure(rendered):
    _, _, md = rendered
    assert "whole validation and test split" in md  # the tables' val_loss (eval.json)
    assert "fixed subset of the validation split (its first train.eval_examples examples" in md  # the curve


@pytest.mark.slow
def test_a_build_folder_left_by_a_killed_report_is_removed_by_the_next(tmp_path):
    p = make_project(tmp_path)
    out = tmp_path / "reports"
    (out / ".report-build.x1y2").mkdir(parents=True)  # SIGKILL while the report was being built
    (out / ".report.md.abc.tmp").write_text("half")  # ... or while it was swapped in
    (out / "studies").mkdir()  # not the stage's: kept
    render(p, out)
    assert sorted(q.name for q in out.iterdir()) == ["curves", "decisions.json", "details.json", "figures", "fingerprint.json",
                                                    "metrics.json", "report.html", "report.md", "studies"]


def test_report_opens_with_one_verdict_per_ablation_then_the_delta_figure(rendered):
    p, out, md = rendered
    lines = md.splitlines()
    first_table = next(i for i, line in enumerate(lines) if line.startswith("|"))
    verdicts = [line for line in lines[:first_table] if line.split(":")[0] in p.variants]
    assert [v.split(":")[0] for v in verdicts] == [v for v in p.variants if v != "baseline"]
    assert next(i for i, line in enumerate(lines) if "figures/deltas.png" in line) < first_table
    # the numbers are the Δ table's, read from eval.json
    x = {s: p.eval_values[("no_ffn", s)]["val_loss"] - p.eval_values[("baseline", s)]["val_loss"] for s in p.seeds}
    d = np.array(list(x.values()))
    half = sps.t.ppf(0.975, len(d) - 1) * sps.sem(d)
    no_ffn = next(v for v in verdicts if v.startswith("no_ffn:"))
    assert f"Δ {d.mean():+.3g} (95% CI [{d.mean() - half:.3g}, {d.mean() + half:.3g}], 3 paired seeds" in no_ffn
    assert no_ffn.endswith("worse than baseline.")
    html = (out / "report.html").read_text(encoding="utf-8")
    assert html.index("<h2>Verdict</h2>") < html.index("<figure>") < html.index("<table>")


def _with_load(p, variant: str, seed: int, start: float, end: float, threads: int = 2,
               others: float | None = None) -> None:
    path = p.runs / f"{variant}-{seed}" / "train.json"
    train = json.loads(path.read_text())
    train.update(threads=threads, load={"start": {"loadavg_1m": start, "other_running": 0},
                                        "end": {"loadavg_1m": end, "other_running": 3}})
    if others is not None:
        train["load"]["others_cpu_share"] = others
    path.write_text(json.dumps(train))


def test_cost_table_marks_timings_taken_under_contention(tmp_path):
    p = make_project(tmp_path)
    for s in p.seeds:
        _with_load(p, "baseline", s, 0.4, 1.9)  # a quiet machine: the run's own two threads
        _with_load(p, "no_ffn", s, 0.5, 5.2 if s == 1 else 1.5)  # seed 1 shared the cores
    md = (render(p) / "report.md").read_text(encoding="utf-8")
    cost = {r["variant"]: r for r in md_table(md, "variant", "tokens trained")}
    assert not cost["baseline"]["wall time (s)"].endswith("⚠") and cost["baseline"]["load (max)"] == "1.9"
    assert cost["no_ffn"]["wall time (s)"].endswith(" ⚠") and cost["no_ffn"]["tokens/s"].endswith(" ⚠")
    assert cost["no_ffn"]["load (max)"] == "5.2" and cost["no_ffn"]["cores"] == "2"
    assert cost["single_head"]["load (max)"] == "—"  # not recorded: unknown, not quiet
    assert "understate this code's speed: no_ffn (seed 1)." in md


def test_contention_is_what_other_processes_used_where_train_json_measured_it(tmp_path):
    """A load of 3 on 2 cores with others at 2% of the CPU: the run's own threads and the previous
    stage's tail, not contention. 25%: contention, whatever the load said."""
    p = make_project(tmp_path)
    for s in p.seeds:
        _with_load(p, "baseline", s, 2.9, 3.0, others=0.02)
        _with_load(p, "no_ffn", s, 0.5, 1.5, others=0.25 if s == 2 else 0.01)
    md = (render(p) / "report.md").read_text(encoding="utf-8")
    cost = {r["variant"]: r for r in md_table(md, "variant", "tokens trained")}
    assert not cost["baseline"]["wall time (s)"].endswith("⚠") and cost["baseline"]["others' CPU (max)"] == "2%"
    assert cost["no_ffn"]["wall time (s)"].endswith(" ⚠") and cost["no_ffn"]["others' CPU (max)"] == "25%"
    assert cost["single_head"]["others' CPU (max)"] == "—"
    assert "understate this code's speed: no_ffn (seed 2)." in md
    assert "sibling stages" not in md  # no run here was the grid launcher's


def test_runs_beside_the_grid_launchers_siblings_are_said_so(tmp_path):
    p = make_project(tmp_path)
    for s in p.seeds:
        _with_load(p, "baseline", s, 1.5, 1.9, threads=1, others=0.5)
        path = p.runs / f"baseline-{s}" / "train.json"
        train = json.loads(path.read_text())
        train["grid_share"] = 1  # the launcher gave each of its 2 stages 1 of the 2 cores
        path.write_text(json.dumps(train))
    md = (render(p) / "report.md").read_text(encoding="utf-8")
    cost = {r["variant"]: r for r in md_table(md, "variant", "tokens trained")}
    assert cost["baseline"]["wall time (s)"].endswith(" ⚠")  # still marked: the planner leaves it out
    assert "count the study's own sibling stages as other processes" in md


@pytest.mark.slow
def test_preset_notes_are_quoted_beside_the_generated_data_facts_and_flagged_on_other_data(tmp_path):
    from pipeline.reporting.notes import data_digest

    p = make_project(tmp_path)
    raw = tmp_path / "data" / "raw"
    meta = {"source": "local", "task": "summarization", "options": {"documents": "line"},
            "files": [{"split": "train", "path": "data/local/mine.csv", "sha256": "ab" * 32}]}
    raw.mkdir(parents=True)
    (raw / "meta.json").write_text(json.dumps(meta))
    shards = tmp_path / "data" / "shards"
    shards.mkdir(parents=True)
    (shards / "manifest.json").write_text(json.dumps({"vocab_size": 1234, "normalization": "NFKC"}))
    digest = data_digest(meta)
    note = "300 real CNN/DailyMail pairs: 240 train, 30 validation, 30 test"

    def report(written_for):
        render_report(p.runs, p.evals, p.filter_metrics, p.variants, p.seeds, "baseline", {}, tmp_path / "r",
                      notes=[note], raw_dir=raw, shards=shards, notes_data_digest=written_for)
        return (tmp_path / "r" / "report.md").read_text(encoding="utf-8")

    md = report("0123456789abcdef")  # the preset's data, not this run's
    facts = next(line for line in md.splitlines() if line.startswith("Data as run"))
    assert "source local, task summarization, documents line" in facts
    assert "examples kept: train 3,000, validation 380, test 390" in facts  # filter.json, not the note
    assert "tokenizer: 1,234 tokens (NFKC)" in facts and f"data digest {digest}." in facts
    assert "written for other data (digest 0123456789abcdef; this run's is " + digest in md
    assert f"⚠ “{note}”" in md
    md = report(digest)
    assert f"written for this run's data (digest {digest})" in md and f"\n“{note}”\n" in md and "⚠ “" not in md
    assert "report.notes_data_digest unset" in report(None)


def test_data_digest_names_the_input_files_not_their_order_or_paths():
    from pipeline.reporting.notes import data_digest

    a = {"files": [{"path": "x/a", "sha256": "11"}, {"path": "x/b", "sha256": "22"}]}
    b = {"files": [{"path": "y/b", "sha256": "22"}, {"path": "y/a", "sha256": "11"}]}
    assert data_digest(a) == data_digest(b) != data_digest({"files": [{"sha256": "11"}]})
    synthetic = {"source": "synthetic", "n_examples": 100, "seed": 0}
    assert data_digest(synthetic) != data_digest({**synthetic, "seed": 1}) and data_digest(None) is None


def test_a_spending_boundarys_unbounded_look_renders(tmp_path):
    """O'Brien-Fleming-type spending at α 0.01 spends next to nothing at 5 of 20 seeds, below
    what its Monte Carlo resolves: no verdict there, the interval unbounded. The report, its Δ figure
    included, still renders (a rerun of synthetic_decide_obf once failed there)."""
    p = make_project(tmp_path, seeds=tuple(range(5)), missing_runs=())
    decide = {"seeds": p.seeds, "looks": [3, 5, 8, 12, 20], "alpha": 0.01, "margin": None, "boundary": "obf",
              "runs": {}}
    render_report(p.runs, p.evals, p.filter_metrics, p.variants, p.seeds, "baseline", {"budget_tokens": 200_000},
                  tmp_path / "reports", decide=decide)
    record = json.loads((tmp_path / "reports" / "decisions.json").read_text())
    second = [v["looks"][1] for v in record["variants"].values()]
    assert second and all(look["n"] == 5 and math.isinf(look["hi"] - look["lo"]) for look in second)
    assert (tmp_path / "reports" / "figures" / "deltas.png").stat().st_size > 0
