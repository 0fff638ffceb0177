#!/usr/bin/env bash
# Download the Python 3.12 manylinux wheels that OUR code needs and the GPU image lacks, into .whl/ (git-ignored),
# for scripts/sglang_gpu_check.sh (which installs .whl/*.whl into $SITE). Run here, where PyPI is reachable; then
# name ".whl" in the device call's `carry`.
#
# The image ('cuda', /work/.library/device/KINDS.md) has msgpack, uvloop, aiohttp, safetensors, tokenizers, numpy,
# pyarrow, matplotlib, tensorboard, tqdm and torch/transformers; it lacks pyzmq and structlog. pyzmq is also among
# SGLang's wheels (/work/shared/sglang-gpu/wheels.txt: pyzmq==27.3.0): the same version is fetched, so installing both
# into one target never holds two versions. Usage: bash scripts/prepare_gpu_carry.sh [DEST=.whl]
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
PY=${PYTHON:-python3}
# name==version, one per line; keep pyzmq in step with /work/shared/sglang-gpu/wheels.txt
wheels=(
  "pyzmq==27.3.0"
  "structlog==26.1.0"
  "xxhash==4.1.0"       # trace checksums (slime_actors.traces.writer imports it)
  # the math rewards (slime_actors/rewards/rules.py) and the SmolLM2 GGUF loader (slime_actors/models/smollm2.py)
  "math-verify==0.9.0"
  "latex2sympy2_extended==1.11.0"
  "antlr4-python3-runtime==4.13.2"
  "gguf==0.19.0"
)
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux_2_5_x86_64 manylinux1_x86_64 any; do
  plat+=(--platform "$p")
done
mkdir -p "$dest"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$dest" "${wheels[@]}"
# one version of each: an older download of another version would stop the whole install there
for w in "${wheels[@]}"; do
  name=${w%%==*}; ver=${w#*==}
  norm=$(echo "$name" | tr '-' '_')
  for f in "$dest"/"$norm"-*.whl; do
    case "$f" in *"$norm-$ver-"*) ;; *) echo "removing other version: $f"; rm -f "$f" ;; esac
  done
  ls "$dest"/"$norm-$ver"-*.whl >/dev/null || { echo "missing wheel for $w" >&2; exit 1; }
done
# dependencies they declare, other than extras, must be on the image already (structlog: none on 3.12; pyzmq, xxhash:
# none; math-verify, latex2sympy2_extended: sympy and each other; gguf: numpy, pyyaml, tqdm)
for f in "$dest"/*.whl; do
  deps=$(unzip -p "$f" '*/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' || true)
  [ -n "$deps" ] && echo "$(basename "$f") requires: $deps"
done
du -ch "$dest"/*.whl | tail -1
ls -l "$dest"
