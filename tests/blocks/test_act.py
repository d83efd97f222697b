"""Adaptive Computation Time (Graves 2016) around a step function: a hand-made halting sequence
against the formulas, weights that sum to 1, N <= M, frozen halted positions, gradients."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from qkv.blocks import AdaptiveComputationTime


def scripted(halting, max_steps, eps=0.01):
    """ACT whose halting unit reads h^n from the state: s = (n, logit h^n) per position."""
    act = AdaptiveComputationTime(2, max_steps, eps=eps)
    with torch.no_grad():
        act.halting.weight.copy_(torch.tensor([[0.0, 1.0]]))
        act.halting.bias.zero_()
    table = torch.tensor(halting, dtype=torch.float64)  # (P, M) the h^n of each position
    logits = torch.log(table) - torch.log1p(-table)
    seen = []

    def step(s, n):
        seen.append(s.clone())
        return torch.stack([torch.full_like(s[..., 0], float(n)), logits[:, n - 1]], dim=-1)

    return act.double(), step, seen


def test_hand_made_halting_sequence_matches_the_formulas():
    # eps = 0.01, M = 4; N = min{n : sum_{n' <= n} h >= 0.99}, R = 1 - sum_{n < N} h
    halting = [[0.3, 0.5, 0.4, 0.9],   # 0.3, 0.8, 1.2 -> N = 3, R = 0.2
               [0.995, 0.5, 0.5, 0.5],  # N = 1, R = 1
               [0.1, 0.1, 0.1, 0.1],   # never reaches 0.99: N = M = 4, R = 0.7
               [0.5, 0.49, 0.2, 0.2]]  # 0.5, 0.99 -> N = 2, R = 0.5
    act, step, _ = scripted(halting, max_steps=4)
    out = act(step, torch.zeros(4, 2, dtype=torch.float64))
    assert out.n_steps.tolist() == [3, 1, 4, 2]
    torch.testing.assert_close(out.remainder, torch.tensor([0.2, 1.0, 0.7, 0.5], dtype=torch.float64))
    torch.testing.assert_close(out.ponder_cost, torch.tensor([3.2, 2.0, 4.7, 2.5], dtype=torch.float64))
    p = torch.tensor([[0.3, 0.5, 0.2, 0], [1.0, 0, 0, 0], [0.1, 0.1, 0.1, 0.7], [0.5, 0.5, 0, 0]], dtype=torch.float64)
    torch.testing.assert_close(out.probabilities, p)
    # mean field: sum_n p^n s^n, with s^n_0 = n
    torch.testing.assert_close(out.output[:, 0], (p * torch.arange(1, 5)).sum(-1))


def test_halted_positions_stop_changing():
    halting = [[0.995, 0.5, 0.5], [0.2, 0.2, 0.9]]
    act, step, seen = scripted(halting, max_steps=3)
    act(step, torch.zeros(2, 2, dtype=torch.float64))
    assert len(seen) == 3  # position 1 needs 3 steps
    # position 0 halted after step 1: the step function sees its step-1 state from then on
    torch.testing.assert_close(seen[1][0], seen[2][0])
    assert seen[1][0, 0] == 1.0 and seen[2][1, 0] == 2.0


def test_the_loop_stops_when_all_halted_unless_asked():
    act, step, seen = scripted([[0.995, 0.5, 0.5]], max_steps=3)
    assert act(step, torch.zeros(1, 2, dtype=torch.float64)).probabilities.shape == (1, 1)  # the steps run
    assert len(seen) == 1
    act(step, torch.zeros(1, 2, dtype=torch.float64), run_all_steps=True)
    assert len(seen) == 1 + 3
    out = act(step, torch.zeros(1, 2, dtype=torch.float64), min_steps=2)  # incremental decoding's floor
    assert len(seen) == 1 + 3 + 2 and out.n_steps.tolist() == [1]
    torch.testing.assert_close(out.final_state, seen[-1])  # frozen after its halt at step 1


@settings(max_examples=25, deadline=None)
@given(M=st.integers(1, 6), bias=st.floats(-4, 4), eps=st.floats(0, 0.5), seed=st.integers(0, 100))
def test_weights_sum_to_one_and_steps_are_bounded(M, bias, eps, seed):
    g = torch.Generator().manual_seed(seed)
    act = AdaptiveComputationTime(4, M, eps=eps, halting_bias_init=bias)
    w = torch.randn(4, 4, generator=g)
    out = act(lambda s, n: torch.tanh(s @ w + n), torch.randn(3, 5, 4, generator=g))
    torch.testing.assert_close(out.probabilities.sum(-1), torch.ones(3, 5))
    assert (out.n_steps >= 1).all() and (out.n_steps <= M).all()
    assert (out.probabilities >= 0).all() and (out.remainder > 0).all() and (out.remainder <= 1).all()
    torch.testing.assert_close(out.ponder_cost, out.n_steps.float() + out.remainder)


def test_ponder_cost_gradient_reaches_the_halting_unit():
    act = AdaptiveComputationTime(3, 5)
    out = act(lambda s, n: s * 0.9 + 0.1, torch.randn(2, 4, 3))
    out.ponder_cost.sum().backward()
    assert act.halting.weight.grad.abs().sum() > 0 and act.halting.bias.grad.abs() > 0


@pytest.mark.parametrize("bias, steps", [(1.0, 2), (-1.0, 4), (-2.0, 9)])
def test_halting_bias_sets_the_initial_depth(bias, steps):
    """h = sigmoid(b) everywhere with W_h = 0: N = ceil(0.99 / h); b = +1 (tensor2tensor) halts after 2."""
    act = AdaptiveComputationTime(3, 10, halting_bias_init=bias)
    torch.nn.init.zeros_(act.halting.weight)
    out = act(lambda s, n: s + 1, torch.zeros(1, 2, 3))
    assert out.n_steps.tolist() == [[steps, steps]]
    assert steps == math.ceil(0.99 / torch.sigmoid(torch.tensor(bias)).item())


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="max_steps"):
        AdaptiveComputationTime(4, 0)
    with pytest.raises(ValueError, match="eps"):
        AdaptiveComputationTime(4, 3, eps=1.0)
    with pytest.raises(TypeError, match="halting_bias_init"):
        AdaptiveComputationTime(4, 3, halting_bias_init="1")
    with pytest.raises(TypeError, match="s must be"):
        AdaptiveComputationTime(4, 3)(lambda s, n: s, torch.zeros(2, 4, dtype=torch.long))


def test_memory_follows_the_steps_run_not_max_steps():
    """Issue 20 item 5: ACT kept one (zero) probability per step up to M whatever the steps run, so
    a Universal Transformer with max_steps=1e9 was killed for memory. Every position halts at
    step 1 here: M = 10^6 costs what M = 2 does (Python-side allocations traced)."""
    import tracemalloc

    act = AdaptiveComputationTime(4, 10 ** 6, halting_bias_init=10.0)  # h ~ 1: everything halts at once
    s = torch.randn(2, 3, 4)
    tracemalloc.start()
    out = act(lambda x, n: x + 1, s)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert out.n_steps.eq(1).all() and out.probabilities.shape == (2, 3, 1)
    assert peak < 1_000_000, peak  # was ~10^8 bytes: a million zero tensors
