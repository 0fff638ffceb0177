#!/usr/bin/env bash
# The digits job under torchrun on one machine: 1 head + buffer + reward + rollout + 2 trainer ranks = 6 ranks.
# With --max-restarts, a failed rank restarts the job, which resumes from its last checkpoint (docs/launch.md).
#
#   bash examples/launch/torchrun.sh                              # one node
#   NNODES=2 MASTER_ADDR=host0 bash examples/launch/torchrun.sh   # two nodes (3 ranks each; c10d assigns node ranks): see below
set -euo pipefail
cd "$(dirname "$0")/../.."
NNODES=${NNODES:-1}
NPROC=$(( 6 / NNODES ))
if [ "$NNODES" -gt 1 ]; then
  # c10d rendezvous: every node restarts together, the head may land on any node; the run dir must be shared
  RDZV=(--nnodes "$NNODES" --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR:?set MASTER_ADDR}:29400"
        --rdzv-id "${RDZV_ID:-slime-digits}")
else
  RDZV=(--standalone)
fi
exec .venv/bin/torchrun "${RDZV[@]}" --nproc-per-node "$NPROC" --max-restarts 2 \
  -m slime_actors.launch.torchrun --config examples/digits/config.toml \
  --actor-num-gpus-per-node 2 --num-rollout 20 --run-dir runs/digits-torchrun \
  --save runs/digits-torchrun/ckpt --save-interval 5 "$@"
