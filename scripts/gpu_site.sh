# Sourced by the GPU run scripts (smollm2_gpu_run.sh, agents_gpu_run.sh): installs the carried wheels (.whl/) and,
# with SMOL_STAGE, the SmolLM2 model package into SITE (default /tmp/site), and puts this checkout and SITE on the
# Python path. Run from the repository root.
SITE=${SITE:-/tmp/site}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    || echo "warning: installing .whl/ into $SITE failed" >&2
fi
if [ -n "${SMOL_STAGE:-}" ]; then
  bash scripts/install_smollm2_carry.sh "$SMOL_STAGE" "$SITE" || exit 1
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
