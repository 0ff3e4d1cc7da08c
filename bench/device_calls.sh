#!/usr/bin/env bash
# The GPU work still owed to the one-GPU performance issue, as named steps that each fit inside one device call
# (10 minutes at most). Run on the device machine from the repository root, with DeepSpeed's wheels in .whl/
# (bash bench/fetch_wheels.sh here; carry .whl with the call):
#
#   END=570 bash bench/device_calls.sh tests tax-resident      # several steps, one call, within END seconds
#   DRY=1 bash bench/device_calls.sh all                       # print the commands, run nothing
#
# Steps: tests, tax-resident, tax-llama, train-path, longseq-gpt, longseq-llama, offload-peers, offload-z3,
# estimate-longseq (`all` = every one, in that order). Each step's command is cut at what is left of END, so a
# step that would overrun ends early and the rest are skipped, not lost: the call still returns its files. Logs
# and JSON go to $OUT/r, packed into $OUT/r.tgz at the end (one file comes back, whatever the step count).
set -o pipefail
STEPS=(tests tax-resident tax-llama train-path longseq-gpt longseq-llama offload-peers offload-z3 estimate-longseq)
[ $# -eq 0 ] && { echo "usage: bash bench/device_calls.sh STEP... (${STEPS[*]}, all)" >&2; exit 2; }
WANT=("$@"); [ "$1" = all ] && WANT=("${STEPS[@]}")
for s in "${WANT[@]}"; do
  [[ " ${STEPS[*]} " == *" $s "* ]] || { echo "unknown step '$s'; expected one of: ${STEPS[*]}, all" >&2; exit 2; }
done
OUT=${OUT:-/tmp/out}; END=${END:-570}; T0=$(date +%s); R=$OUT/r
left() { echo $((END - ($(date +%s) - T0))); }

# the tests with CUDA cases (skipped or CPU-only elsewhere)
CUDA_TESTS="tests/dist/test_zero12_cuda.py tests/dist/test_zero3_cuda.py tests/dist/test_zero3_gather_from_master.py
  tests/dist/test_zero3_frozen_cuda.py tests/dist/test_nonfinite_grads.py tests/dist/test_zero_overlap_step.py
  tests/unit/test_fused_step.py tests/unit/test_compute_dtype_grads.py tests/unit/test_bf16_master.py
  tests/unit/test_phase_names.py tests/unit/test_linear_ce.py tests/unit/test_activation_offload.py
  tests/unit/test_engine_freed.py"
LONGSEQ_AT="--set model.args.seq_len=16384 --set data.args.seq_len=16384 --set train.micro_batch_size=1"

# one step: NAME, the most seconds it may take, then its command (run through bash -c)
step() {
  local name=$1 cap=$2; shift 2
  if [ -n "$DRY" ]; then echo "$name: $*"; return; fi
  local budget=$(($(left) - 10)); [ "$budget" -gt "$cap" ] && budget=$cap
  if [ "$budget" -lt 40 ]; then echo "$name: skipped, $(left) s of the call left" | tee -a "$R/skipped.txt"; return; fi
  echo "== $name (up to $budget s): $*"
  timeout "$budget" bash -c "$*" > "$R/$name.txt" 2>&1
  echo "$name rc=$?"; grep -v '^\[' "$R/$name.txt" | grep -v '^RESULT' | tail -14
}

if [ -z "$DRY" ]; then
  mkdir -p "$R"
  if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
  fi
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 DS_BUILD_OPS=0
  # every row names its card and versions; a process already on the GPU would make the rows a shared run
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch; print('torch', torch.__version__)"
    echo "processes on the GPU before the steps:"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
  } 2>&1 | tee "$R/card.txt"
fi

for s in "${WANT[@]}"; do
  case $s in
    tests) step tests 180 python3 -m pytest -q -p no:cacheprovider $CUDA_TESTS ;;
    tax-resident) step tax-resident 240 python3 bench/engine_tax.py --rows torch-amp,zl-z3-resident,zl-z3 --timeout 110 --out "$R" ;;
    tax-llama) step tax-llama 240 python3 bench/engine_tax.py --model hf-llama --rows torch-bf16,zl-z2-bf16,zl-z3-bf16 --timeout 70 --out "$R" ;;
    train-path) step train-path 330 python3 bench/engine_tax.py --rows zl-gpt-z2-bf16,zl-train-z2-bf16 --timeout 160 --out "$R" ;;
    longseq-gpt) step longseq-gpt 560 python3 bench/longseq.py --models gpt-1.3b --rows zl,ds,fsdp2 --row-budget 100 --out "$R" ;;
    longseq-llama) step longseq-llama 560 python3 bench/longseq.py --models llama-8b --rows zl,ds,fsdp2 --row-budget 100 --out "$R" ;;
    offload-peers) step offload-peers 560 python3 bench/offload.py --rows ds-z2-off,fsdp2-off,zl-z2-off --warmup 1 --steps 2 --timeout 250 --budget 500 --out "$R" ;;
    offload-z3) step offload-z3 560 python3 bench/offload.py --rows zl-z3-off,zl-z2-off-ovl --timeout 250 --budget 500 --out "$R" ;;
    estimate-longseq)
      # estimate-memory --measure at 16k tokens with each long-sequence option (the built-in 1.3B GPT, ZeRO-3)
      for pair in "ckpt:train.activation_checkpointing=true" \
        "ckpt-chunk:train.activation_checkpointing=true model.args.loss_chunk=4096" \
        "ckpt-offload-chunk:train.activation_checkpointing=true train.activation_offload=true model.args.loss_chunk=4096"; do
        sets=""; for o in ${pair#*:}; do sets="$sets --set $o"; done
        step "estimate-${pair%%:*}" 180 python3 bench/estimate_vs_measured.py --recipe recipes/gpt-1.3b.yaml \
          --stages 3 --steps 3 $LONGSEQ_AT $sets
      done ;;
  esac
done
[ -z "$DRY" ] && (cd "$OUT" && tar czf r.tgz r && rm -rf r)
exit 0
