"""The report stage renders from fake run files: its numbers, missing values, HTML and verdict first.

Errors and atomicity: test_report_errors.py; the cost table: test_report_cost.py; the preset's notes:
test_report_notes.py."""
import base64
import json
import math
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from pipeline.report import render_report
from pipeline.reporting.figures import _attention_panel
from pipeline.reporting.inputs import load_run
from pipeline.reporting.stats import detectable_effect, seeds_needed
from pipeline.reporting.study import Study, read_inputs
from tests.fixtures.report.fake_runs import make_project


def render(p, out: Path | None = None, budget=None, **settings) -> Path:
    """The report of fake project `p` in `out` (its reports/ by default); `settings`: Study's optional ones."""
    out = out or p.root / "reports"
    budget = budget if budget is not None else {"budget_tokens": 200_000}
    render_report(read_inputs(Study(p.runs, p.evals, p.filter_metrics, p.variants, p.seeds, "baseline", budget,
                                    **settings)), out)
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


@pytest.mark.slow
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


def test_attention_prefers_cross_then_decoder_self(tmp_path):
    p = make_project(tmp_path, seeds=(0,), missing_runs=())
    run = load_run(p.runs, p.evals, "baseline", 0)
    title, matrix, keys, queries = _attention_panel(run)
    assert title.endswith("decoder.cross") and matrix.shape == (len(queries), len(keys))
    del run.attention["maps"]["decoder.cross"]
    title, matrix, keys, queries = _attention_panel(run)
    assert title.endswith("decoder.self") and keys == queries


@pytest.mark.slow
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


@pytest.mark.slow
def test_report_primary_metric_moves_the_uncorrected_test(tmp_path):
    p = make_project(tmp_path)
    render(p, tmp_path / "reports", budget={}, primary_metric="rouge1")
    rows = delta_rows((tmp_path / "reports" / "report.md").read_text(encoding="utf-8"))
    assert rows[("no_ffn", "rouge1")]["p (Holm)"] == "primary: uncorrected"
    assert rows[("no_ffn", "val_loss")]["p (Holm)"] not in ("primary: uncorrected", "—")


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_spending_boundarys_unbounded_look_renders(tmp_path):
    """O'Brien-Fleming-type spending at α 0.01 spends next to nothing at 5 of 20 seeds, below
    what its Monte Carlo resolves: no verdict there, the interval unbounded. The report, its Δ figure
    included, still renders (a rerun of synthetic_decide_obf once failed there)."""
    p = make_project(tmp_path, seeds=tuple(range(5)), missing_runs=())
    decide = {"seeds": p.seeds, "looks": [3, 5, 8, 12, 20], "alpha": 0.01, "margin": None, "boundary": "obf",
              "runs": {}}
    render(p, tmp_path / "reports", decide=decide)
    record = json.loads((tmp_path / "reports" / "decisions.json").read_text())
    second = [v["looks"][1] for v in record["variants"].values()]
    assert second and all(look["n"] == 5 and math.isinf(look["hi"] - look["lo"]) for look in second)
    assert (tmp_path / "reports" / "figures" / "deltas.png").stat().st_size > 0
