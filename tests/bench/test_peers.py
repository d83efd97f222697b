"""``qkv bench peers``: the weight-copy cross-checks against the peer libraries, and the command.

The cross-checks run for every peer that is installed (``pip install -e .[peers]``) and every qkv
kernel that exists; the others skip with the reason. Sizes are small: the function is the same at
any length, and odd lengths exercise the padding of both sides.
"""

import importlib.util
import json
import sys

import pytest
import torch

from qkv.bench import main
from qkv.bench import peers

SAME_FUNCTION = ["mha", "window", "window-causal", "linear", "linear-causal", "performer", "performer-causal",
                 "linformer", "gated-deltanet-fla-naive", "gla-fla-naive", "deltanet-fla-naive", "retention-fla-naive"]
FLA_NAIVE = ["gated-deltanet-fla-naive", "gla-fla-naive", "deltanet-fla-naive", "retention-fla-naive"]


def _case_or_skip(name: str, L: int, **kw):
    reason = peers.available(peers.PAIRS[name])
    if reason is not None:
        pytest.skip(reason)
    return peers.build_case(peers.PAIRS[name], L, **kw)


@pytest.mark.peers
@pytest.mark.parametrize("name", SAME_FUNCTION)
@pytest.mark.parametrize("L", [64, 101])
def test_same_weights_same_outputs_and_gradients(name, L):
    """qkv and the peer, holding the same weights / features, agree on outputs and input gradients."""
    torch.manual_seed(0)
    # float64 where the peer takes it; linformer's module and fast-transformers' compiled causal
    # product are float32 only.
    dtype = torch.float32 if name in ("linformer", "linear-causal") else torch.float64
    case = _case_or_skip(name, L, B=2, H=2, E=16, dtype=dtype)
    assert case.same_function
    diffs = peers.compare(case, backward=True)
    tol = max(case.tolerance, 1e-5)
    assert diffs["max_rel_diff"] <= tol, diffs
    assert diffs["max_rel_grad_diff"] <= 10 * tol, diffs


@pytest.mark.peers
def test_window_cross_check_would_catch_an_off_by_one():
    """The window check is sharp: radius w - 1 against the peer's window w disagrees."""
    wide = _case_or_skip("window-causal", 200, B=1, H=1, E=8, dtype=torch.float64)  # radius 128
    q, k, v = wide.inputs
    narrower = peers.build_attention("window", radius=127, causal=True)
    with torch.no_grad():
        assert (wide.qkv() - wide.peer()).abs().max().item() < 1e-10
        assert (narrower(q, k, v).output - wide.peer()).abs().max().item() > 1e-3


@pytest.mark.peers
def test_performer_check_sees_the_features():
    """Different random features give a different function: the check is not vacuous."""
    case = _case_or_skip("performer", 64, B=1, H=1, E=16, dtype=torch.float64)
    good = peers.compare(case, backward=False)["max_rel_diff"]
    kernel = case.qkv.__closure__  # the qkv side reads its kernel's projection buffer
    ours = next(c.cell_contents for c in kernel if isinstance(c.cell_contents, torch.nn.Module))
    ours.projection = torch.randn_like(ours.projection)
    bad = peers.compare(case, backward=False)["max_rel_diff"]
    assert good < 1e-6 < 1e-2 < bad


@pytest.mark.peers
def test_fla_naive_loads_the_reference_file_without_the_fla_package():
    """fla's naive references come from their files: fla/__init__ (which imports triton) does not run."""
    if importlib.util.find_spec("fla") is None:
        pytest.skip("fla-core not installed; pip install fla-core==0.6.0")
    had_fla = "fla" in sys.modules
    peers.fla_naive.cache_clear()
    module = peers.fla_naive("gla")
    assert module.__name__ == "qkv_fla_naive_gla" and callable(module.naive_recurrent_gla)
    assert ("fla" in sys.modules) == had_fla
    with pytest.raises(ModuleNotFoundError, match="no_such_op"):
        peers.fla_naive("no_such_op")


