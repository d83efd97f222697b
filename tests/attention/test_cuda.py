"""The CUDA suite (``pytest -m cuda``): every kernel on a GPU against the CPU, half precision, the
FlexAttention path of ``strided``/``fixed``/``window``/``local-1d``/``local-2d`` against their structured path, incremental decoding and
a model trained from the command line on the GPU. Skipped without CUDA (CI has none)."""

import pytest
import torch

import qkv
from qkv import masks
from qkv.attention import flex
from qkv.registry import lookup

from test_kernels import NAMES, build, can_causal

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DEV = "cuda"


@pytest.fixture(autouse=True)
def _exact_fp32():
    """fp32 matmuls in full precision (no TF32), so that GPU and CPU agree to fp32 rounding."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def tensors(B=2, H=3, M=13, N=13, E=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, L, E, generator=g).to(dtype) for L in (M, N, N))


def run(kernel, q, k, v, mask=None, need_weights=False):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = kernel(q, k, v, mask=mask, need_weights=need_weights)
    g = torch.Generator().manual_seed(1)
    out.output.backward(torch.randn(out.output.shape, generator=g).to(out.output))
    return out, (q.grad, k.grad, v.grad)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("causal", [False, True])
def test_every_kernel_on_cuda_equals_cpu_with_gradients(name, causal):
    if causal and not can_causal(name):
        pytest.skip(f"{name} cannot be causal")
    kernel = build(name, causal=causal, H=3, E=16)
    q, k, v = tensors()
    pad = masks.padding_mask(torch.tensor([9, 13]), 13) if kernel.supports_mask != "none" else None
    torch.manual_seed(0)
    cpu, cpu_grads = run(kernel, q, k, v, pad)
    torch.manual_seed(0)
    kernel_gpu = kernel.to(DEV)
    gpu, gpu_grads = run(kernel_gpu, q.to(DEV), k.to(DEV), v.to(DEV), None if pad is None else pad.to(DEV))
    torch.testing.assert_close(gpu.output.cpu(), cpu.output, atol=2e-5, rtol=2e-4)
    for a, b in zip(gpu_grads, cpu_grads):  # (shared-QK kernels read no keys: no gradient on either side)
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a.cpu(), b, atol=5e-5, rtol=5e-4)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_kernel_runs_in_half_precision_on_cuda(name, dtype):
    kernel = build(name, causal=can_causal(name), H=3, E=16).to(DEV)
    q, k, v = tensors()
    ref = kernel(q.to(DEV), k.to(DEV), v.to(DEV)).output
    half, grads = run(kernel, q.to(DEV, dtype), k.to(DEV, dtype), v.to(DEV, dtype))
    assert half.output.dtype == dtype
    assert all(torch.isfinite(g).all() for g in grads if g is not None)
    torch.testing.assert_close(half.output.float(), ref, atol=3e-2, rtol=3e-2)


# ----------------------------------------------------------------------------- FlexAttention

# (kernel, knobs, causal, M, N, key padding): each distinct pattern and shape is one compilation.
FLEX_CASES = [
    ("strided", {"stride": 16}, True, 300, 300, False),
    ("strided", {"stride": 16}, True, 300, 300, True),
    ("strided", {"stride": 16}, True, 77, 300, False),
    ("strided", {"stride": 16, "subsets": (2,)}, False, 300, 300, True),
    ("strided", {"stride": 12, "subsets": (1,)}, False, 1, 257, False),
    ("fixed", {"stride": 32, "c": 4}, True, 300, 300, True),
    ("fixed", {"stride": 32, "c": 4}, True, 1, 257, False),
    ("fixed", {"stride": 16, "c": 16, "subsets": (2,)}, False, 77, 300, False),
    ("window", {"radius": 20}, False, 300, 300, True),
    ("window", {"radius": 20}, True, 77, 300, False),
    ("local-1d", {"block": 32, "memory": 16}, True, 300, 300, True),
    ("local-1d", {"block": 32, "memory": 16}, False, 77, 300, False),
    ("local-2d", {"image_size": (16, 20), "block": (4, 8), "memory": (4, 8, 8)}, True, 300, 300, True),
    ("local-2d", {"image_size": (16, 20), "block": (4, 8), "memory": (4, 8, 8)}, False, 77, 300, False),
]


@pytest.mark.parametrize("name,kw,causal,M,N,padded", FLEX_CASES)
def test_flex_path_equals_structured_path_and_cpu(name, kw, causal, M, N, padded):
    if not flex.available():
        pytest.skip("FlexAttention does not import")
    kernel = qkv.build_attention(name, causal=causal, **kw)
    q, k, v = tensors(B=2, H=2, M=M, N=N, E=64, seed=M)
    mask = masks.padding_mask(torch.tensor([N - 37, N]), N) if padded else None
    gpu_in = [t.to(DEV) for t in (q, k, v)]
    gpu_mask = None if mask is None else mask.to(DEV)
    before = flex.calls
    fast, fast_grads = run(kernel, *gpu_in, gpu_mask)
    assert flex.calls == before + 1, "the FlexAttention path was not taken"
    with flex.disabled():
        slow, slow_grads = run(kernel, *gpu_in, gpu_mask)
    assert flex.calls == before + 1
    cpu, cpu_grads = run(kernel, q, k, v, mask)
    torch.testing.assert_close(fast.output, slow.output, atol=2e-5, rtol=2e-4)
    torch.testing.assert_close(fast.output.cpu(), cpu.output, atol=2e-5, rtol=2e-4)
    for a, b in zip(fast_grads, cpu_grads):
        torch.testing.assert_close(a.cpu(), b, atol=1e-4, rtol=1e-3)


def test_flex_path_rows_with_no_key_are_zero_and_bf16_matches():
    kernel = qkv.build_attention("strided", stride=16, causal=True)
    q, k, v = tensors(B=2, H=2, M=256, N=256, E=64)
    q, k, v = (t.to(DEV) for t in (q, k, v))
    none = torch.zeros(2, 256, dtype=torch.bool, device=DEV)
    none[1] = True
    out = kernel(q, k, v, mask=none).output
    assert (out[0] == 0).all() and torch.isfinite(out).all()
    before = flex.calls
    half = kernel(q.bfloat16(), k.bfloat16(), v.bfloat16()).output
    assert flex.calls == before + 1 and half.dtype == torch.bfloat16
    with flex.disabled():
        ref = kernel(q, k, v).output
    torch.testing.assert_close(half.float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("name,kw", [("strided", {"stride": 16}), ("fixed", {"stride": 16, "c": 2})])
@pytest.mark.parametrize("padded", [False, True])
def test_flex_program_compiles_once_for_a_shape(name, kw, padded):
    """strided / fixed run their parts and merge as one compiled graph: later calls of the same
    shape (new inputs, a new padding mask) reuse it instead of compiling again."""
    from torch._dynamo.utils import counters

    kernel = qkv.build_attention(name, causal=True, **kw)
    compiled = []
    for seed in range(3):
        q, k, v = (t.to(DEV).requires_grad_() for t in tensors(B=2, H=2, M=320, N=320, E=64, seed=seed))
        mask = masks.padding_mask(torch.tensor([320 - 7 * (seed + 1), 320]), 320).to(DEV) if padded else None
        before = flex.calls
        kernel(q, k, v, mask=mask).output.sum().backward()
        assert flex.calls == before + 1
        compiled.append(counters["stats"]["unique_graphs"])
    assert compiled[2] == compiled[1], f"compiled again for a call of the same shape: {compiled}"


def test_flex_path_not_taken_for_weights_dropout_or_odd_head_sizes():
    kernel = qkv.build_attention("fixed", stride=16, c=2, causal=True).to(DEV)
    q, k, v = (t.to(DEV) for t in tensors(M=64, N=64, E=64))
    before = flex.calls
    assert kernel(q, k, v, need_weights=True).weights.shape == (2, 3, 64, 64)
    q8, k8, v8 = (t.to(DEV) for t in tensors(M=64, N=64, E=8))
    kernel(q8, k8, v8)
    assert flex.calls == before


# ----------------------------------------------------------------------------- decoding and models


@pytest.mark.parametrize("name", [n for n in NAMES if lookup("attention", n).supports_state and can_causal(n)])
def test_incremental_decoding_on_cuda_equals_parallel(name):
    kernel = build(name, causal=True, H=3, E=16).to(DEV).eval()
    q, k, v = (t.to(DEV) for t in tensors(M=12, N=12))
    full = kernel(q, k, v).output
    state, outs = None, []
    for a, b in ((0, 5), (5, 6), (6, 12)):
        out = kernel(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], state=state, return_state=True)
        state = out.state
        outs.append(out.output)
    torch.testing.assert_close(torch.cat(outs, 2), full, atol=2e-5, rtol=2e-4)


def test_cli_trains_on_cuda_and_the_checkpoint_loads_on_cpu(tmp_path, shakespeare_cache, train_argv):
    from qkv.cli import main

    tiny = ["--set", "n_layers=1", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64", "--device", "cuda"]
    run_dir = tmp_path / "gpu-run"
    assert main(train_argv("gpt", "shakespeare-char", run_dir, *tiny, "--set", "task.block_size=16", steps=4)) == 0
    assert main(["eval", str(run_dir), "--max-examples", "8"]) == 0  # eval loads on the CPU
    assert main(train_argv("sparse-transformer", "shakespeare-char", tmp_path / "sparse", *tiny,
                           "--set", "task.block_size=64")) == 0
