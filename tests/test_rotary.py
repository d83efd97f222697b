"""Rotary position embeddings (qkv.rotary): RoFormer's rotation written out, the half/adjacent
relation, relative positions, and every scaling against its formula and transformers' own."""

import math

import pytest
import torch

from qkv.rotary import RotaryEmbedding, check_rope_scaling, rope_frequencies, rotate_half

D = 8


def roformer_adjacent(x, m, theta):
    """RoFormer eq. 14-15 literally: pair (x_2i, x_2i+1) turned by m theta_i, one position, float64."""
    out = x.clone()
    for i, t in enumerate(theta.tolist()):
        a = m * t
        x0, x1 = x[2 * i].item(), x[2 * i + 1].item()
        out[2 * i] = math.cos(a) * x0 - math.sin(a) * x1
        out[2 * i + 1] = math.sin(a) * x0 + math.cos(a) * x1
    return out


def half_permutation(d):
    """P: feature 2i -> i, 2i + 1 -> i + d/2 (index list: new[j] = old[perm[j]])."""
    return [2 * j if j < d // 2 else 2 * (j - d // 2) + 1 for j in range(d)]


def test_half_rotation_is_roformer_up_to_a_permutation():
    torch.manual_seed(0)
    rope = RotaryEmbedding(D, base=100.0)
    x = torch.randn(1, 1, 5, D, dtype=torch.float64)
    positions = torch.tensor([0, 1, 2, 7, 30])
    perm = half_permutation(D)
    rotated, _ = rope(x[..., perm], x[..., perm], positions)
    for row, m in enumerate(positions.tolist()):
        expected = roformer_adjacent(x[0, 0, row], m, rope.theta)
        torch.testing.assert_close(rotated[0, 0, row], expected[perm], rtol=0, atol=1e-12)


def test_scores_depend_on_relative_positions_only():
    torch.manual_seed(1)
    rope = RotaryEmbedding(D)
    q, k = torch.randn(2, 1, 1, 1, D, dtype=torch.float64).unbind(0)
    scores = []
    for m, n in ((3, 1), (10, 8), (102, 100)):
        qm, _ = rope(q, q, torch.tensor([m]))
        _, kn = rope(k, k, torch.tensor([n]))
        scores.append((qm * kn).sum().item())
    assert scores[0] == pytest.approx(scores[1], abs=1e-12) and scores[0] == pytest.approx(scores[2], abs=1e-10)
    q0, _ = rope(q, q, torch.tensor([3]))
    _, k0 = rope(k, k, torch.tensor([0]))
    assert (q0 * k0).sum().item() != pytest.approx(scores[0], abs=1e-6)  # another distance, another score


def test_rotate_half_and_batched_positions():
    x = torch.arange(4.0).view(1, 1, 1, 4)
    assert rotate_half(x).flatten().tolist() == [-2.0, -3.0, 0.0, 1.0]
    rope = RotaryEmbedding(4)
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8]])
    q, _ = rope(x, x, positions)
    for b in range(2):
        alone, _ = rope(x[b:b + 1], x[b:b + 1], positions[b])
        torch.testing.assert_close(q[b:b + 1], alone)


