"""Position encodings: sinusoid formula, RoPE relativity, T5 bucketing."""
from __future__ import annotations

import math

import pytest
import torch

from model.positions import Rotary, relative_bucket, sinusoidal_table


def test_sinusoidal_table_matches_paper_formula():
    table = sinusoidal_table(50, 10)
    pos, i = 37, 3
    assert math.isclose(table[pos, 2 * i], math.sin(pos / 10000 ** (2 * i / 10)), abs_tol=1e-6)
    assert math.isclose(table[pos, 2 * i + 1], math.cos(pos / 10000 ** (2 * i / 10)), abs_tol=1e-6)
    assert sinusoidal_table(4, 7).shape == (4, 7)  # odd widths work too


def test_rope_scores_depend_only_on_relative_distance():
    rope = Rotary(head_dim=8, max_len=64, theta=10000.0).double()
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(8, generator=g, dtype=torch.float64), torch.randn(8, generator=g, dtype=torch.float64)
    pos = torch.arange(40)
    qs = rope(q.expand(1, 1, 40, 8), pos)[0, 0]  # the same vector at every position
    ks = rope(k.expand(1, 1, 40, 8), pos)[0, 0]
    scores = qs @ ks.T  # (40, 40), score[m, n]
    for offset in range(-39, 40):
        diagonal = torch.diagonal(scores, offset)
        # float32 angle tables: equal to ~1e-7, while different distances differ by O(1)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), atol=1e-6, rtol=0)
    assert not torch.allclose(torch.diagonal(scores, 0)[0], torch.diagonal(scores, 5)[0])  # it does vary
    torch.testing.assert_close(qs.norm(dim=-1), q.norm().expand(40))  # a rotation: norms kept


def test_rope_per_row_positions_equal_shared_positions():
    rope = Rotary(head_dim=4, max_len=16, theta=100.0)
    x = torch.randn(2, 3, 5, 4)
    shared = rope(x, torch.arange(5))
    per_row = rope(x, torch.arange(5).expand(2, 5))
    torch.testing.assert_close(shared, per_row)


def test_relative_buckets_bidirectional():
    rel = torch.arange(-200, 201)
    b = relative_bucket(rel, bidirectional=True, num_buckets=32, max_distance=128)
    assert b.min() >= 0 and b.max() == 31
    past, future = b[rel < 0], b[rel > 0]
    assert past.max() < 16 <= future.min()  # each direction has its own half
    small = torch.arange(1, 8)
    assert (b[200 - small] == small).all() and (b[200 + small] == 16 + small).all()  # exact buckets
    assert (b[rel <= -128] == 15).all() and (b[rel >= 128] == 31).all()  # far = last bucket
    assert (torch.diff(b[rel > 0]) >= 0).all() and (torch.diff(b[rel <= 0]) <= 0).all()  # monotone


def test_relative_buckets_causal_ignore_future():
    rel = torch.arange(-200, 50)
    b = relative_bucket(rel, bidirectional=False, num_buckets=32, max_distance=128)
    assert (b[rel >= 0] == 0).all()
    assert b.max() == 31
    assert (b[(rel < 0) & (rel > -16)] == -rel[(rel < 0) & (rel > -16)]).all()
