"""Two CPU runs of one job with the same seeds are bit-identical -- every metric but the timings, every saved
rollout, the final weights -- and a run with another seed is not (docs/reproducibility.md).

Three short runs of the default job (examples/digits, 4 rollouts, the local engine with
--sglang-enable-deterministic-inference: a request's numbers do not depend on which requests shared its batch, which
the run's timing decides). Run A and run B use the same seeds; run C another --rollout-seed. All three run here, so
nothing compared was computed on another machine.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
import torch

from slime_actors.traces.compare import leaf_differences

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent / "slime-actors"
FLAGS = ["--config", "examples/digits/config.toml", "--num-rollout", "4", "--eval-interval", "2",
         "--sglang-enable-deterministic-inference", "--save-interval", "4", "--progress", "false",
         "--use-tensorboard", "false"]
# what measures the machine rather than the computation: wall-clock times and durations
TIMING = re.compile(r"(^|/)time(/|$)|_time$|(^|/)seconds$")


def _run(tmp: Path, name: str, *extra: str) -> Path:
    run = tmp / name
    res = subprocess.run([str(BIN), "train", *FLAGS, "--run-dir", str(run), "--save", str(run / "ckpt"),
                          "--save-debug-rollout-data", str(run / "rollouts"), *extra],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("repro")
    return _run(tmp, "a"), _run(tmp, "b"), _run(tmp, "c", "--rollout-seed", "7")


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not TIMING.search(k)} for r in rows]


def rollouts(run: Path) -> list[dict]:
    return [msgpack.unpackb(p.read_bytes(), raw=False, strict_map_key=False)
            for p in sorted((run / "rollouts").glob("rollout_*.msgpack"))]


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    """The trainer's model in the last checkpoint (every tensor file under it)."""
    last = sorted((run / "ckpt").glob("iter_*"))[-1]
    out: dict[str, torch.Tensor] = {}
    for f in sorted(last.rglob("*.safetensors")):
        from safetensors.torch import load_file
        out.update({f"{f.relative_to(last)}:{k}": v for k, v in load_file(str(f)).items()})
    for f in sorted(last.rglob("*.pt")):
        obj = torch.load(str(f), map_location="cpu", weights_only=True)
        if isinstance(obj, dict):
            out.update({f"{f.relative_to(last)}:{k}": v for k, v in _tensors(obj).items()})
    assert out, f"no weights found under {last}"
    return out


def _tensors(obj, prefix: str = "") -> dict[str, torch.Tensor]:
    out = {}
    for k, v in obj.items():
        if isinstance(v, torch.Tensor):
            out[prefix + str(k)] = v
        elif isinstance(v, dict):
            out.update(_tensors(v, f"{prefix}{k}."))
    return out


def same_tensors(a: dict, b: dict) -> list[str]:
    """Names whose tensors are not bit-identical (or present on one side only)."""
    bad = sorted(set(a) ^ set(b))
    for k in sorted(set(a) & set(b)):
        x, y = a[k].contiguous(), b[k].contiguous()
        if x.dtype != y.dtype or x.shape != y.shape or x.numpy().tobytes() != y.numpy().tobytes():
            bad.append(k)
    return bad


@pytest.mark.slow  # three short runs (~1-2 min on 2 cores)
def test_same_seed_same_metrics_rollouts_and_weights(runs):
    a, b, _ = runs
    ma, mb = metrics(a), metrics(b)
    assert len(ma) == len(mb) == 4
    diffs = leaf_differences(ma, mb, volatile=frozenset())
    assert not diffs, [(d.path, d.a, d.b) for d in diffs[:10]]
    ra, rb = rollouts(a), rollouts(b)
    assert len(ra) == len(rb) == 4 and all(len(r["samples"]) == 128 for r in ra)
    diffs = leaf_differences(ra, rb, volatile=frozenset())
    assert not diffs, [(d.path, d.a, d.b) for d in diffs[:10]]
    wa, wb = final_weights(a), final_weights(b)
    assert not same_tensors(wa, wb)
    # the held-out evaluations' responses too, line for line (the buffer lists a rollout's groups in group order,
    # never in the order the run's timing finished them)
    evals = sorted((a / "evals").glob("*.jsonl"))
    assert evals
    for f in evals:
        assert f.read_text() == (b / "evals" / f.name).read_text(), f.name


@pytest.mark.slow
def test_another_seed_gives_another_run(runs):
    a, _, c = runs
    ra, rc = rollouts(a), rollouts(c)
    responses = lambda r: [s["response_tokens"] for s in r[0]["samples"]]  # noqa: E731
    assert responses(ra) != responses(rc)  # other sampling seeds: other responses from the first rollout on
    assert leaf_differences(metrics(a), metrics(c), volatile=frozenset())
    assert same_tensors(final_weights(a), final_weights(c))  # trained on other samples: other weights
