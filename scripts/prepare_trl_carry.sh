#!/usr/bin/env bash
# TRL for a GPU machine without a package registry whose Python already has torch, transformers, accelerate, pyarrow
# and pandas (a CUDA image with Python 3.12): the four wheels it lacks, ~1.8 MB, downloaded here into .trl/
# (git-ignored). scripts/compare_trl.sh installs .trl/*.whl into $SITE there; carry ".trl" (with ".whl" from
# scripts/prepare_gpu_carry.sh). Usage: bash scripts/prepare_trl_carry.sh [DEST=.trl]
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.trl}
PY=${PYTHON:-python3}
wheels=("trl==1.16.0" "datasets==5.2.0" "dill==0.4.1" "multiprocess==0.70.19")
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 any; do plat+=(--platform "$p"); done
mkdir -p "$dest"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$dest" "${wheels[@]}"
for w in "${wheels[@]}"; do
  norm=$(echo "${w%%==*}" | tr '-' '_'); ver=${w#*==}
  for f in "$dest"/"$norm"-*.whl; do
    case "$f" in *"$norm-$ver-"*) ;; *) echo "removing other version: $f"; rm -f "$f" ;; esac
  done
  ls "$dest"/"$norm-$ver"-*.whl >/dev/null || { echo "missing wheel for $w" >&2; exit 1; }
done
du -ch "$dest"/*.whl | tail -1
