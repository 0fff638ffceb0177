#!/usr/bin/env bash
# Two trees of this project side by side on one GPU machine: the speed job of scripts/speed_gpu_run.sh for another
# checkout (OLD: a directory, e.g. made with `git worktree add ../old REF` or `git archive REF | tar -x -C ../old`) and
# for this one, alternating, ROUNDS runs each (the other tree first), in one invocation -- so both meet the same
# machine. Each run keeps its report (OUT/rN_old|new/compare/report.md, summary.json), `slime-actors trace summary`
# of each of our runs (trace_summary_<run>.txt) and the replies' waits for their askers' loops (waits_<run>.json);
# at the end one table of the runs: python -m scripts.compare_trl.ab OUT (written to OUT/ab.md too).
# Usage: OLD=DIR [ROUNDS=3] [OUT=runs/speed_ab] [OURS=sglang] [TF32=0] [BF16=0] \
#        bash scripts/speed_gpu_ab.sh [flags for speed_gpu_run.sh, e.g. --micro-batch 128 --no-trl --no-alone]
# Needs what scripts/speed_gpu_run.sh needs ($SITE with SGLang for OURS=sglang, the wheels, the model); the other
# tree runs with the same Python and $SITE.
set -uo pipefail
cd "$(dirname "$0")/.."
NEW=$PWD
OLD=${OLD:?set OLD to the directory of the other checkout}
if [ ! -f "$OLD/scripts/speed_gpu_run.sh" ]; then
  echo "speed_gpu_ab.sh: OLD=$OLD holds no scripts/speed_gpu_run.sh" >&2; exit 2
fi
ROUNDS=${ROUNDS:-3}
if ! [[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]]; then
  echo "speed_gpu_ab.sh: ROUNDS must be a whole number >= 1, got $ROUNDS" >&2; exit 2
fi
OUT=$(mkdir -p "${OUT:-runs/speed_ab}" && cd "${OUT:-runs/speed_ab}" && pwd)
if [ -x .venv/bin/python ]; then PY=$NEW/.venv/bin/python; else PY=python3; fi
n=0
for ((r = 1; r <= ROUNDS; r++)); do
  for which in old new; do
    n=$((n + 1)); dir=$OLD; [ "$which" = new ] && dir=$NEW
    run=$OUT/r${n}_$which
    echo "[speed_gpu_ab $(date -u +%H:%M:%S)] run $n of $((2 * ROUNDS)): $which tree ($dir) -> $run"
    (cd "$dir" && rm -rf runs/compare_trl && OUT="$run" OURS="${OURS:-sglang}" TF32="${TF32:-0}" BF16="${BF16:-0}" \
       bash scripts/speed_gpu_run.sh "$@" > "$run.log" 2>&1)
    echo "  exit $? ($(tail -n 1 "$run.log"))"
    mkdir -p "$run"
    for d in "$dir"/runs/compare_trl/ours-*/; do
      [ -d "$d/traces" ] || continue
      (cd "$NEW" && export PYTHONPATH="$NEW${PYTHONPATH:+:$PYTHONPATH}" \
         && "$PY" -m slime_actors.cli trace summary "$d" > "$run/trace_summary_$(basename "$d").txt" 2>&1 \
         ; "$PY" -m scripts.compare_trl.ab --waits "$d" "$run/waits_$(basename "$d").json")
    done
  done
done
(cd "$NEW" && PYTHONPATH="$NEW${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m scripts.compare_trl.ab "$OUT" | tee "$OUT/ab.md")