def test_fla_naive_pairs_without_fla_core_are_skipped_with_the_reason(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    peers.fla_naive.cache_clear()
    try:
        with pytest.raises(ModuleNotFoundError, match="fla-core is not installed"):
            peers.fla_naive("gla")
        for name in FLA_NAIVE:
            reason = peers.available(peers.PAIRS[name])
            assert reason is not None and "fla-core==0.6.0" in reason, reason
    finally:
        peers.fla_naive.cache_clear()


@pytest.mark.peers
def test_fla_naive_pairs_run_end_to_end(tmp_path):
    """The four pairs through the command, tiny: checked equal, then timed."""
    for name in FLA_NAIVE:
        if (reason := peers.available(peers.PAIRS[name])) is not None:
            pytest.skip(reason)
    out = tmp_path / "peers"
    assert main(["peers", "--pairs", *FLA_NAIVE, "--lengths", "21", "--heads", "2", "--head-dim", "8",
                 "--target-seconds", "0", "--threads", "1", "--out", str(out)]) == 0
    rows = json.loads((out / "peers.json").read_text())["rows"]
    assert sorted((r["pair"], r["mode"]) for r in rows) == sorted((p, m) for p in FLA_NAIVE for m in ("fwd", "fwd+bwd"))
    assert all(r["max_rel_diff"] < 1e-5 and r["max_rel_grad_diff"] < 1e-5 for r in rows), rows


def test_absent_peer_is_listed_with_its_reason(monkeypatch, capsys, tmp_path):
    fake = peers.Pair("fake", "softmax", "not-a-package==0", "qkv_no_such_module", peers.PAIRS["mha"].build, "x")
    monkeypatch.setitem(peers.PAIRS, "fake", fake)
    reason = peers.available(fake)
    assert reason is not None and "qkv_no_such_module" in reason and "not-a-package==0" in reason
    missing_kernel = peers.Pair("nokernel", "no-such-kernel", "torch", "torch", peers.PAIRS["mha"].build, "x")
    assert "no-such-kernel" in peers.available(missing_kernel)


def test_quick_run_writes_tables(tmp_path, capsys):
    """End to end on the pair that needs no extra (torch's own MultiheadAttention)."""
    out = tmp_path / "peers"
    assert main(["peers", "--quick", "--pairs", "mha", "--lengths", "16", "32", "--heads", "2", "--head-dim", "8",
                 "--target-seconds", "0", "--threads", "1", "--out", str(out)]) == 0
    results = json.loads((out / "peers.json").read_text())
    rows = results["rows"]
    assert [(r["length"], r["mode"]) for r in rows] == [(16, "fwd"), (16, "fwd+bwd"), (32, "fwd"), (32, "fwd+bwd")]
    for r in rows:
        assert r["qkv_ms"] > 0 and r["peer_ms"] > 0 and r["ratio"] == pytest.approx(r["qkv_ms"] / r["peer_ms"])
        assert r["max_rel_diff"] < 1e-5
    text = (out / "peers.md").read_text()
    assert "| mha | 16 | fwd |" in text and "machine:" in text
    assert (out / "peers.png").stat().st_size > 0


def test_disagreeing_functions_are_refused(monkeypatch, tmp_path):
    """A pair that claims the same function but computes another is an error, not a timing."""
    build = peers.PAIRS["mha"].build

    def wrong(L, **kw):
        case = build(L, **kw)
        inner = case.peer
        case.peer = lambda: inner() * 1.1
        return case

    monkeypatch.setitem(peers.PAIRS, "mha", peers.Pair("mha", "softmax", "torch", "torch", wrong, "x"))
    with pytest.raises(RuntimeError, match="disagree"):
        main(["peers", "--pairs", "mha", "--lengths", "16", "--heads", "1", "--head-dim", "4",
              "--target-seconds", "0", "--threads", "1", "--out", str(tmp_path)])


def test_a_cuda_only_peer_is_skipped_on_the_cpu_with_the_reason(tmp_path, capsys):
    """``linear-causal-fla``'s peer is Triton: on the CPU the pair is listed as skipped, not run."""
    main(["peers", "--pairs", "linear-causal-fla", "--lengths", "64", "--modes", "fwd",
          "--target-seconds", "0.01", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "peers.json").read_text())
    assert result["rows"] == [] and "linear-causal-fla" in result["skipped"]
    assert "linear-causal-fla: skipped: the peer runs on CUDA only (--device cpu)" in capsys.readouterr().out


def test_list_gives_a_cuda_only_pair_the_reason_a_run_would(monkeypatch, capsys):
    """--list on the CPU says what a run says of the CUDA-only pair, even where its package is installed."""
    monkeypatch.setattr(peers, "available", lambda pair: None)  # as if every peer's package were there
    main(["peers", "--list"])
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")}
    assert "[skipped: the peer runs on CUDA only (--device cpu)]" in lines["linear-causal-fla"]
    assert lines["mha"].endswith("[ready]")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_linear_causal_equals_flash_linear_attention_on_cuda():
    """The fla pair is the same function: outputs and input gradients agree (float32 on the GPU, where
    fla's Triton products round like TF32: 1.4e-3 relative measured on an H200), and the check is sharp:
    a different feature map on the qkv side disagrees far beyond that."""
    case = _case_or_skip("linear-causal-fla", 300, B=2, H=2, E=64, dtype=torch.float32, device=torch.device("cuda"))
    diffs = peers.compare(case, backward=True)
    assert diffs["max_rel_diff"] <= case.tolerance and diffs["max_rel_grad_diff"] <= 2 * case.tolerance, diffs
    q, k, v = case.inputs
    other = peers.build_attention("linear", causal=True, feature_map=lambda x: torch.relu(x) + 1e-2)
    with torch.no_grad():
        assert (other(q, k, v).output - case.peer()).abs().max().item() > 10 * case.tolerance
