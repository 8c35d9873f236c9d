#!/usr/bin/env bash
# The reduced SAPO sharing experiment (benchmarks/gpu/sapo_experiment.sh) with specialist nodes, on one GPU within 8
# minutes: SmolLM2-135M-Instruct, 3 nodes, node k drawing its own questions from family k of the default mix (chain_sum,
# basic_arithmetic, products), 8/0 against 4/4, one seed. The table adds each node's held-out pass@1 on the families
# it never draws itself, before the first update and at the end: what reached it only through sharing.
#
#   bash benchmarks/gpu/sapo_specialists.sh            # on the GPU machine
#   bash benchmarks/gpu/sapo_specialists.sh --dry-run  # tiny sizes on a CPU (the test suite runs it)
#
# The environment variables of sapo_experiment.sh apply (OUT, MODEL, ROUNDS, SEEDS, ...).
set -euo pipefail
export SCENARIO=specialists OUT=${OUT:-runs/gpu-sapo-specialists} NODES=${NODES:-3}
exec bash "$(dirname "$0")/sapo_experiment.sh" "$@"
