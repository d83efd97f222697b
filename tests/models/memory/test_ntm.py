"""NTM addressing, each piece against a literal loop (Graves et al. 2014, eq. 2-9), and the
NTM/LSTM models on the copy task's batch layout."""

from __future__ import annotations

import math

import pytest
import torch

from qkv.models.memory.ntm import (LSTMBaseline, LSTMBaselineConfig, NeuralTuringMachine, NTMConfig, circular_shift,
                            content_addressing, interpolate, read_memory, sharpen, write_memory)
from qkv.tasks.ntm_copy import NTMCopy

torch.manual_seed(0)
B, N, W = 2, 7, 4


def _distribution(*shape):
    return torch.softmax(torch.randn(*shape, dtype=torch.float64), -1)


def test_content_addressing_matches_loop():
    key, memory = torch.randn(B, W, dtype=torch.float64), torch.randn(B, N, W, dtype=torch.float64)
    beta = torch.tensor([0.5, 3.0], dtype=torch.float64)
    w = content_addressing(key, beta, memory)
    for b in range(B):
        cos = [torch.dot(key[b], memory[b, i]) / (key[b].norm() * memory[b, i].norm()) for i in range(N)]
        e = [math.exp(beta[b].item() * c.item()) for c in cos]
        for i in range(N):
            assert abs(w[b, i].item() - e[i] / sum(e)) < 1e-10


def test_interpolation():
    wc, wp = _distribution(B, N), _distribution(B, N)
    g = torch.tensor([0.0, 0.3], dtype=torch.float64)
    out = interpolate(wc, wp, g)
    assert torch.allclose(out[0], wp[0])
    assert torch.allclose(out[1], 0.3 * wc[1] + 0.7 * wp[1])
    assert torch.allclose(out.sum(-1), torch.ones(B, dtype=torch.float64))


@pytest.mark.parametrize("R", [1, 2])
def test_shift_is_circular_convolution(R):
    w, s = _distribution(B, N), _distribution(B, 2 * R + 1)
    out = circular_shift(w, s)
    for b in range(B):
        for i in range(N):
            # w~(i) = sum_j w(j) s(i - j), i - j taken mod N and read as a shift in -R..R
            ref = 0.0
            for j in range(N):
                shift = (i - j) % N
                shift = shift - N if shift > N // 2 else shift
                if -R <= shift <= R:
                    ref += w[b, j].item() * s[b, shift + R].item()
            assert abs(out[b, i].item() - ref) < 1e-12
    assert torch.allclose(out.sum(-1), torch.ones(B, dtype=torch.float64))
    # a one-hot shift by +1 rotates the weighting by one slot, wrapping around
    one = torch.zeros(1, 2 * R + 1, dtype=torch.float64)
    one[0, R + 1] = 1
    assert torch.allclose(circular_shift(w[:1], one), torch.roll(w[:1], 1, -1))
    with pytest.raises(ValueError, match="odd"):
        circular_shift(w, torch.ones(B, 2, dtype=torch.float64))


def test_sharpening_keeps_a_distribution():
    w = _distribution(B, N)
    gamma = torch.tensor([1.0, 4.0], dtype=torch.float64)
    out = sharpen(w, gamma)
    assert torch.allclose(out.sum(-1), torch.ones(B, dtype=torch.float64))
    assert torch.all(out >= 0)
    assert torch.allclose(out[0], w[0], atol=1e-10)  # gamma = 1 changes nothing
    ref = w[1] ** 4 / (w[1] ** 4).sum()
    assert torch.allclose(out[1], ref, atol=1e-10)
    assert out[1].max() >= w[1].max()  # sharper


def test_read_and_erase_add_write_match_loop():
    memory = torch.randn(B, N, W, dtype=torch.float64)
    w = _distribution(B, N)
    e = torch.rand(B, W, dtype=torch.float64)
    a = torch.randn(B, W, dtype=torch.float64)
    r = read_memory(w, memory)
    new = write_memory(memory, w, e, a)
    for b in range(B):
        assert torch.allclose(r[b], sum(w[b, i] * memory[b, i] for i in range(N)))
        for i in range(N):
            erased = memory[b, i] * (1 - w[b, i] * e[b])  # M~_i = M_i (1 - w(i) e)
            assert torch.allclose(new[b, i], erased + w[b, i] * a[b])  # M_i = M~_i + w(i) a
    assert not torch.equal(new, memory)


def test_ntm_forward_weights_and_loss():
    task = NTMCopy(width=4, max_len=3)
    batch = task.get_batch("train", 2, 0)
    model = NeuralTuringMachine(NTMConfig(input_dim=5, output_dim=4, controller_size=16, memory_slots=8, memory_width=6))
    out = model(**batch, need_weights=True)
    T = batch["inputs"].shape[1]
    assert out.logits.shape == (2, T, 4) and out.loss.dim() == 0
    assert out.weights["read"].shape == (2, T, 1, 8) and out.weights["write"].shape == (2, T, 8)
    assert torch.allclose(out.weights["write"].sum(-1), torch.ones(2, T), atol=1e-5)
    out.loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    # the loss only sees the output phase
    labels = batch["labels"].clone()
    labels[~batch["label_mask"]] = 1 - labels[~batch["label_mask"]]
    assert torch.allclose(model(inputs=batch["inputs"], labels=labels, label_mask=batch["label_mask"]).loss,
                          model(**batch).loss)


def test_ntm_stepwise_equals_forward():
    model = NeuralTuringMachine(NTMConfig(input_dim=3, output_dim=2, controller_size=8, memory_slots=6, memory_width=4))
    x = torch.randn(2, 5, 3)
    full = model(inputs=x)
    first = model(inputs=x[:, :2])
    rest = model(inputs=x[:, 2:], state=first.state)
    assert torch.allclose(full.logits, torch.cat([first.logits, rest.logits], 1), atol=1e-6)


def test_ntm_and_lstm_bad_inputs():
    model = NeuralTuringMachine(NTMConfig(input_dim=3, output_dim=2, controller_size=8, memory_slots=6, memory_width=4))
    with pytest.raises(ValueError, match="input_dim"):
        model(inputs=torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match="shift_range"):
        NeuralTuringMachine(NTMConfig(memory_slots=2, shift_range=1))
    lstm = LSTMBaseline(LSTMBaselineConfig(input_dim=3, output_dim=2, hidden_size=8))
    with pytest.raises(TypeError, match="inputs"):
        lstm(inputs=torch.zeros(2, 5, 3, dtype=torch.long))
    assert lstm(inputs=torch.randn(2, 5, 3)).logits.shape == (2, 5, 2)
