#!/usr/bin/env bash
# Issue 38's device run (one lease, at most 10 minutes on a fresh H100 / H200), rerunnable:
#     [PLAN=pairs] bash benchmarks/gpu_lra.sh [OUT_DIR] [DEADLINE_S]     (default bench-out/gpu-lra, 480 s; needs CUDA)
# Long Range Arena budgets the 2-core CPU cannot reach, every cell its own one-thread process, all at
# once on the one GPU (each cell's results in OUT/NAME/lra-results.json, its log in OUT/NAME.log):
# 1. Pathfinder 16 x 16 (the lra-budget setting: 3 dashes, 1 distractor of 2, a fixed set of 20,000
#    training images), softmax and linear, seeds 0 1 2, 12,000 updates of 32 (the CPU's 6,000 left
#    one seed in three at the prior);
# 2. ListOps at LRA's lengths (500-2,000 tokens) and LRA's 5,000 updates of 32, softmax, linear and
#    performer, seed 0;
# 3. Retrieval (bbc-match, 2 x 512 bytes), 8,000 updates of 32, softmax and linear, seed 0 (BBC News
#    from $QKV_DATA: carry it, the machine has no network).
# A cell still training at DEADLINE_S is killed and has no result (its log says how far it got).
# Pathfinder at LRA's 32 x 32 (14 dashes) is not here: drawing its images costs 23 ms each on one
# CPU core, 0.75 s per batch of 32, more than a whole update on the GPU.
# PLAN=pairs runs the second lease's sixteen cells instead (Retrieval with InferSent's |u-v| head):
# 4. Retrieval (bbc-match, 2 x 512 bytes), `--set model.pair_features=abs-diff`, 4,000 updates of 32:
#    softmax seeds 0-4, linear and performer seeds 0-2; softmax seeds 1 2 with LRA's head, the same budget;
# 5. Pathfinder 16 x 16 as in 1., softmax seeds 3 4 5.
# Overrides for a smoke run on the CPU: DEVICE=cpu PF_STEPS=20 LO_STEPS=5 RT_STEPS=5.
set -u
OUT=${1:-bench-out/gpu-lra}
DEADLINE=${2:-480}
DEVICE=${DEVICE:-cuda}
PF_STEPS=${PF_STEPS:-12000}
LO_STEPS=${LO_STEPS:-5000}
RT_STEPS=${RT_STEPS:-$([ "${PLAN:-budgets}" = pairs ] && echo 4000 || echo 8000)}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
: > "$OUT/done.txt"
CORES=$(nproc)
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
PF="--set pathfinder.size=16 --set pathfinder.contour_length=3 --set pathfinder.n_distractors=1
    --set pathfinder.distractor_length=2 --set pathfinder.train_size=20000"
LO="--set listops.min_len=500 --set listops.max_len=2000"

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"
  echo "$CORES cores"; } > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
(nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 10 > "$OUT/gpu-util.csv" 2>&1 &)

cell() {  # NAME then `qkv bench lra` options
  local name=$1; shift
  ( start=$(date +%s)
    timeout "$DEADLINE" $PY -m qkv bench lra --device "$DEVICE" --threads 1 --no-speed \
      --out "$OUT/$name" --report "$OUT/$name/lra.md" "$@" > "$OUT/$name.log" 2>&1
    echo "$name rc=$? seconds=$(( $(date +%s) - start ))" >> "$OUT/done.txt" ) &
}
if [ "${PLAN:-budgets}" = pairs ]; then
  AD="--set model.pair_features=abs-diff"
  for seed in 0 1 2 3 4; do
    cell "retrieval-ad-softmax-$seed" --tasks bbc-match --models softmax --seeds $seed $AD --steps "$RT_STEPS"
  done
  for kernel in linear performer; do
    for seed in 0 1 2; do
      cell "retrieval-ad-$kernel-$seed" --tasks bbc-match --models $kernel --seeds $seed $AD --steps "$RT_STEPS"
    done
  done
  for seed in 1 2; do
    cell "retrieval-lra-softmax-$seed" --tasks bbc-match --models softmax --seeds $seed --steps "$RT_STEPS"
  done
  for seed in 3 4 5; do
    cell "pf16-softmax-$seed" --tasks pathfinder --models softmax --seeds $seed $PF --steps "$PF_STEPS"
  done
else
  for kernel in softmax linear; do
    for seed in 0 1 2; do
      cell "pf16-$kernel-$seed" --tasks pathfinder --models $kernel --seeds $seed $PF --steps "$PF_STEPS"
    done
  done
  for kernel in softmax linear performer; do
    cell "listops2k-$kernel" --tasks listops --models $kernel --seeds 0 $LO --steps "$LO_STEPS"
  done
  for kernel in softmax linear; do
    cell "retrieval-$kernel" --tasks bbc-match --models $kernel --seeds 0 --steps "$RT_STEPS"
  done
fi
wait
pkill -f "nvidia-smi --query-gpu=timestamp" 2>/dev/null
cat "$OUT/done.txt"
