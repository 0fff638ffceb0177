#!/usr/bin/env bash
# Download the Python 3.12 manylinux wheels the megatron backend needs and the GPU image lacks, into .whl/
# (git-ignored), for scripts/gpu_check.sh (which installs .whl/*.whl into $SITE). Run here, where PyPI is reachable;
# then name ".whl" in the device call's `carry`. scripts/prepare_gpu_carry.sh adds pyzmq and structlog (our own
# runtime needs) to the same folder: the names differ, one version each.
#
# megatron-core 0.19.2 requires (Requires-Dist, no extras) torch>=2.6, numpy and packaging>=24.2: all on the image
# ('cuda', /work/.library/device/KINDS.md: torch 2.11, numpy, packaging). What it imports at run time on our path is
# there too: triton (megatron.core.transformer.moe imports it unconditionally) and psutil (dist_checkpointing's
# writer). Transformer Engine and Apex are not needed: the backend uses megatron-core's local layer spec and torch's
# AdamW. Usage: bash scripts/prepare_megatron_carry.sh [DEST=.whl]
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
