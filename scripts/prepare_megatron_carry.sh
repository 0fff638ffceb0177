#!/usr/bin/env bash
# For a GPU machine with no package registry: download the Python 3.12 manylinux wheels the megatron backend needs
# and a CUDA image with torch typically lacks, into .whl/ (git-ignored). Run it on a machine where PyPI is reachable,
# then copy .whl/ into the checkout on the GPU machine; scripts/gpu_check.sh installs .whl/*.whl into $SITE there.
# scripts/prepare_gpu_carry.sh adds pyzmq and structlog (our own runtime needs) to the same folder: the names
# differ, one version each. (A GPU machine that reaches PyPI needs none of this: pip install -e '.[megatron]'.)
#
# megatron-core 0.19.2 requires (Requires-Dist, no extras) torch>=2.6, numpy and packaging>=24.2, which a CUDA image
# with torch has (measured against one with Python 3.12 and torch 2.11). What it imports at run time on our path
# must be there too: triton (megatron.core.transformer.moe imports it unconditionally) and psutil
# (dist_checkpointing's writer). Transformer Engine and Apex are not needed: the backend uses megatron-core's local
# layer spec and torch's AdamW. Usage: bash scripts/prepare_megatron_carry.sh [DEST=.whl]
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
PY=${PYTHON:-python3}
wheels=(
  "megatron-core==0.19.2"
)
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 any; do
  plat+=(--platform "$p")
done
mkdir -p "$dest"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$dest" "${wheels[@]}"
# one version of each: another version lying there would stop the whole install
for w in "${wheels[@]}"; do
  name=${w%%==*}; ver=${w#*==}
  norm=$(echo "$name" | tr '-' '_')
  for f in "$dest"/"$norm"-*.whl; do
    case "$f" in *"$norm-$ver-"*) ;; *) echo "removing other version: $f"; rm -f "$f" ;; esac
  done
  ls "$dest"/"$norm-$ver"-*.whl >/dev/null || { echo "missing wheel for $w" >&2; exit 1; }
  echo "$(basename "$dest"/"$norm-$ver"-*.whl) requires:" \
    $(unzip -p "$dest"/"$norm-$ver"-*.whl '*/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' | cut -d' ' -f2-)
done
du -ch "$dest"/*.whl | tail -1
