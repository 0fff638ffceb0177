#!/usr/bin/env bash
# For a GPU machine with no package registry: download the Python 3.12 manylinux wheels that OUR code needs and a
# CUDA image with torch typically lacks, into .whl/ (git-ignored). Run it on a machine where PyPI is reachable, then
# copy .whl/ into the checkout on the GPU machine: scripts/gpu_check.sh, sglang_gpu_check.sh and smollm2_gpu_run.sh
# install .whl/*.whl into $SITE there. (A GPU machine that reaches PyPI needs none of this: pip install -e . there.)
#
# Measured against a CUDA 13 image with Python 3.12, torch 2.11 and transformers, which has msgpack, uvloop, aiohttp,
# safetensors, tokenizers, numpy, pyarrow, matplotlib, tensorboard and tqdm but not pyzmq, structlog or orjson (a
# run with the local engine on one H100 stopped at its rollout worker's start: no module named 'orjson'); check yours
# with `python3 -m pip list`. pyzmq is also among SGLang's wheels (wheels.txt in $SGLANG_GPU_DIR, docs/sglang.md:
# pyzmq==27.3.0): the same version is fetched, so installing both into one target never holds two versions.
# Usage: bash scripts/prepare_gpu_carry.sh [DEST=.whl]
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
PY=${PYTHON:-python3}
# name==version, one per line; keep pyzmq in step with SGLang's wheels.txt ($SGLANG_GPU_DIR)
wheels=(
  "pyzmq==27.3.0"
  # engine answers (slime_actors/backends/engine_client.py); SGLang's wheels.txt has the same version, so a job with
  # the local engine alone (no SGLang wheels) still finds it
  "orjson==3.13.0"
  "structlog==26.1.0"
  "xxhash==4.1.0"       # trace checksums (slime_actors.recorder.writer imports it)
  # the math rewards (slime_actors/rewards/rules.py) and the SmolLM2 GGUF loader (slime_actors/models/smollm2.py)
  "math-verify==0.9.0"
  "latex2sympy2_extended==1.11.0"
  "antlr4-python3-runtime==4.13.2"
  "gguf==0.19.0"
  # LoRA (--lora-rank, docs/lora.md): peft and what it needs beyond torch and transformers
  "peft==0.21.2"
  "accelerate==1.16.0"
  "psutil==7.2.2"
  # the code sandbox's layers (slime_actors/sandbox; docs/code-sandbox.md)
  "landlock==1.0.0.dev5"
  "pyseccomp==0.1.2"
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
