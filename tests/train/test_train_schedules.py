"""Schedules against their formulas, and their state surviving a state_dict round trip."""

import math

import pytest
import torch

from qkv.train import schedules


def _optimizer(lr=1.0):
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def _lrs(scheduler, n):
    out = []
    for _ in range(n):
        out.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return out


def test_noam_absolute_matches_vaswani_eq3():
    d_model, warmup = 512, 4000
    lrs = _lrs(schedules.noam(_optimizer(1.0), warmup, d_model=d_model), 1)
    assert lrs[0] == pytest.approx(d_model ** -0.5 * min(1 ** -0.5, 1 * warmup ** -1.5))
    f = schedules.NoamMultiplier(warmup, d_model)
    for step in (1, 100, 3999, 4000, 4001, 10_000, 100_000):
        expected = d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
        assert f(step - 1) == pytest.approx(expected, rel=1e-12)
    # peak at step == warmup: (d_model * warmup)^-0.5
    assert f(warmup - 1) == pytest.approx((d_model * warmup) ** -0.5)


def test_noam_relative_peaks_at_base_lr():
    lrs = _lrs(schedules.noam(_optimizer(0.5), warmup=4), 10)
    assert lrs[:4] == pytest.approx([0.5 * s / 4 for s in (1, 2, 3, 4)])
    assert lrs[4:] == pytest.approx([0.5 * math.sqrt(4 / s) for s in range(5, 11)])


def test_warmup_cosine_values():
    lrs = _lrs(schedules.warmup_cosine(_optimizer(2.0), warmup=2, total=6, min_ratio=0.1), 8)
    expected = [1.0, 2.0]
    for step in range(3, 9):
        p = min(1.0, (step - 2) / 4)
        expected.append(2.0 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p))))
    assert lrs == pytest.approx(expected)
    assert lrs[-1] == pytest.approx(0.2)


def test_constant_with_warmup():
    assert _lrs(schedules.constant(_optimizer(1.0), warmup=3), 5) == pytest.approx([1 / 3, 2 / 3, 1, 1, 1])
    assert _lrs(schedules.constant(_optimizer(1.0)), 2) == [1.0, 1.0]


def test_state_dict_round_trip_restores_position():
    a = schedules.warmup_cosine(_optimizer(1.0), warmup=3, total=20)
    _lrs(a, 7)
    b = schedules.warmup_cosine(_optimizer(1.0), warmup=3, total=20)
    b.load_state_dict(a.state_dict())
    assert _lrs(b, 5) == _lrs(a, 5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="warmup"):
        schedules.NoamMultiplier(0)
    with pytest.raises(ValueError, match="total"):
        schedules.WarmupCosineMultiplier(10, 5)
    with pytest.raises(ValueError, match="schedule"):
        schedules.build("linear", _optimizer(), warmup=1, total=10)