def literal_theta(kind, d, base, p, max_len=None, seq_len=None):
    """Each scaling's formula written out per frequency, in Python floats."""
    theta = [base ** (-2 * i / d) for i in range(d // 2)]
    f = p.get("factor", 1.0)
    if kind == "linear":
        return [t / f for t in theta]
    if kind == "dynamic":
        s = max(seq_len or 0, max_len)
        b = base * (f * s / max_len - (f - 1)) ** (d / (d - 2))
        return [b ** (-2 * i / d) for i in range(d // 2)]
    if kind == "llama3":
        L0, lo, hi = p["original_max_position_embeddings"], p["low_freq_factor"], p["high_freq_factor"]
        out = []
        for t in theta:
            w = 2 * math.pi / t
            if w < L0 / hi:
                out.append(t)
            elif w > L0 / lo:
                out.append(t / f)
            else:
                s = (L0 / w - lo) / (hi - lo)
                out.append((1 - s) * t / f + s * t)
        return out
    if kind == "yarn":
        L0 = p["original_max_position_embeddings"]
        dim = lambda r: d * math.log(L0 / (r * 2 * math.pi)) / (2 * math.log(base))  # noqa: E731
        low, high = max(math.floor(dim(32)), 0), min(math.ceil(dim(1)), d - 1)
        out = []
        for i, t in enumerate(theta):
            ramp = min(max((i - low) / (high - low), 0.0), 1.0)
            out.append(t / f * ramp + t * (1 - ramp))
        return out
    return theta


CASES = [
    ("default", {}),
    ("linear", {"factor": 4.0}),
    ("dynamic", {"factor": 2.0}),
    ("yarn", {"factor": 4.0, "original_max_position_embeddings": 64}),
    ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
]


@pytest.mark.parametrize("kind,params", CASES)
def test_scalings_match_their_formula(kind, params):
    d, base, max_len = 64, 10000.0, 128
    for seq_len in (None, 500):
        theta, factor = rope_frequencies(d, base, {"rope_type": kind, **params}, max_len=max_len, seq_len=seq_len)
        expected = torch.tensor(literal_theta(kind, d, base, params, max_len, seq_len), dtype=torch.float64)
        torch.testing.assert_close(theta, expected, rtol=1e-12, atol=0)
        assert factor == (0.1 * math.log(4.0) + 1 if kind == "yarn" else 1.0)
    if kind == "dynamic":  # beyond max_len the frequencies fall; within it they are the default ones
        assert rope_frequencies(d, base, {"rope_type": kind, **params}, max_len=max_len, seq_len=500)[0][-1] < \
            rope_frequencies(d, base, None)[0][-1]
    if kind == "llama3":  # the three bands all occur at these sizes
        plain = rope_frequencies(d, base)[0]
        ratio = (theta / plain).tolist()
        assert ratio[0] == 1.0 and ratio[-1] == pytest.approx(1 / 8) and any(1 / 8 < r < 1 for r in ratio)


@pytest.mark.parametrize("kind,params", CASES)
def test_scalings_match_transformers(kind, params):
    transformers = pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    d, base, max_len = 64, 10000.0, 128
    config = LlamaConfig(hidden_size=4 * d, num_attention_heads=4, max_position_embeddings=max_len,
                         rope_parameters={"rope_type": kind, "rope_theta": base, **params})
    if kind == "default":
        theirs, their_factor = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        theirs, their_factor = ROPE_INIT_FUNCTIONS[kind](config, None)
    ours, our_factor = rope_frequencies(d, base, check_rope_scaling(config.rope_parameters), max_len=max_len)
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=1e-6, atol=0)
    assert our_factor == pytest.approx(their_factor, rel=1e-12)
    # their rotary module's cos/sin, for positions past the scaling's lengths
    rotary = LlamaRotaryEmbedding(config)
    positions = torch.tensor([[0, 1, 63, 200]])
    cos, sin = rotary(torch.zeros(1, 4, d), positions)
    ours_cos, ours_sin = RotaryEmbedding(d, base=base, scaling=config.rope_parameters, max_len=max_len).angles(
        positions, torch.float32)
    torch.testing.assert_close(ours_cos[:, 0], cos, rtol=0, atol=2e-5)
    torch.testing.assert_close(ours_sin[:, 0], sin, rtol=0, atol=2e-5)


def test_bad_scalings_are_refused_in_one_line():
    with pytest.raises(ValueError, match="rope_type must be one of"):
        check_rope_scaling({"rope_type": "longrope", "factor": 2.0})
    with pytest.raises(ValueError, match=r"needs \['factor'\]"):
        check_rope_scaling({"rope_type": "linear"})
    with pytest.raises(ValueError, match="unknown"):
        check_rope_scaling({"rope_type": "linear", "factor": 2.0, "beta_fast": 3})
    with pytest.raises(ValueError, match="factor must be"):
        check_rope_scaling({"rope_type": "linear", "factor": 0.5})
    with pytest.raises(ValueError, match="d must be even"):
        rope_frequencies(7)
    with pytest.raises(ValueError, match="rope_theta"):
        RotaryEmbedding(8, base=0.5)
    with pytest.raises(TypeError, match="positions"):
        RotaryEmbedding(8)(torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 8), torch.zeros(2))


def test_gradients_flow_through_the_rotation():
    rope = RotaryEmbedding(4)
    q = torch.randn(1, 1, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: rope(x, x, torch.arange(3))[0], (q,))


def test_angles_are_reused_for_the_same_positions_tensor_only():
    rope = RotaryEmbedding(8)
    positions = torch.arange(5)
    cos, sin = rope.angles(positions, torch.float32)
    again = rope.angles(positions, torch.float32)
    assert again[0] is cos and again[1] is sin  # the layers of one pass share the stack's positions
    assert rope.angles(torch.arange(5), torch.float32)[0] is not cos  # another tensor: computed anew
    assert rope.angles(positions, torch.float64)[0].dtype == torch.float64
    positions.add_(3)  # changed in place: its version moved on
    shifted, _ = rope.angles(positions, torch.float32)
    torch.testing.assert_close(shifted, RotaryEmbedding(8).angles(torch.arange(3, 8), torch.float32)[0])
    with torch.inference_mode():
        inside, _ = rope.angles(positions, torch.float32)
    assert inside is not shifted and rope.angles(positions, torch.float32)[0] is not inside  # no inference tensor in autograd
