#!/usr/bin/env bash
# Every GPU table of docs/benchmarks.md ("On a GPU"), and the CUDA test suite, in one command:
#     bash benchmarks/gpu.sh [OUT_DIR]          (default bench-out/gpu; needs a CUDA device)
# Each command has its own time limit, so that one slow comparison cannot hold up the rest. The peers
# (pyproject's `peers` extra) must be importable: where the machine has no package index, carry them
# as wheels (`pip download --no-deps` of each pin and its pure-Python needs) and put them on PYTHONPATH.
set -u
OUT=${1:-bench-out/gpu}
QKV="python -m qkv"
mkdir -p "$OUT"
python -m pytest -q -m cuda tests/attention/test_cuda.py -n 6 -p no:cacheprovider -W ignore 2>&1 | tee "$OUT/cuda-tests.log" | tail -3
timeout 300 $QKV bench throughput --device cuda --out "$OUT/throughput-bf16"
timeout 300 $QKV bench throughput --device cuda --dtype float32 --sizes 1x16x16384x64 --pattern-lengths 16384 \
  --target-seconds 1 --out "$OUT/throughput-fp32"
timeout 300 $QKV bench complexity --device cuda --dtype bfloat16 --attention softmax window strided fixed local-1d \
  local-2d linear performer linformer lsh efficient --lengths 1024 2048 4096 8192 16384 --target-seconds 0.3 \
  --budget-seconds 15 --out "$OUT/complexity-bf16"
timeout 300 $QKV bench complexity --device cuda --dtype bfloat16 --causal --attention softmax window strided fixed \
  local-1d --lengths 1024 4096 16384 --target-seconds 0.2 --budget-seconds 10 --out "$OUT/complexity-sparse-causal"
timeout 300 $QKV bench kernels --device cuda --dtype bfloat16 --target-seconds 0.5 --out "$OUT/kernels-bf16"
timeout 300 $QKV bench gpt --device cuda --dtype bfloat16 --target-seconds 5 --out "$OUT/gpt-bf16"
for pair in mha window window-causal performer performer-causal linformer lsh lsh-causal lsh-hf relative linear linear-causal linear-causal-fla; do
  timeout 120 $QKV bench peers --device cuda --dtype bfloat16 --pairs $pair --lengths 4096 16384 --modes fwd+bwd \
    --target-seconds 0.3 --out "$OUT/peers-$pair"
done
# Where lsh's, linformer's and BERT's GPU time goes (torch.profiler tables, qkv beside the peer)
timeout 120 python benchmarks/gpu_profile.py --pairs lsh linformer --length 16384 --bert 512 --out "$OUT"
# Whole models against transformers' GPT-2 and BERT with the same weights (float32; transformers' sdpa on both sides)
timeout 600 $QKV bench models --device cuda --lengths 512 2048 8192 --target-seconds 2 --out "$OUT/models"
# Long Range Arena at LRA's own lengths (ListOps 500-2,000, Text 4,096 bytes, Retrieval 2 x 4,000, Image 1,024,
# Pathfinder 32x32 hard), every encoder kernel, one seed; the page goes to $OUT/lra/lra.md (docs/reproductions/lra.md
# holds the CPU run).
timeout 1800 $QKV bench lra --device cuda --steps 500 --set listops.min_len=500 --set listops.max_len=2000 \
  --set bbc-bytes.max_len=4096 --set bbc-match.max_len=4000 --set fashion-mnist-seq.size=32 \
  --speed-lengths 1024 2048 3072 4096 --out "$OUT/lra" --report "$OUT/lra/lra.md"
