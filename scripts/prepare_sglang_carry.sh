#!/usr/bin/env bash
# For a GPU machine with no package registry: the wheels SGLang 0.5.15.post1 needs beyond a CUDA image's torch 2.11,
# packed in parts of 48 MiB that can be copied one at a time. SGLANG_GPU_DIR names the folder that lists them and
# fetches and installs them (absolute, or relative to the repository root; docs/sglang.md, "SGLang on a GPU machine
# without a package registry"):
#   wheels.txt        name==version, one per line (90 wheels, ~745 MB)
#   fetch-wheels.sh   fetch-wheels.sh DEST: downloads them into DEST/wheels/ (and packs DEST/parts/)
#   install.sh        install.sh [STAGE=/tmp/stage] [SITE=/tmp/site]: joins STAGE/p* and installs the wheels into SITE
# With one change: sglang-kernel's FlashAttention-3 library (sgl_kernel/flash_ops.abi3.so, 1.76 GB unpacked, ~85 %
# of all the bytes) is left out. Our engines run with `--attention-backend triton` (scripts/sglang_gpu_check.py,
# GPU_FLAGS); SGLang imports sgl_kernel.flash_attn only inside the FA3 / vision / xpu backends, never for a dense
# model on the triton backend, so the parts drop from 16 to ~4-5. A run that needs FA3 uses the full set:
# `FULL=1 bash scripts/prepare_sglang_carry.sh`.
# Run it where PyPI is reachable:
#   SGLANG_GPU_DIR=path/to/sglang-gpu bash scripts/prepare_sglang_carry.sh [DEST=.sglang]
# then copy the parts, .sglang/parts/p*, into one folder on the GPU machine (e.g. /tmp/stage) and .sglang/install.sh
# to the same path in the checkout there, and on the GPU machine:
#   bash .sglang/install.sh /tmp/stage /tmp/site && export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.sglang}
shared=${SGLANG_GPU_DIR:?set SGLANG_GPU_DIR to the folder with the SGLang wheels.txt, fetch-wheels.sh, install.sh}
for f in wheels.txt fetch-wheels.sh install.sh; do
  [ -f "$shared/$f" ] || { echo "SGLANG_GPU_DIR=$shared has no $f (docs/sglang.md: what it holds)" >&2; exit 1; }
done
grep -qx '/.sglang/' .git/info/exclude 2>/dev/null || echo '/.sglang/' >> .git/info/exclude
if [ "$(ls "$dest"/wheels/*.whl 2>/dev/null | wc -l)" -ne "$(grep -c . "$shared/wheels.txt")" ]; then
  bash "$shared/fetch-wheels.sh" "$dest" >/dev/null
fi
cp "$shared/install.sh" "$dest/install.sh"
if [ "${FULL:-0}" != 1 ]; then
  python3 - "$dest/wheels" <<'EOF'
import sys, zipfile
from pathlib import Path
drop = "sgl_kernel/flash_ops.abi3.so"
for whl in Path(sys.argv[1]).glob("sglang_kernel-*.whl"):
    tmp = whl.with_suffix(".tmp")
    with zipfile.ZipFile(whl) as zin:
        if drop not in zin.namelist():
            print(f"{whl.name}: {drop} already left out")
            continue
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
            for info in zin.infolist():
                if info.filename == drop:
                    continue
                data = zin.read(info)
                if info.filename.endswith(".dist-info/RECORD"):
                    data = b"".join(l for l in data.splitlines(keepends=True) if not l.startswith(drop.encode()))
                zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    tmp.replace(whl)
    print(f"{whl.name}: left out {drop} -> {whl.stat().st_size / 2**20:.0f} MiB")
EOF
fi
rm -f "$dest"/parts/p*
mkdir -p "$dest/parts"
tar -cf - -C "$dest/wheels" . | split -b 48m -d -a 2 - "$dest/parts/p"
ls -l "$dest/parts"
