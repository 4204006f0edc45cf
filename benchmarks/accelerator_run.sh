#!/usr/bin/env bash
# BERT-Base/Large pretraining steps on a lent GPU, one table (benchmarks/accelerator_bench.py).
#
# In a session lent a GPU, the whole plan is ONE call of the device tool:
#
#   run(command="bash benchmarks/accelerator_run.sh", timeout_s=600)
#
# It prints nvidia-smi and the devices jax sees, then runs every row that fits the module's
# 480 s budget (--time_budget_s; rows that no longer fit are recorded as skipped) and writes
# results.md, results.json, rows.log and run.log to $OUT, which the tool brings back
# (out/accelerator where $OUT is unset). Flags pass through to the module, e.g.
#
#   run(command="bash benchmarks/accelerator_run.sh --sizes=large --seq_lens=512 --batch=16")
#
# The machine's own python3 (jax, CUDA plugin, torch, transformers; no TensorFlow, no
# ml_collections) runs it from the repository root: nothing is installed. $PYTHON picks another
# interpreter (here: PYTHON=.venv/bin/python bash benchmarks/accelerator_run.sh --sizes=tiny).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-out/accelerator}"
python="${PYTHON:-python3}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi
  fi
  "$python" -c 'import jax; print("jax", jax.__version__, jax.devices())'
  "$python" -m benchmarks.accelerator_bench --output_dir="$out" "$@"
} 2>&1 | tee "$out/run.log"
