#!/usr/bin/env bash
# One device call: CUDA tests, the `zerolaunch train` path, then bench/run.py side by side.
#   bash bench/gpu_check.sh SIZES ENGINES     (wheels for DeepSpeed in .whl/: bash bench/fetch_wheels.sh)
set -o pipefail
SIZES=${1:-350m}; ENGINES=${2:-torch,fsdp2,ds-z2,zl-z1,zl-z2,zl-z3}; OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 DS_BUILD_OPS=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
# the tests with CUDA cases (skipped or CPU-only elsewhere): ~65 s on an H100
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/dist/test_nonfinite_grads.py tests/dist/test_zero12_cuda.py \
  tests/dist/test_zero3_cuda.py tests/dist/test_zero_overlap_step.py tests/dist/test_zero3_gather_from_master.py \
  tests/unit/test_grad_segments.py tests/unit/test_boundary_sync.py 2>&1 | tee "$OUT/cuda-tests.txt" | tail -4
for size in ${SIZES//,/ }; do
  timeout 200 python3 -m zerolaunch train "recipes/gpt-$size.yaml" --gpus 1 --set train.steps=30 --set train.log_every=1 \
    --run-dir "/tmp/train-$size" > "$OUT/train-$size.txt" 2>&1; echo "train rc=$?"
  python3 bench/train_path.py "/tmp/train-$size" | tee -a "$OUT/train-path.txt"
done
timeout 420 python3 bench/run.py --sizes "$SIZES" --engines "$ENGINES" --steps 10 --warmup 3 \
  --json-out "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt" | grep -v "^\[" 
