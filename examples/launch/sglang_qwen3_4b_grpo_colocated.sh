#!/usr/bin/env bash
# GRPO on Qwen3-4B, one node of 8 GPUs, colocated: 8 trainer ranks (torch DDP, bf16) and 8 SGLang engines share the
# GPUs (engine i on GPU i, --sglang-mem-fraction-static leaves the rest to training); weights go to the engines as
# CUDA IPC handles through /update_weights_from_tensor, serialized by SGLang's own serializer (trainer rank 0 posts to
# each engine directly: the payload is SGLang's, never an actor message). Engines are paused (abort) around updates
# in --async-train; here the loop is synchronous, so engines are idle during updates.
# Checked against SGLang 0.5.15.post1 (docs/sglang.md). The flags are slime's names (scripts/run-qwen3-4B.sh).
#
#   MODEL=path/to/Qwen3-4B DATA=path/to/dapo-math-17k.jsonl EVAL=path/to/aime-2024.jsonl bash examples/launch/sglang_qwen3_4b_grpo_colocated.sh
#   CHECK_ONLY=1 ...   parse and check every flag (--sglang-* against SGLang's ServerArgs when installed) and exit
#
# Not offloaded: SGLang keeps its weights and KV cache while the trainer runs (no release/resume of its memory), so
# memory is split by the fraction below. Needs sglang importable by the trainer ranks (the serializer).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${MODEL:?set MODEL: the Qwen3-4B directory (Hugging Face layout)}
DATA=${DATA:?set DATA: the training prompts (dapo-math-17k.jsonl)}
EVAL=${EVAL:?set EVAL: the held-out prompts (aime-2024.jsonl)}
RUN=${RUN:-runs/qwen3-4b-grpo-colocated}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} PYTHONUNBUFFERED=1

ARGS=(
  --run-dir "$RUN" --device cuda --num-gpus-per-node 8
  --hf-checkpoint "$MODEL" --save "$RUN/ckpt" --save-interval 20
  --prompt-data "$DATA" --input-key prompt --label-key label --apply-chat-template --rollout-shuffle
  --rm-type deepscaler --num-rollout 3000 --rollout-batch-size 32 --n-samples-per-prompt 8
  --rollout-max-response-len 8192 --rollout-temperature 1 --global-batch-size 256
  --eval-interval 20 --eval-prompt-data aime "$EVAL" --n-samples-per-eval-prompt 16 --eval-max-response-len 16384
  --advantage-estimator grpo --use-kl-loss --kl-loss-coef 0.00 --kl-loss-type low_var_kl --entropy-coef 0.00
  --eps-clip 0.2 --eps-clip-high 0.28 --lr 1e-6 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98
  # training: 8 ranks, one per GPU
  --train-backend torch --torch-parallel ddp --bf16 --actor-num-gpus-per-node 8
  --use-dynamic-batch-size --max-tokens-per-gpu 9216
  # generation: 8 engines on the same GPUs (engine i on GPU i)
  --colocate --rollout-engine sglang --rollout-num-engines 8 --rollout-num-gpus-per-engine 1
  --rollout-concurrency 128 --use-sglang-router
  --sglang-mem-fraction-static 0.35
  # weights: CUDA IPC through /update_weights_from_tensor (flattened buckets)
  --update-weight-transport colocated --update-weight-buffer-size $((1 << 30))
  --use-fault-tolerance --rollout-health-check-interval 30 --rollout-health-check-timeout 60
  --rollout-health-check-first-wait 300
)
if [ -n "${CHECK_ONLY:-}" ]; then
  exec python3 -c 'import sys; from slime_actors.launch.job_config import build_job_config; \
c, _ = build_job_config(sys.argv[1:]); print("ok:", c.engine.rollout_engine, c.engine.sglang_args, c.engine.router_args)' \
"${ARGS[@]}" "$@"
fi
exec slime-actors train "${ARGS[@]}" "$@"
