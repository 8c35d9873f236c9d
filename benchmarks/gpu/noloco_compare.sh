#!/usr/bin/env bash
# A reduced NoLoCo study on one GPU, within 8 minutes: llama-125m (the NoLoCo reference's smallest shape), M = 8
# replicas on the one GPU with the in-process backend (stepped in turn, exchanging through memory, on the simulated
# clock of the --network link), the built-in corpus (no download), DDP, DiLoCo (Nesterov 0.9 and heavy-ball 0.3)
# and NoLoCo, one seed, H = 20. The number of steps is sized from one timed step so that training fits the budget.
#
#   bash benchmarks/gpu/noloco_compare.sh             # on the GPU machine, after pip install -e .
#   bash benchmarks/gpu/noloco_compare.sh --dry-run   # the same path at tiny sizes on a CPU (the test suite runs it)
#
# Everything can be changed through the environment: OUT, BUDGET_S (seconds of training), MODEL, REPLICAS, SEQ_LEN,
# BATCH, H, SEEDS, METHODS, LR, DEVICE, and EXTRA (more flags for swarmlm noloco compare, e.g. a faster link:
# EXTRA="--network.latency-ms 10 --network.bandwidth-gbit 10"). Outputs: OUT/results.{json,md}, the plots, and
# OUT/environment.txt; the runs themselves under OUT/runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benchmarks/gpu/environment.sh
source benchmarks/gpu/environment.sh
PY=${PYTHON:-python}

OUT=${OUT:-runs/gpu-noloco-compare}
BUDGET_S=${BUDGET_S:-330}      # training; start-up, calibration, model builds and the report take the rest of 8 minutes
MODEL=${MODEL:-llama-125m}
REPLICAS=${REPLICAS:-8}
SEQ_LEN=${SEQ_LEN:-512}
BATCH=${BATCH:-8}
H=${H:-20}
SEEDS=${SEEDS:-0}
METHODS=${METHODS:-ddp,diloco,diloco-hb,noloco}
LR=${LR:-6e-4}                 # the NoLoCo reference's Adam lr for its 100M shape
DEVICE=${DEVICE:-cuda}
EVAL_BATCHES=${EVAL_BATCHES:-8}
THREADS=${THREADS:-4}
if [[ "${1:-}" == "--dry-run" ]]; then  # tiny sizes on a CPU: the same commands, end to end
    MODEL=nano-llama SEQ_LEN=16 BATCH=2 H=2 DEVICE=cpu BUDGET_S=0 EVAL_BATCHES=1 THREADS=1 LR=3e-3  # 0: the least, 2 outer steps
fi

started=$(date +%s)
mkdir -p "$OUT"
record_environment "$OUT" "$PY"

n_methods=$(tr ',' '\n' <<< "$METHODS" | grep -c .)
n_seeds=$(tr ',' '\n' <<< "$SEEDS" | grep -c .)
STEPS=$("$PY" benchmarks/gpu/noloco_budget.py --out "$OUT" --budget-s "$BUDGET_S" --model "$MODEL" --device "$DEVICE" \
    --seq-len "$SEQ_LEN" --batch-size "$BATCH" --replicas "$REPLICAS" --runs $((n_methods * n_seeds)) --every "$H")
WARMUP=$((STEPS / 10))
EVAL_EVERY=$(( (STEPS / 5) > 0 ? STEPS / 5 : 1 ))

# shellcheck disable=SC2086  # EXTRA is a list of flags
"$PY" -m swarmlm --log-level WARNING noloco compare --out "$OUT" --backend in_process --device "$DEVICE" \
    --model "$MODEL" --replicas "$REPLICAS" --seeds "$SEEDS" --methods "$METHODS" --outer.every "$H" \
    --steps "$STEPS" --seq-len "$SEQ_LEN" --batch-size "$BATCH" --inner.lr "$LR" --inner.warmup-steps "$WARMUP" \
    --eval-every "$EVAL_EVERY" --eval-batches "$EVAL_BATCHES" --threads "$THREADS" --jobs 1 --progress false ${EXTRA:-} \
    > "$OUT/compare.log" 2>&1 || { tail -50 "$OUT/compare.log"; exit 1; }
cat "$OUT/results.md"
echo "steps per replica: $STEPS; total time: $(( $(date +%s) - started )) s"
