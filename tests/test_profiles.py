"""Profiling with slime's flags (slime_actors/profiler.py) and the merged timeline (`trace export`, recorder/profiles.py).

One short profiled run of the digits job (module fixture): the trainer's update and the local engine's generation
profiled for rollout 1 (--use-pytorch-profiler --profile-step-start 1 --profile-step-end 2 --profile-target
train_overall rollout).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from slime_actors.cli import main
from slime_actors.config import ConfigError, parse_config
from slime_actors.traces.reader import TraceRun

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent / "slime-actors"
FLAGS = ["--hf-checkpoint", "tiny:digits", "--prompt-data", "examples/digits/train.jsonl", "--input-key", "input",
         "--label-key", "label", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
         "--global-batch-size", "16", "--micro-batch-size", "16", "--rollout-max-response-len", "1",
         "--advantage-estimator", "grpo", "--rm-type", "exact_match", "--num-rollout", "3", "--use-tensorboard",
         "false", "--progress", "false",
         "--use-pytorch-profiler", "--profile-step-start", "1", "--profile-step-end", "2",
         "--profile-target", "train_overall", "rollout"]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    run = tmp_path_factory.mktemp("profiled") / "run"
    res = subprocess.run([str(BIN), "train", "--run-dir", str(run), *FLAGS], cwd=ROOT, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    return run


def _train_ask(run: Path, rollout_id: int) -> str:
    for e in TraceRun(run).events("trainer/0"):
        if e.ev == "recv" and e.kind == "ask" and e.method == "train" and e.body()["rollout_id"] == rollout_id:
            return e.id
    raise AssertionError(f"no train ask for rollout {rollout_id}")


@pytest.mark.slow  # one short profiled run (~1 min)
def test_the_profiled_rollouts_have_traces_named_after_their_messages(profiled):
    profiles = profiled / "profiles"
    (trainer,) = profiles.glob("trainer-0.*.train_overall.step1.pt.trace.json.gz")  # rollout 1 only
    assert not list(profiles.glob("trainer-0.*.step0.*")) and not list(profiles.glob("trainer-0.*.step2.*"))
    events = json.loads(gzip.decompress(trainer.read_bytes()))["traceEvents"]
    names = {e.get("name") for e in events}
    mid = _train_ask(profiled, 1)
    assert f"train_overall rollout 1 m:{mid}" in names  # the message that caused it
    assert {"aten::mm", "aten::addmm"} & names or any(str(n).startswith("aten::") for n in names)
    assert any(e.get("name") == "[memory]" for e in events)  # --profile-memory
    assert any(e.get("args", {}).get("Input Dims") for e in events if e.get("cat") == "cpu_op")  # shapes
    sidecar = json.loads(next(profiles.glob("trainer-0.*.step1.clock.json")).read_text())
    assert sidecar["cause"] == mid and sidecar["clock"]["wall_ns"] > 0
    # the engine's generation steps, through SGLang's /start_profile and /stop_profile
    (engine,) = (profiles / "engine-rollout-0").glob("*-TP-0.trace.json.gz")
    steps = [e["name"] for e in json.loads(gzip.decompress(engine.read_bytes()))["traceEvents"]
             if str(e.get("name", "")).startswith(("prefill step", "decode step"))]
    assert steps and all("rids=" in s for s in steps)


@pytest.mark.slow
def test_export_merges_the_profiles_on_the_messages_clock(profiled, tmp_path):
    """Each profile is placed by its clock mark: the trainer's range for the train ask lands inside that ask's
    handling (from its arrival to its reply) to within 1 ms; memory counters and the engine's steps are on the
    actors' tracks."""
    out = tmp_path / "run.json"
    assert main(["trace", "export", str(profiled), "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    ev = data["traceEvents"]
    assert {p["aligned_by"] for p in data["otherData"]["profiles"]} == {"clock mark"}
    mid = _train_ask(profiled, 1)
    (rng,) = [e for e in ev if e.get("cat") == "profile.user_annotation" and e.get("args", {}).get("message") == mid
              and e["name"].startswith("train_overall")]
    (handling,) = [e for e in ev if e.get("cat") == "handle" and e["args"].get("id") == mid]
    assert rng["pid"] == handling["pid"]  # on the trainer's track
    assert handling["ts"] - 1000 <= rng["ts"] and rng["ts"] + rng["dur"] <= handling["ts"] + handling["dur"] + 1000
    assert any(e["ph"] == "C" and e["name"].startswith("memory") and e["pid"] == rng["pid"] for e in ev)
    rollout_pid = next(e["pid"] for e in ev if e.get("ph") == "M" and e["name"] == "process_name"
                       and e["args"]["name"] == "rollout/0")
    assert any(e.get("cat") == "profile.user_annotation" and e["name"].startswith(("prefill", "decode"))
               and e["pid"] == rollout_pid for e in ev)
    # without them
    assert main(["trace", "export", str(profiled), "-o", str(out), "--no-profiles"]) == 0
    assert not any(str(e.get("cat", "")).startswith("profile.") for e in json.loads(out.read_text())["traceEvents"])


@pytest.mark.slow
def test_a_profiled_run_replays_as_it_ran(profiled):
    """Profiling changes nothing the actors send; the engine's profiler calls are recorded inputs."""
    from slime_actors.traces.replay import replay
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        for actor in ("trainer/0", "rollout/0"):
            rep = replay(str(profiled), actor)
            assert rep.identical, rep.render()
    finally:
        os.chdir(cwd)


def test_profiling_flags_are_slimes_and_checked(tmp_path):
    base = ["--hf-checkpoint", "tiny:digits", "--prompt-data", str(ROOT / "examples/digits/train.jsonl"),
            "--rm-type", "exact_match",
            "--run-dir", str(tmp_path / "r")]
    cfg = parse_config(base + ["--use-pytorch-profiler", "--profile-ranks", "0", "1", "--profile-target",
                               "train_actor", "train_log_probs"])
    d = cfg.debug
    assert d.use_pytorch_profiler and d.profile_ranks == [0, 1] and (d.profile_step_start, d.profile_step_end) == (
        10, 12) and d.profile_target == ["train_actor", "train_log_probs"]
    with pytest.raises(ConfigError, match="--profile-step-start 5 / --profile-step-end 5"):
        parse_config(base + ["--use-pytorch-profiler", "--profile-step-start", "5", "--profile-step-end", "5"])
    with pytest.raises(ConfigError, match="--memory-recorder memray: only torch"):
        parse_config(base + ["--memory-recorder", "memray"])


def _debug(**kw):
    d = dict(use_pytorch_profiler=True, record_memory_history=False, profile_ranks=None, profile_step_start=1,
             profile_step_end=3, profile_target=None, memory_snapshot_path="snapshot.pickle",
             memory_snapshot_dir=None, memory_snapshot_num_steps=None)
    d.update(kw)
    return SimpleNamespace(**d)


def test_only_the_chosen_ranks_targets_and_rollouts_are_profiled(tmp_path):
    import torch

    from slime_actors.profiler import TrainProfiler
    p = TrainProfiler(_debug(profile_target=["train_actor"]), 0, tmp_path, "trainer/0")
    x = torch.randn(8, 8)
    for step in range(4):
        with p.phase("train_overall", step, "m1"):
            with p.phase("train_log_probs", step, "m1"):
                x @ x
            with p.phase("train_actor", step, "m1"):
                (x @ x).sum()
    assert sorted(f.name.split(".", 2)[2] for f in p.written) == [
        "train_actor.step1.pt.trace.json.gz", "train_actor.step2.pt.trace.json.gz"]
    other_rank = TrainProfiler(_debug(), 1, tmp_path / "r1", "trainer/1")
    with other_rank.phase("train_overall", 1, None):
        x @ x
    assert not other_rank.written and not (tmp_path / "r1").exists()


def test_the_profilers_export_and_a_snapshot_are_announced_as_quiet_windows(tmp_path, monkeypatch):
    """The profiler's stop + export and a memory snapshot keep the GIL (on one H100 a step's export outlasted the 5 s
    liveness and the trainer was declared down): each is wrapped in a quiet window that is closed when it is done,
    also when it fails."""
    import torch

    from slime_actors.profiler import EXPORT_QUIET_S, SNAPSHOT_QUIET_S, TrainProfiler
    said: list = []
    p = TrainProfiler(_debug(), 0, tmp_path, "trainer/0", quiet=lambda s, why: said.append((s, why)))
    x = torch.randn(8, 8)
    with p.phase("train_overall", 0, "m1"):   # not a profiled rollout: nothing to say
        x @ x
    assert said == []
    with p.phase("train_overall", 1, "m1"):
        x @ x
    assert [s for s, _ in said] == [EXPORT_QUIET_S, 0.0] and "rollout 1" in said[0][1]
    assert len(p.written) == 1
    said.clear()
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda path: (_ for _ in ()).throw(RuntimeError("x")))
    assert p.dump_memory_snapshot("oom") is None   # failed, reported; the window still closed
    assert [s for s, _ in said] == [SNAPSHOT_QUIET_S, 0.0]


def test_memory_history_snapshots_on_oom(tmp_path, monkeypatch):
    """On a GPU, --record-memory-history records the allocator's history and an OOM writes the snapshot (the GPU
    run itself: scripts/gpu_profile.sh); here the CUDA calls are stand-ins that record what they were asked."""
    import torch

    from slime_actors.profiler import TrainProfiler
    p = TrainProfiler(_debug(record_memory_history=True, memory_snapshot_num_steps=2), 0, tmp_path, "trainer/0")
    assert not p.start_memory_history()  # no GPU: said so, nothing started
    calls = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda *a, **kw: calls.setdefault("history", []).append(kw))
    monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", lambda fn: calls.__setitem__("oom", fn),
                        raising=False)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda path: Path(path).write_bytes(b"snapshot"))
    assert p.start_memory_history()
    assert calls["history"][0]["stacks"] == "all"
    calls["oom"](0, 1 << 30, 1 << 34, 0)  # the allocator failed
    assert p.snapshot_path("oom").read_bytes() == b"snapshot"
    p.after_step(0)
    assert not p.snapshot_path("step0").exists()
    p.after_step(1)  # --memory-snapshot-num-steps 2: after rollout 1, and the history stops
    assert p.snapshot_path("step1").exists() and calls["history"][-1] == {"enabled": None}
