"""MultiHeadAttention's fused input projection: ``[Q K V] = x [W^Q W^K W^V]`` as one product read
from q/k/v weights laid out side by side, equal to three separate projections."""

import copy
import io
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qkv
from qkv import masks


def separate(mha, query, key=None, value=None, mask=None):
    """The unfused reference: one ``F.linear`` per projection, through the same kernel."""
    key = query if key is None else key
    value = key if value is None else value
    q, k, v = (mha._split(F.linear(x, p.weight, p.bias))
               for x, p in ((query, mha.q_proj), (key, mha.k_proj), (value, mha.v_proj)))
    return mha._merge(mha.kernel(q, k, v, mask=mask)).output


def packed(mha):
    """q/k/v weights (and biases) side by side in one storage, in that order."""
    for name in ("weight", "bias"):
        ts = [getattr(p, name) for p in (mha.q_proj, mha.k_proj, mha.v_proj)]
        if ts[0] is None:
            continue
        if len({t.untyped_storage().data_ptr() for t in ts}) != 1:
            return False
        if [t.storage_offset() for t in ts] != [ts[0].storage_offset() + i * ts[0].numel() for i in range(3)]:
            return False
    return True


def build(d=16, h=4, dtype=torch.float32, seed=0, **kw):
    torch.manual_seed(seed)
    mha = qkv.MultiHeadAttention(d, h, **kw).to(dtype)
    with torch.no_grad():  # biases away from zero, so that a lost bias shows
        for p in (mha.q_proj, mha.k_proj, mha.v_proj):
            p.bias.normal_() if p.bias is not None else None
    return mha


def test_weights_are_packed_and_state_dict_names_unchanged():
    mha = build()
    assert packed(mha)
    assert list(mha.state_dict()) == ["q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight",
                                      "v_proj.bias", "out_proj.weight", "out_proj.bias"]
    assert all(isinstance(p, nn.Parameter) and p.is_leaf for p in mha.parameters())
    assert sum(p.numel() for p in mha.parameters()) == 4 * (16 * 16 + 16)  # no extra parameter or copy


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("causal,with_mask", [(False, False), (False, True), (True, False)])
def test_fused_equals_separate_float32_and_float64(bias, causal, with_mask):
    for dtype, tol in ((torch.float32, 1e-6), (torch.float64, 1e-12)):
        mha = build(bias=bias, causal=causal, dtype=dtype)
        x = torch.randn(3, 7, 16, dtype=dtype)
        mask = masks.padding_mask(torch.tensor([7, 4, 1]), 7) if with_mask else None
        with torch.no_grad():
            expected = separate(mha, x, mask=mask)
            for out in (mha(x, mask=mask).output, mha(x, x, x, mask=mask).output, mha(x, x, mask=mask).output):
                torch.testing.assert_close(out, expected, atol=tol, rtol=tol)
        torch.testing.assert_close(mha(x, mask=mask).output, expected, atol=tol, rtol=tol)  # grad mode: three products


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_gradients_flow_to_every_projection_as_without_fusion(dtype, tol):
    mha = build(dtype=dtype)
    ref = copy.deepcopy(mha)
    x = torch.randn(2, 6, 16, dtype=dtype, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    mha(x).output.pow(2).sum().backward()
    separate(ref, x_ref).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, atol=tol, rtol=tol)
    for (name, p), p_ref in zip(mha.named_parameters(), ref.parameters()):
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        torch.testing.assert_close(p.grad, p_ref.grad, atol=tol, rtol=tol, msg=name)


def test_training_steps_match_separate_projections_and_stay_packed():
    mha, ref = build(dtype=torch.float64), build(dtype=torch.float64)
    opt, opt_ref = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (mha, ref))
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    for _ in range(3):
        for model, o, forward in ((mha, opt, lambda: mha(x).output), (ref, opt_ref, lambda: separate(ref, x))):
            o.zero_grad()
            forward().pow(2).mean().backward()
            o.step()
    for p, p_ref in zip(mha.parameters(), ref.parameters()):
        torch.testing.assert_close(p, p_ref, atol=1e-12, rtol=1e-12)
    assert packed(mha)  # the optimizer updates in place
    with torch.no_grad():  # and the no-grad product reads the updated weights
        torch.testing.assert_close(mha(x).output, separate(mha, x), atol=1e-12, rtol=1e-12)


def test_no_grad_product_reads_the_weights_as_they_are_now():
    """No cached copy: every in-place change (even through ``.data``, which autograd's version
    counter does not see) is what the next call computes with."""
    mha = build()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        before = mha(x).output
        mha.k_proj.weight.data.mul_(2.0)
        mha.v_proj.bias.data.add_(1.0)
        after = mha(x).output
        assert not torch.allclose(before, after)
        torch.testing.assert_close(after, separate(mha, x), atol=1e-6, rtol=1e-6)


