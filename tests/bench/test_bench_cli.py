"""``qkv bench complexity`` and ``qkv bench kernels`` end to end, with tiny sizes (no timed asserts)."""

import json

import pytest
import torch

from qkv.bench import BENCHMARKS, build_parser, main
from qkv.bench.complexity import kernel_kwargs, parse_kernel_kwargs


def test_main_restores_torch_threads(tmp_path):
    before = torch.get_num_threads()
    main(["kernels", "--kernel-sizes", "1x1x8x4", "--mha-sizes", "1x8x8x2", "--target-seconds", "0",
          "--threads", "1", "--out", str(tmp_path)])
    assert torch.get_num_threads() == before


def test_every_benchmark_follows_the_protocol():
    for name, module in BENCHMARKS.items():
        assert callable(module.add_arguments) and callable(module.run), name
    args = build_parser().parse_args(["complexity", "--quick"])
    assert args.out == "bench-out/complexity" and args.device == "cpu"


def test_complexity_quick_writes_results(tmp_path, capsys):
    out = tmp_path / "cx"
    assert main(["complexity", "--quick", "--attention", "softmax", "window", "--lengths", "32", "64", "128",
                 "--heads", "2", "--head-dim", "16", "--target-seconds", "0",
                 "--kernel-kwargs", "window:radius=8", "--budget-seconds", "1e6", "--threads", "1",
                 "--out", str(out)]) == 0
    results = json.loads((out / "complexity.json").read_text())
    assert set(results["kernels"]) == {"softmax", "window"}
    assert results["machine"]["torch"] and results["machine"]["cpu"]
    assert results["kernels"]["window"]["kwargs"] == {"radius": 8, "n_heads": 2}  # n_heads: sizes its sinks
    for rec in results["kernels"].values():
        assert [p["length"] for p in rec["points"]] == [32, 64, 128]
        assert all(p["peak_memory_bytes"] > 0 and p["time_median_s"] > 0 for p in rec["points"])
        assert rec["fit"]["lengths"] == [64, 128]
        assert set(rec["fit"]) == {"lengths", "time", "memory"}
    md = (out / "complexity.md").read_text()
    assert "machine:" in md and results["machine"]["cpu"] in md and "time exponent" in md
    assert (out / "complexity.png").stat().st_size > 1000
    assert "time exponent" in capsys.readouterr().out


def test_complexity_stops_at_memory_budget(tmp_path):
    out = tmp_path / "budget"
    main(["complexity", "--attention", "softmax", "--lengths", "32", "64", "128", "256", "--heads", "1",
          "--head-dim", "8", "--target-seconds", "0", "--budget-memory-mb", "0.012", "--budget-seconds", "1e6",
          "--threads", "1", "--no-plot", "--out", str(out)])
    rec = json.loads((out / "complexity.json").read_text())["kernels"]["softmax"]
    assert len(rec["points"]) < 4 and "MB" in rec["stopped"]


def test_kernels_quick_reports_ratios(tmp_path, capsys):
    out = tmp_path / "k"
    assert main(["kernels", "--kernel-sizes", "1x2x16x8", "--mha-sizes", "1x16x16x2", "--target-seconds", "0",
                 "--threads", "1", "--out", str(out)]) == 0
    results = json.loads((out / "kernels.json").read_text())
    assert len(results["rows"]) == 4  # (kernel, mha) x (non-causal, causal)
    for row in results["rows"]:
        assert row["ratio"] > 0 and row["ratio_of_min"] > 0 and row["max_abs_diff"] < 1e-4
    assert "ratio qkv/torch" in (out / "kernels.md").read_text()
    assert "ratio" in capsys.readouterr().out


def test_throughput_counts_flops_and_compares_patterns_with_a_dense_mask(tmp_path):
    from qkv.bench.throughput import attention_flops

    assert attention_flops(2, 3, 16, 8, causal=False, backward=False) == 4 * 2 * 3 * 16 * 16 * 8
    assert attention_flops(2, 3, 16, 8, causal=True, backward=True) == 3.5 * 4 * 2 * 3 * 16 * 16 * 8 / 2
    out = tmp_path / "t"
    assert main(["throughput", "--sizes", "1x2x32x8", "--pattern-lengths", "64", "--matmul-size", "32",
                 "--target-seconds", "0", "--threads", "1", "--out", str(out)]) == 0
    results = json.loads((out / "throughput.json").read_text())
    assert results["config"]["dtype"] == "float32" and results["matmul_peak"]["tflops"] > 0
    assert [(r["causal"], r["mode"]) for r in results["exact"]] == [
        (False, "fwd"), (False, "fwd+bwd"), (True, "fwd"), (True, "fwd+bwd")]
    assert [r["kernel"] for r in results["patterns"]] == ["strided", "fixed"]
    for row in results["patterns"]:  # the kernel and SDPA with the dense mask compute the same function
        assert row["path"] == "structured" and row["max_abs_diff"] < 1e-5 and 0 < row["density"] < 1
    assert "of matmul peak" in (out / "throughput.md").read_text()


def test_kernel_kwargs_parsing_and_defaults():
    assert parse_kernel_kwargs(["window:radius=128,block=64", "local-2d:image_size=(32,32)"]) == {
        "window": {"radius": 128, "block": 64}, "local-2d": {"image_size": (32, 32)}}
    assert kernel_kwargs("window", 1024, heads=4, head_dim=64) == {"radius": 64, "n_heads": 4}  # default_knobs (+ heads)
    assert kernel_kwargs("window", 1024, 4, 64, {"radius": 3}) == {"radius": 3, "n_heads": 4}
    assert kernel_kwargs("relative", 256, 4, 16) == {"n_heads": 4, "head_dim": 16}  # head arguments
    with pytest.raises(ValueError):
        parse_kernel_kwargs(["radius=3"])


@pytest.mark.parametrize("argv, message", [
    (["complexity", "--attention", "no-such-kernel"], "unknown attention"),
    (["complexity", "--attention", "softmax", "--kernel-kwargs", "window:radius=3"], "not among"),
    (["complexity", "--device", "tpu"], "--device"),
    (["kernels", "--mha-sizes", "1x8x10x3"], "divisible"),
    (["throughput", "--sizes", "1x2x3"], "four positive integers"),
])
def test_bad_arguments_exit_with_a_message(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(argv + ["--out", str(tmp_path)])
    assert exc.value.code == 2 and message in capsys.readouterr().err
