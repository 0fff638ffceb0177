#!/usr/bin/env bash
# Re-make the recorded runs under tests/data/recordings/ (docs/debugging.md walks through them; tests/test_trace_cli.py and
# tests/test_replay.py read them). Run from the repository root:  bash tests/data/recordings/record.sh [NAME...]
# Each run is small (4 prompts x 4 samples per step, CPU, tiny model): ~30-60 s; only its trace files are kept,
# gzip-compressed (~60 KB a run).
# Flags are given on the command line (not in a config file) so the recorded paths stay relative to the
# repository root and a replay finds them in any checkout.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=tests/data/recordings
BIN=${BIN:-.venv/bin/slime-actors}
COMMON=(--hf-checkpoint tiny:digits --prompt-data examples/digits/train.jsonl --input-key input --label-key label
        --rollout-batch-size 4 --n-samples-per-prompt 4 --global-batch-size 16 --micro-batch-size 16
        --rollout-max-response-len 1 --rollout-temperature 1.0 --advantage-estimator grpo --clip-grad 1.0
        --rollout-num-engines 1 --num-reward-workers 1 --actor-num-gpus-per-node 1
        --heartbeat-interval 2 --use-tensorboard false --progress false)

record() {  # NAME FLAGS...
  local name=$1; shift
  local run=runs/recordings/$name
  echo "== $name"
  rm -rf "$run"   # (a run directory used before would hand on its old trace files)
  "$BIN" train --run-dir "$run" "${COMMON[@]}" "$@"
  rm -rf "$OUT/$name"
  mkdir -p "$OUT/$name"
  cp "$run"/traces/*.trace "$OUT/$name/"
  gzip -9 -n "$OUT/$name"/*.trace   # the reader reads NAME.trace.gz as it is (docs/trace-format.md)
  du -sh "$OUT/$name"
}

want=("$@")
[ ${#want[@]} -eq 0 ] && want=(small high-lr slow-reward)
for n in "${want[@]}"; do
  case $n in
    # the baseline: partial-credit reward, a sane learning rate
    small)       record small --num-rollout 3 --lr 3e-3 --custom-rm-path examples/debugging/rewards.py:partial_credit ;;
    # the same job with a learning rate 300x too high: the trainer diverges
    high-lr)     record high-lr --num-rollout 3 --lr 1.0 --custom-rm-path examples/debugging/rewards.py:partial_credit ;;
    # a reward function with a slow path (0.2 s whenever the answer is 9)
    slow-reward) record slow-reward --num-rollout 2 --lr 3e-3 --custom-rm-path examples/debugging/rewards.py:slow_partial_credit ;;
    *) echo "unknown recording $n (small, high-lr, slow-reward)"; exit 2 ;;
  esac
done
