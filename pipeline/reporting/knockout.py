"""The report's knock-out section: what the trained baseline uses, beside what training without it costs.

Reads data/eval/knockout/<baseline>-<seed>/knockout.json (stage `knockout`); shown only when one
exists. Three parts:
- a heatmap per attention type and mode: Δ val_loss of each head knocked out, layers × heads,
  mean over seeds;
- the sublayer knock-outs (attention, FFN, positions, skip connections, all heads but one) with
  mean ± 95% t-interval over seeds (pipeline.reporting.stats, as every interval of the report);
- the side-by-side table: for each train-time ablation with a test-time counterpart (the model
  switch each counterpart knock-out matches is in knockout.json), Δ val_loss when trained without the part (eval.json, variant − baseline, paired by
  seed) against Δ val_loss when it is removed after training (knocked − un-knocked baseline), and
  the paired t-test of their difference over seeds, Holm-corrected over the table's rows.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure as MplFigure

from pipeline.reporting.drawing import save
from pipeline.reporting.formatting import MISSING, fmt, fmt_p, fmt_summary
from pipeline.reporting.inputs import ReportInputError, number, read_json, values_by_seed
from pipeline.reporting.render import Block, Figure, Heading, Paragraph, Table
from pipeline.reporting.results import MAIN_METRIC_PRIORITY
from pipeline.reporting.stats import ALPHA, holm, paired_delta, summarize

ATTENTION_TYPES = ("encoder.self", "decoder.self", "decoder.cross")
# Keyed by model.knockout.COUNTERPARTS' names and switches (the report imports no model code, so
# that its stage does not rerun on every model edit): tests/test_one_place.py checks they match.
# Other model keys a train-time ablation may set and still be a counterpart: "no positional
# encoding" with an added relative bias removes that too (the tiny_shakespeare presets).
COUNTERPART_EXTRAS = {"positional": {"relative_bias": False}}
PART_NAMES = {"heads_but_one": "every head but one", "positional": "positional encoding",
              "residual.all": "residual connections"}  # other counterparts are shown by their name


def load_knockouts(evals_dir: Path, baseline: str, seeds: Sequence[int]) -> dict[int, dict]:
    """seed -> knockout.json of the knockout stage; seeds without one are left out."""
    out = {}
    for seed in seeds:
        path = Path(evals_dir) / "knockout" / f"{baseline}-{seed}" / "knockout.json"
        data = read_json(path, dict)
        if data is None:
            continue
        if not isinstance(data.get("base"), dict) or not isinstance(data.get("knockouts"), list) \
                or not all(isinstance(r, dict) and isinstance(r.get("name"), str) for r in data["knockouts"]):
            raise ReportInputError(f"{path}: expected 'base' and a 'knockouts' list of records with names; "
                                   "rerun the knockout stage that wrote it")
        out[seed] = data
    return out


def deltas(knockouts: Mapping[int, dict], metric: str = "val_loss") -> dict[tuple[str, str], dict[int, float]]:
    """(name, mode) -> seed -> Δ metric (knocked − un-knocked), in the order the stage wrote them."""
    out: dict[tuple[str, str], dict[int, float]] = {}
    for seed, data in knockouts.items():
        for record in data["knockouts"]:
            value = number(record, f"delta_{metric}")
            if value is not None:
                out.setdefault((record["name"], str(record.get("mode"))), {})[seed] = value
    return out


def records(knockouts: Mapping[int, dict]) -> dict[tuple[str, str], dict]:
    """(name, mode) -> a record (the first seed's: where and what a knock-out is is the same in every seed)."""
    out: dict[tuple[str, str], dict] = {}
    for data in knockouts.values():
        for record in data["knockouts"]:
            out.setdefault((record["name"], str(record.get("mode"))), record)
    return out


def task_metric(knockouts: Mapping[int, dict]) -> str | None:
    present = {m for data in knockouts.values() for m in data.get("metrics") or []}
    return next((m for m in MAIN_METRIC_PRIORITY if m in present), None)


def head_grids(knockouts: Mapping[int, dict]) -> dict[tuple[str, str], np.ndarray]:
    """(mode, "stack.attn") -> layers × heads of mean Δ val_loss over seeds (NaN where not knocked)."""
    by_key = deltas(knockouts)
    cells: dict[tuple[str, str], dict[tuple[int, int], float]] = {}
    for (name, mode), record in records(knockouts).items():
        if record.get("kind") == "head" and record.get("knocks") == 1 and (name, mode) in by_key:
            values = list(by_key[(name, mode)].values())
            cells.setdefault((mode, f"{record['stack']}.{record['attn']}"), {})[
                (int(record["layer"]), int(record["head"]))] = float(np.mean(values))
    grids = {}
    for key, found in cells.items():
        grid = np.full((max(i for i, _ in found) + 1, max(h for _, h in found) + 1), np.nan)
        for (i, h), v in found.items():
            grid[i, h] = v
        grids[key] = grid
    return grids


def plot_head_grids(grids: Mapping[tuple[str, str], np.ndarray], path: Path) -> None:
    """One heatmap per mode (rows) × attention type (columns), one colour scale per mode."""
    modes = sorted({m for m, _ in grids}, key=lambda m: (m != "zero", m))
    types = [t for t in ATTENTION_TYPES if any((m, t) in grids for m in modes)]
    fig = MplFigure(layout="constrained", figsize=(3.6 * len(types) + 1, 2.6 * len(modes) + 0.6))
    axes = np.atleast_2d(fig.subplots(len(modes), len(types), squeeze=False))
    for row, mode in zip(axes, modes):
        values = np.concatenate([g.ravel() for (m, _), g in grids.items() if m == mode])
        vmax = max(float(np.nanmax(np.abs(values))), 1e-9)
        im = None
        for ax, kind in zip(row, types):
            grid = grids.get((mode, kind))
            ax.set_title(f"{kind}, {mode}-ablation", fontsize=9)
            if grid is None:
                ax.set_axis_off()
                continue
            im = ax.imshow(grid, cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto", interpolation="nearest")
            for (i, h), v in np.ndenumerate(grid):
                if not math.isnan(v):
                    ax.text(h, i, f"{v:.2g}", ha="center", va="center", fontsize=7,
                            color="white" if abs(v) > 0.6 * vmax else "black")  # readable on dark cells
            ax.set_xticks(range(grid.shape[1]))
            ax.set_yticks(range(grid.shape[0]))
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
        if im is not None:
            fig.colorbar(im, ax=list(row), label="Δ val_loss", shrink=0.9)
    save(fig, path)


def counterpart_variants(counterparts: Mapping[str, Sequence], ablations: Mapping[str, Mapping | None],
                         baseline: str) -> dict[str, str]:
    """knock-out name -> the train-time variant that removes the same part: its overrides set the
    counterpart's model switch `counterparts[name]` = (key, value) (and nothing else but
    COUNTERPART_EXTRAS), train untouched."""
    out = {}
    for name, (key, value) in counterparts.items():
        allowed = {key: value, **COUNTERPART_EXTRAS.get(key, {})}
        for variant, overrides in ablations.items():
            overrides = overrides or {}
            model = overrides.get("model") or {}
            if variant != baseline and set(overrides) <= {"model"} and model.get(key) == value \
                    and all(k in allowed and model[k] == allowed[k] for k in model):
                out.setdefault(name, variant)
    return out


def side_by_side(knockouts: Mapping[int, dict], runs, seeds: Sequence[int], baseline: str,
                 ablations: Mapping[str, Mapping | None]) -> list[dict]:
    """One row per counterpart × mode: train-time Δ, test-time Δ, their paired difference, Holm."""
    by_key = deltas(knockouts)
    base = values_by_seed(runs, baseline, seeds, "eval", "val_loss")
    rows = []
    counterparts = next(iter(knockouts.values())).get("counterparts") or {}
    for name, variant in counterpart_variants(counterparts, ablations, baseline).items():
        trained = values_by_seed(runs, variant, seeds, "eval", "val_loss")
        train_delta = {s: trained[s] - base[s] for s in trained if s in base}
        for mode in ("zero", "mean"):
            test_delta = by_key.get((name, mode))
            if not test_delta:
                continue
            rows.append({"part": name, "variant": variant, "mode": mode,
                         "train": summarize(list(train_delta.values())), "test": summarize(list(test_delta.values())),
                         "diff": paired_delta(train_delta, test_delta, higher_better=False)})
    tested = [i for i, r in enumerate(rows) if r["diff"].p_value is not None]
    for i, p in zip(tested, holm([rows[i]["diff"].p_value for i in tested])):
        rows[i]["p_holm"] = p
    return rows


def sentence(row: dict) -> str:
    """Which Δ is larger, and whether their difference is significant after Holm."""
    part, train, test, diff = PART_NAMES.get(row["part"], row["part"]), row["train"].mean, row["test"].mean, row["diff"]
    if train is None or test is None:
        return f"{part}: no seed has both numbers"
    larger = "training without" if train > test else f"removing after training ({row['mode']}-ablation)"
    head = f"{part}: {larger} costs more (Δ {fmt(max(train, test), 3)} vs {fmt(min(train, test), 3)})"
    p = row.get("p_holm")
    if p is None:
        return f"{head}; {diff.verdict}, no significance claimed"
    if p < ALPHA:
        return f"{head}, a significant difference (paired over {diff.n} seeds, Holm p {fmt_p(p)})"
    return (f"{head}, but the difference is not significant at {ALPHA:.0%} after Holm "
            f"(paired over {diff.n} seeds, Holm p {fmt_p(p)})")


def knockout_blocks(knockouts: Mapping[int, dict], runs, seeds: Sequence[int], baseline: str,
                    ablations: Mapping[str, Mapping | None], figures_dir: Path) -> list[Block]:
    """The section; [] when no knockout stage ran."""
    if not knockouts:
        return []
    first = next(iter(knockouts.values()))
    k_seeds = sorted(knockouts)
    metric = task_metric(knockouts)
    blocks: list[Block] = [Heading("Knock-outs: what the trained baseline uses"), Paragraph(_setup(knockouts, runs, baseline))]
    grids = head_grids(knockouts)
    if grids:
        plot_head_grids(grids, figures_dir / "knockout_heads.png")
        blocks.append(Figure("figures/knockout_heads.png",
                             f"Δ val_loss when one head of the trained {baseline} is knocked out (knocked − "
                             f"un-knocked), mean over seeds {', '.join(map(str, k_seeds))}; layers × heads, "
                             "one panel per attention type and mode"))
    by_key, by_metric = deltas(knockouts), deltas(knockouts, metric) if metric else {}
    table = []
    for (name, mode), record in records(knockouts).items():
        if record.get("kind") == "head" and record.get("knocks") == 1:
            continue  # in the heatmap
        row = [name, mode, fmt_summary(summarize(list(by_key.get((name, mode), {}).values())))]
        if metric:
            row.append(fmt_summary(summarize(list(by_metric.get((name, mode), {}).values()))))
        table.append(row)
    blocks.append(Table(["knock-out", "mode", "Δ val_loss ↓ (mean ± 95% CI)"]
                        + ([f"Δ {metric} (mean ± 95% CI)"] if metric else []), table,
                        f"Sublayer knock-outs of the trained {baseline} (knocked − un-knocked, over seeds)",
                        [f"attention.<stack>.<self|cross>.L<i> / ffn.<stack>.L<i>: the sublayer's output replaced "
                         "(zero: by 0; mean: by its mean over held-out tokens), its residual kept; "
                         "residual.<stack>.L<i>: the skip connections (the `x +`) of layer i's sublayers; "
                         "residual.all: every layer's; positional: every stack's positions; heads_but_one: "
                         "every head but head 0 in every attention.",
                         f"val_loss on the first {first.get('n_loss_tokens', MISSING)} validation target tokens"
                         + (f", {metric} on the first {first.get('n_examples', MISSING)} test examples (counterparts only)" if metric else "")
                         + ", the same for the un-knocked model."]))
    rows = side_by_side(knockouts, runs, seeds, baseline, ablations)
    if rows:
        blocks.append(Table(
            ["part removed", "trained without (variant)", "Δ val_loss trained without", "mode",
             "Δ val_loss removed after training", "difference (trained − removed)", "p (paired t)", "p (Holm)",
             "reading"],
            [[PART_NAMES.get(r["part"], r["part"]), r["variant"], fmt_summary(r["train"]), r["mode"], fmt_summary(r["test"]),
              fmt_summary_delta(r["diff"]), fmt_p(r["diff"].p_value), fmt_p(r.get("p_holm")), sentence(r)]
             for r in rows],
            "Two kinds of ablation side by side: trained without the part vs removed from the trained baseline",
            ["Trained without: eval.json val_loss of the variant − the baseline, paired by seed (whole validation "
             "split). Removed after training: the knockout stage's Δ on its validation tokens. The difference is "
             "tested paired over the seeds that have both (t-test), Holm-corrected over this table's rows.",
             "Removal after training costing more than training without the part: the model relies on it but "
             "can learn to do without; the reverse: the trained model has redundancy for it that retraining "
             "does not recover."]))
    return blocks


def fmt_summary_delta(d) -> str:
    if d.mean is None:
        return MISSING
    return fmt(d.mean, 3) + (f" ± {fmt(d.half_width, 2)}" if d.half_width is not None else "") + f" (n={d.n})"


def _setup(knockouts: Mapping[int, dict], runs, baseline: str) -> str:
    walls = {s: number(d, "wall_s") for s, d in knockouts.items()}
    trains = {s: number(runs[(baseline, s)].train if (baseline, s) in runs else None, "wall_time_s") for s in knockouts}
    first = next(iter(knockouts.values()))
    n = len(first["knockouts"])
    text = (f"Parts removed from the trained {baseline} at evaluation time, one at a time, no retraining "
            f"(stage knockout, seeds {', '.join(map(str, sorted(knockouts)))}): {n} knock-outs per seed "
            f"({', '.join(map(str, first.get('modes') or []))}-ablation; mean-ablation replaces the part's output by "
            f"its mean over {first.get('mean_examples', MISSING)} held-out training examples).")
    wall = [w for w in walls.values() if w is not None]
    train = [t for s, t in trains.items() if t is not None and walls.get(s) is not None]
    if wall:
        text += f" The stage took {fmt(float(np.mean(wall)), 3)} s per seed"
        if train:
            text += f", {float(np.mean(wall)) / float(np.mean(train)):.0%} of training the {baseline} run ({fmt(float(np.mean(train)), 3)} s)"
        text += "."
    return text


def knockout_summary(knockouts: Mapping[int, dict]) -> dict:
    """For reports/details.json: mean Δ val_loss over seeds per mode and knock-out."""
    out: dict[str, dict] = {}
    for (name, mode), values in deltas(knockouts).items():
        s = summarize(list(values.values()))
        out.setdefault(mode, {})[name] = {"delta_val_loss": s.mean, "ci95": s.half_width}
    return out


def mirror_knockouts(evals_dir: Path, baseline: str, seeds: Sequence[int], experiment: str, data=None) -> None:
    """One MLflow run per seed, `knockout-<seed>` (tags stage=knockout, seed, run): the un-knocked
    numbers and every knock-out's Δ as metrics (`delta_val_loss/<mode>/<name>`), the files as
    artifacts. Like a training run it carries its stage's start and end (knockout.json), so the
    runs table's Duration is the knockout stage's, and its data (`data`, a RunData: the Dataset
    column, context "evaluation"). A run already mirrored from the identical knockout.json and
    data is reused. Failures warn."""
    import hashlib
    import logging

    from pipeline.reporting.mlflow_mirror import DIGEST_TAG, stage_times
    from pipeline.tracking import dvc_experiment, experiment_id, open_client, problem, store_lock, tracking_enabled

    log = logging.getLogger("pipeline.report")
    found = {s: Path(evals_dir) / "knockout" / f"{baseline}-{s}" for s in seeds}
    found = {s: d for s, d in found.items() if (d / "knockout.json").is_file()}
    if not found or not tracking_enabled():
        return
    try:
        with store_lock():
            from mlflow.entities import Metric

            client = open_client()
            exp_id = experiment_id(client, experiment)
            known = {r.data.tags.get(DIGEST_TAG) for r in client.search_runs(
                [exp_id], "tags.stage = 'knockout'", max_results=50_000)}
            for seed, folder in found.items():
                path = folder / "knockout.json"
                raw = path.read_bytes()
                # What the mirror shows: the file and the data. "v2": runs mirrored before the stage's
                # times and the dataset were logged are mirrored again, not reused.
                digest = hashlib.sha256(f"knockout mirror v2 {data}".encode() + b"\0" + raw).hexdigest()
                if digest in known:
                    continue
                record = read_json(path, dict)
                start, end = stage_times(path, record, "wall_s")
                run_id = client.create_run(exp_id, start_time=start, run_name=f"knockout-{seed}", tags={
                    "stage": "knockout", "seed": str(seed), "knockout_of": f"{baseline}-{seed}", DIGEST_TAG: digest,
                    **dvc_experiment()}).info.run_id
                stamp = int(path.stat().st_mtime * 1000)
                values = {f"base/{k}": v for k, v in record["base"].items()}
                values |= {f"{key}/{r.get('mode')}/{r['name']}": r[key] for r in record["knockouts"]
                           for key in r if key.startswith("delta_")}
                values["wall_s"] = record.get("wall_s")
                metrics = [Metric(k, float(v), stamp, 0) for k, v in sorted(values.items())
                           if isinstance(v, (int, float)) and math.isfinite(v)]
                for i in range(0, len(metrics), 500):
                    client.log_batch(run_id, metrics=metrics[i:i + 500])
                for name in ("knockout.json", "knockout.csv"):
                    if (folder / name).is_file():
                        client.log_artifact(run_id, str(folder / name))
                if data is not None:
                    client.log_inputs(run_id, [data.entity("evaluation")])
                client.set_terminated(run_id, "FINISHED", end_time=end)
    except Exception as exc:  # noqa: BLE001 - MLflow only mirrors; the report is on disk
        log.warning("report: MLflow knock-out runs skipped (%s)", problem(exc))
