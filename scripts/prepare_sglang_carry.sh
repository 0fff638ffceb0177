#!/usr/bin/env bash
# The wheels SGLang 0.5.15.post1 needs on the GPU image, packed for the device tool (../shared/sglang-gpu/README.md),
# with one change: sglang-kernel's FlashAttention-3 library (sgl_kernel/flash_ops.abi3.so, 1.76 GB unpacked, ~85 %
# of all the bytes) is left out. Our engines run with `--attention-backend triton` (scripts/sglang_gpu_check.py,
# GPU_FLAGS); SGLang imports sgl_kernel.flash_attn only inside the FA3 / vision / xpu backends, never for a dense
# model on the triton backend, so the parts to move drop from 16 to ~4. A run that needs FA3 uses the full set:
# `FULL=1 bash scripts/prepare_sglang_carry.sh`.
# Run here (PyPI reachable). Then move .sglang/parts/pNN one device call each, and on the device machine:
#   bash .sglang/install.sh && export PYTHONPATH=/tmp/site
# Usage: bash scripts/prepare_sglang_carry.sh [DEST=.sglang]
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.sglang}
shared=${SGLANG_GPU_DIR:-../shared/sglang-gpu}
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