def test_replaced_parameters_still_compute_correctly():
    mha = build()
    x = torch.randn(2, 5, 16)
    mha.v_proj.weight = nn.Parameter(torch.randn(16, 16))  # no longer beside the others
    assert not packed(mha)
    with torch.no_grad():
        torch.testing.assert_close(mha(x).output, separate(mha, x), atol=1e-6, rtol=1e-6)
    other = build(seed=1)
    other.load_state_dict(mha.state_dict(), assign=True)
    with torch.no_grad():
        torch.testing.assert_close(other(x).output, separate(mha, x), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("how", ["double", "deepcopy", "pickle", "torch.save"])
def test_conversions_and_copies_keep_the_weights_packed(how):
    mha = build()
    x = torch.randn(2, 5, 16)
    if how == "double":
        other, x = mha.double(), x.double()
    elif how == "deepcopy":
        other = copy.deepcopy(mha)
    elif how == "pickle":
        other = pickle.loads(pickle.dumps(mha))
    else:
        buffer = io.BytesIO()
        torch.save(mha, buffer)
        buffer.seek(0)
        other = torch.load(buffer, weights_only=False)
    assert packed(other)
    with torch.no_grad():
        torch.testing.assert_close(other(x).output, separate(other, x), atol=1e-6, rtol=1e-6)


def test_cross_attention_projects_keys_and_values_together():
    mha = build(dtype=torch.float64)
    x, memory = torch.randn(2, 4, 16, dtype=torch.float64), torch.randn(2, 9, 16, dtype=torch.float64)
    with torch.no_grad():
        k, v = mha.project_kv(memory)
        torch.testing.assert_close(k, mha._split(mha.k_proj(memory)), atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(v, mha._split(mha.v_proj(memory)), atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(mha(x, memory).output, separate(mha, x, memory), atol=1e-12, rtol=1e-12)


def test_unfusable_projections_are_left_alone():
    """Quaternion projections, other key/value sizes and shared-QK kernels: no packing, the
    separate projections as before."""
    quaternion = qkv.MultiHeadAttention(16, 4, linear=qkv.blocks.QuaternionLinear)
    kdim = qkv.MultiHeadAttention(16, 4, kdim=8, vdim=8)
    lsh = qkv.MultiHeadAttention(16, 4, attention="lsh", bucket_size=2, n_rounds=1)
    for mha in (quaternion, kdim, lsh):
        assert mha._in_proj_params((mha.q_proj, mha.k_proj, mha.v_proj)) is None
    x = torch.randn(2, 4, 16)
    with pytest.raises(ValueError, match="kdim"):  # the boundary's message, not a matmul error
        kdim(x)
    assert quaternion(x).output.shape == (2, 4, 16)


def test_bert_save_and_load_round_trip_keeps_names_and_values(tmp_path):
    from qkv.models import BERT, BERTConfig

    torch.manual_seed(0)
    model = BERT(BERTConfig(n_layers=2, d_model=16, n_heads=2, d_ff=32, vocab_size=50, max_len=16, dropout=0.0,
                            attention_dropout=0.0)).eval()
    assert all(packed(block.self_attn) for block in model.stack.layers)
    model.save_pretrained(tmp_path)
    loaded = BERT.from_pretrained(tmp_path).eval()
    assert list(loaded.state_dict()) == list(model.state_dict())
    ids = torch.randint(50, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, attention_mask=mask).hidden, model(ids, attention_mask=mask).hidden,
                                   atol=0, rtol=0)


def test_no_grad_joined_views_are_found_once_and_found_again_after_any_change(monkeypatch):
    """Without a gradient the joined weight views are kept between calls (a decoding step calls
    once per layer and token); replacing a parameter, its ``.data`` or a projection, a hook on a
    projection, or a conversion is seen at the next call."""
    mha = build()
    x = torch.randn(2, 5, 16)
    looked_up = []
    find = type(mha)._in_proj_params
    monkeypatch.setattr(type(mha), "_in_proj_params", lambda self, projs: looked_up.append(1) or find(self, projs))
    with torch.no_grad():
        mha(x)
        mha(x)
        assert len(looked_up) == 1  # found once, then reused
        torch.testing.assert_close(mha(x).output, separate(mha, x), atol=1e-6, rtol=1e-6)

        mha.k_proj.weight.data = torch.randn(16, 16)  # a new storage under the same Parameter
        torch.testing.assert_close(mha(x).output, separate(mha, x), atol=1e-6, rtol=1e-6)
        mha._pack_in_proj()
        torch.testing.assert_close(mha(x).output, separate(mha, x), atol=1e-6, rtol=1e-6)

        mha.q_proj.bias = nn.Parameter(torch.randn(16))  # a new Parameter
        torch.testing.assert_close(mha(x).output, separate(mha, x), atol=1e-6, rtol=1e-6)

        mha.v_proj = nn.Linear(16, 16)  # a new projection
        torch.testing.assert_close(mha(x).output, separate(mha, x), atol=1e-6, rtol=1e-6)

        mha._pack_in_proj()
        mha(x)
        handle = mha.v_proj.register_forward_hook(lambda module, args, out: out * 0)  # the hook must run
        hooked = mha(x).output  # every value zero: only the output projection's bias is left
        handle.remove()
        torch.testing.assert_close(hooked, mha.out_proj.bias.expand_as(hooked), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(mha(x).output, separate(mha, x), atol=1e-6, rtol=1e-6)

        other = mha.double()
        torch.testing.assert_close(other(x.double()).output, separate(other, x.double()), atol=1e-12, rtol=1e-12)
    # with a gradient: three products, gradients reach every projection
    out = mha(x.double()).output.sum()
    out.backward()
    assert all(p.grad is not None for p in (mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight))


def test_training_makes_three_products_and_no_concatenation():
    """With gradients to the weights, one product would need the weights concatenated and its
    output gradient concatenated back: the three projections are cheaper, so no ``cat`` runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    mha = build()
    x = torch.randn(2, 5, 16, requires_grad=True)
    with Ops() as ops:
        mha(x).output.sum().backward()
    assert "cat" not in ops.names and ops.names.count("addmm") == 4, ops.names  # q, k, v, out
    with torch.no_grad(), Ops() as ops:
        mha(x)
    assert ops.names.count("addmm") == 2 and "cat" not in ops.names, ops.names  # [Q K V], out
