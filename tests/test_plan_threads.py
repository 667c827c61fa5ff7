"""The CPU time model's threads (pipeline/planning): which products the pinned kernel shares among a
loop's threads, the runs on the pinned products fitted apart from torch's own, and how much a loop
slows when stages side by side leave it fewer threads."""
from __future__ import annotations

import itertools
import json
import statistics

import numpy as np
import pytest
import torch

from benchmarks.cpu_numerics import SHAPES, shape
from model import build_model
from pipeline import cpu_numerics
from pipeline.params import resolve_variant
from pipeline.planning import calibration, estimate, study
from pipeline.train import flops_per_target_token
from tests.test_plan import REPORTS, ROOT


def test_a_products_pieces_are_read_from_its_shape_as_the_pinned_kernel_cuts_it():
    for batch, m, k, n, threads in itertools.product((1, 2, 5), (1, 47, 48, 96, 200), (1, 64, 1024), (2, 512, 8192),
                                                     (1, 2, 3)):
        x = np.empty((batch, m, k) if batch > 1 else (m, k), dtype=np.float32)
        y = np.empty((batch, k, n) if batch > 1 else (k, n), dtype=np.float32)
        assert cpu_numerics.piece_count(batch, m, k, n, threads) == max(1, len(cpu_numerics.pieces(x, y, threads))), (
            batch, m, k, n, threads)


def test_the_default_studys_products_stay_whole_and_a_large_models_are_shared():
    params = calibration.report_params(ROOT / "reports" / "report.md")
    resolved = resolve_variant(params, "baseline")
    cfg, model = estimate.meta_model(resolved, estimate.tokenizer_ids(params, None), "baseline")
    assert estimate.shared_share(model, cfg, 11, 67, 37, threads=2) == 0.0  # its mean batch: every product small
    assert estimate.shared_share(model, cfg, 11, 67, 37, threads=1) == 0.0
    # The same model on a large batch: all but the weights' gradients (64 rows: one 48-row block) shared
    assert estimate.shared_share(model, cfg, 256, 256, 256, threads=2) > 0.8


def test_a_loop_slows_by_the_part_its_threads_split():
    assert study.loop_slowdown(2, 0, 2, parallel=0.0) == 1.0  # one thread's work is one thread's either way
    assert study.loop_slowdown(2, 0, 2, parallel=0.25) == pytest.approx(1.25)
    assert study.loop_slowdown(1, 0, 2, parallel=1.0) == 1.0  # alone: every core
    assert study.loop_slowdown(4, 0, 2, parallel=0.5) == pytest.approx(2.5)  # a quarter of the threads
    assert study.loop_slowdown(2, 1, 2, parallel=1.0) == 1.0  # train.threads 1: no fewer side by side


@pytest.mark.slow
def test_pinned_runs_are_fitted_apart_and_the_era_of_their_peaks_is_read():
    """A pinned report's peak was one thread's until the products were shared among threads: the
    reports from before read 0.35-0.49 of torch's reference, cnn_dailymail_cpu and multi30k_cpu
    (rerun after) 0.77-0.81."""
    reference = calibration.reference_peak(REPORTS)
    shared = {r.parent.name for r in REPORTS if calibration.products_shared(r, reference)}
    assert shared == {"cnn_dailymail_cpu", "multi30k_cpu"}
    pinned, native = calibration.calibrate(REPORTS, True), calibration.calibrate(REPORTS, False)
    assert pinned.pinned and "(pinned)" in pinned.source and not native.pinned
    studies = {r.parent.name for r in REPORTS if calibration.pinned_report(r) and calibration.study_points(r, reference)}
    assert pinned.runs == sum(len(calibration.study_points(r, reference)) for r in REPORTS
                              if calibration.pinned_report(r)) and len(studies) >= 5
    one_thread = calibration.pinned_one_thread_peak(REPORTS)
    assert 0.3 * reference < one_thread < calibration.PINNED_ONE_THREAD * reference


@pytest.mark.slow
def test_the_time_models_thread_scaling_is_the_measured_ones():
    """A pinned step at one thread against two, predicted (1 + parallel_share) and measured by
    benchmarks/cpu_numerics on three CPUs (reports/benchmarks/cpu_numerics*.json): the default
    study's shape gains little from its second thread, S1's more. A model that splits the whole
    loop among its threads (loop_slowdown before: x2) is the control."""
    cal = calibration.calibrate(REPORTS, True)
    measured = {name: [] for name in SHAPES}
    for path in sorted((ROOT / "reports" / "benchmarks").glob("cpu_numerics*.json")):
        shapes = json.loads(path.read_text())["shapes"]
        for name in SHAPES:
            one, two = (statistics.median(shapes[name][f"threads_{t}"]["step_ms"]["pinned"]) for t in (1, 2))
            measured[name].append(one / two)
    for name in SHAPES:
        cfg, (src, tgt_in, _) = shape(name)
        with torch.device("meta"):
            model = build_model(cfg)
        rows, src_len, tgt_len = tgt_in.shape[0], 0 if src is None else src.shape[1], tgt_in.shape[1]
        act = estimate.activation_bytes(model, cfg, rows, src_len, tgt_len, False)
        flops = flops_per_target_token(model, cfg, float(src_len), float(tgt_len)) * rows * tgt_len
        split = estimate.shared_share(model, cfg, rows, src_len, tgt_len, threads=2)
        predicted = 1 + cal.parallel_share(1, estimate.sublayers(cfg), act, flops, cal.peak, split, 2)
        assert len(measured[name]) >= 3
        assert all(abs(predicted - m) <= 0.15 for m in measured[name]), (name, predicted, measured[name])
        assert all(abs(2.0 - m) > 0.5 for m in measured[name])
