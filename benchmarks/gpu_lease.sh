#!/usr/bin/env bash
# Issue 41's checks for one short lease (at most 10 minutes on a fresh H100 / H200), rerunnable:
#     bash benchmarks/gpu_lease.sh [OUT_DIR]          (default bench-out/gpu-lease; needs a CUDA device)
# 1. the CUDA tests of what changed: the FlexAttention paths (strided / fixed parts and merge as one
#    compiled graph; window, local) against the structured path and the CPU, and the fla pair's check;
# 2. strided / fixed against SDPA with a dense mask of the same pattern at 4,096 and 16,384 (bf16);
# 3. causal linear attention against flash-linear-attention's Triton chunk kernel (bf16, fwd and fwd+bwd).
# The peer (fla-core, pyproject's `gpu-peers` extra) must be importable: where the machine has no
# package index, carry its wheel and put it on PYTHONPATH. `benchmarks/gpu.sh` holds every GPU table.
# On a fresh machine most of the time is compilation (inductor's FlexAttention kernels, fla's Triton
# autotuning): on 2026-11-27 the tests were cut at 200 s and the fla pair at 90 s cold, where a warm
# machine then needed 67 s and 50 s; the limits below leave room for a cold start.
set -u
OUT=${1:-bench-out/gpu-lease}
QKV="python -m qkv"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  python -c "import fla; print('fla-core', fla.__version__)"; } > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
timeout 300 python -m pytest -q -m cuda tests/attention/test_cuda.py tests/bench/test_peers.py -k "flex or fla" -n 8 \
  -p no:cacheprovider -W ignore > "$OUT/cuda-tests.log" 2>&1
tail -3 "$OUT/cuda-tests.log"
timeout 150 $QKV bench throughput --device cuda --sizes 1x16x4096x64 --pattern-lengths 4096 16384 --target-seconds 1 \
  --out "$OUT/throughput"
timeout 150 $QKV bench peers --device cuda --dtype bfloat16 --pairs linear-causal-fla --lengths 4096 16384 \
  --modes fwd fwd+bwd --target-seconds 0.5 --out "$OUT/peers-fla"
