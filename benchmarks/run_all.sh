#!/usr/bin/env bash
# Every benchmark of issue 7, in sequence (they must not run at the same time: each one times the machine).
# Usage: bash benchmarks/run_all.sh [LEGACY_PYTHON]   (default /work/venv435/bin/python when it exists; otherwise
# bench_causal_lm.py builds a transformers-4.35 venv under ~/.cache on first use). Results: benchmarks/results/*.json
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
LEGACY=${1:-/work/venv435/bin/python}
LEGACY_ARGS=()
if [ -x "$LEGACY" ]; then LEGACY_ARGS=(--legacy-python "$LEGACY"); fi
export PYTHONWARNINGS=ignore
lscpu | grep -E "Model name|^CPU\(s\)"
"$PYTHON" benchmarks/bench_causal_lm.py "${LEGACY_ARGS[@]}" --repeats 3 --bf16 --checkpointing
"$PYTHON" benchmarks/bench_activation_checkpointing.py --repeats 3
"$PYTHON" benchmarks/bench_eval_reuse.py --tgt-len 64 --output benchmarks/results/eval_reuse.json
"$PYTHON" benchmarks/bench_eval_reuse.py --tgt-len 128 --output benchmarks/results/eval_reuse_tgt128.json
"$PYTHON" benchmarks/bench_mfu.py --output benchmarks/results/mfu.json
"$PYTHON" benchmarks/bench_mfu.py --compile --output benchmarks/results/mfu_compiled.json
"$PYTHON" benchmarks/bench_plm.py
"$PYTHON" benchmarks/bench_data.py
