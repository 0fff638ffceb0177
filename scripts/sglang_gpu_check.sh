#!/usr/bin/env bash
# The SGLang rollout backend on a GPU machine against a real SGLang 0.5.15.post1: launch through the rollout worker's
# code with --sglang-* passthrough, /generate + log-probs vs the local engine, weight updates (disk, NCCL flattened and
# per tensor, tensors/CUDA IPC), pause/continue, abort, health probes, and a few GRPO steps with SGLang as the engine.
# Prints a result table; with $OUT set, writes $OUT/sglang_results.md (+ .json and logs). Target: < 6 min after install.
#
# Needs: python3 with torch (CUDA), SGLang installed into $SITE (default /tmp/site; /work/shared/sglang-gpu/install.sh),
# and the wheels our code needs that the image lacks in .whl/ (scripts/prepare_gpu_carry.sh; carry ".whl").
# Usage, from the repository root:  bash scripts/sglang_gpu_check.sh [driver flags, e.g. --no-grpo | --fake]
set -uo pipefail
cd "$(dirname "$0")/.."
SITE=${SITE:-/tmp/site}
PY=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    || echo "warning: installing .whl/ into $SITE failed" >&2
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# never NVLink multicast on shared machines (KINDS.md); SGLang and NCCL inherit these
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SLIME_ACTORS_LOG_LEVEL=${SLIME_ACTORS_LOG_LEVEL:-info}
"$PY" -c "import sglang" 2>/dev/null || echo "warning: sglang is not importable from $SITE (install it first)" >&2
WORK=${WORK:-/tmp/sglang_gpu_check}
timeout -k 10 "${CHECK_TIMEOUT:-420}" "$PY" scripts/sglang_gpu_check.py --work "$WORK" "$@"
rc=$?
# whatever happened to the driver: the process groups it started (engines, the GRPO run's actors) are ended
if [ -f "$WORK/pids.txt" ]; then
  while read -r pid; do [ -n "$pid" ] && kill -9 -- "-$pid" 2>/dev/null; done < "$WORK/pids.txt"
fi
exit $rc
