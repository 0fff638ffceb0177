#!/usr/bin/env bash
# LoRA on one GPU (docs/lora.md): the LoRA-vs-full table of bench/lora.py for SmolLM2-135M-Instruct (and a larger
# model when MODEL_DIR names a Hugging Face directory), then the SmolLM2 addition run with LoRA and its report
# (scripts/smollm2_gpu_run.sh: held-out accuracy per evaluation, before/after responses, ten held-out responses).
# Everything lands in OUT (default runs/lora_gpu_out): bench.md, bench.json, and the run's report under smollm2/.
#
# Needs what scripts/smollm2_gpu_run.sh needs (its header: the model package, our dependencies, peft).
# Usage: [MODEL_DIR=/path/to/hf_model] [SMOL_STAGE=...] bash scripts/lora_gpu_run.sh [extra train flags...]
# Environment: OUT, LORA_RANK (16), LORA_LR (1e-4: ten times the full fine-tuning run's 1e-5), TRAIN_TIMEOUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/lora_gpu_out}
RANK=${LORA_RANK:-16}
LR=${LORA_LR:-1e-4}
mkdir -p "$OUT"
export PYTHONPATH="$PWD:${SITE:-/tmp/site}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# the learning run first: it installs what the machine lacks (.whl/, SMOL_STAGE) into $SITE
RUN_DIR=runs/smollm2_arith_lora OUT="$OUT/smollm2" \
  bash scripts/smollm2_gpu_run.sh --lora-rank "$RANK" --lr "$LR" "$@"
models=(smollm2)
[ -n "${MODEL_DIR:-}" ] && models+=("$MODEL_DIR")
python3 bench/lora.py --models "${models[@]}" --device cuda --bf16 --rank "$RANK" --batch 64 --length 256 \
  --json "$OUT/bench.json" > "$OUT/bench.md" 2> "$OUT/bench.log"
echo "bench exit $?"; cat "$OUT/bench.md"
# real SGLang serving the adapters (--enable-lora, /load_lora_adapter, lora_path), where the sglang package imports:
# three steps of the SmolLM2 job; the trainer-engine log-prob gap per step goes to sglang_logprob_diff.txt
if python3 -c "import sglang" 2>/dev/null; then
  timeout -k 15 900 python3 -m slime_actors.cli train --config examples/smollm2_arith/config.toml --device cuda \
    --rollout-engine sglang --lora-rank "$RANK" --lr "$LR" --num-rollout 3 --eval-interval 0 \
    --run-dir runs/smollm2_arith_lora_sglang > "$OUT/sglang_console.log" 2>&1
  echo "sglang lora run exit $?"
  python3 - > "$OUT/sglang_logprob_diff.txt" <<'PY'
import json
for line in open("runs/smollm2_arith_lora_sglang/metrics.jsonl"):
    m = json.loads(line)
    print(m["rollout_id"], m.get("weight_sync/bytes"), m.get("train/train_rollout_logprob_abs_diff"),
          m.get("train/train_rollout_logprob_abs_diff_max"))
PY
  cat "$OUT/sglang_logprob_diff.txt"
else
  echo "sglang is not importable here: the real-SGLang LoRA run is skipped"
fi
