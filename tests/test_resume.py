"""Resuming into the same run directory continues the run (issue 17): metrics.jsonl, TensorBoard and curves.png span
every rollout, the previous job's traces and logs are kept under attempts/, and --save-hf writes loadable Hugging
Face directories at --save-interval with slime's {rollout_id} formatting."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from test_rl_loop import metrics, train

pytestmark = pytest.mark.slow  # two short training jobs (~1 min on 2 CPU cores)


def tb_steps(logdir: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def test_resume_into_the_same_run_dir_continues_the_run_and_exports_hf(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    run = tmp_path / "run"
    ckpt = run / "ckpt"
    flags = ["--eval-interval", "0", "--save", str(ckpt), "--load", str(ckpt), "--save-interval", "2",
             "--save-hf", str(run / "hf" / "iter_{rollout_id:07d}")]
    # the first job: --load = --save, still empty, starts fresh (slime's habit); checkpoints after rollouts 1, 2
    train(run, "--num-rollout", "3", *flags)
    first = metrics(run)
    assert [m["rollout_id"] for m in first] == [0, 1, 2]
    assert sorted(p.name for p in (run / "hf").iterdir()) == ["iter_0000001", "iter_0000002"]
    # ... and it died before its last checkpoint: the newest one is after rollout 1
    shutil.rmtree(ckpt / "iter_0000003")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("2")
    first_traces = sorted(p.name for p in (run / "traces").iterdir())
    train(run, "--num-rollout", "3", *flags)
    rows = metrics(run)
    assert [m["rollout_id"] for m in rows] == [0, 1, 2]
    assert rows[:2] == first[:2] and rows[2]["time"] > first[2]["time"]  # rollout 2 trained again
    assert tb_steps(run / "tensorboard", "rollout/reward_mean") == [0, 1, 2]
    assert tb_steps(run / "tensorboard", "train/loss") == [0, 1, 2]
    assert len(list((run / "tensorboard").iterdir())) == 2
    assert (run / "curves.png").stat().st_size > 10_000
    # the first job's traces, logs and metrics are kept
    att = run / "attempts" / "1"
    assert sorted(p.name for p in (att / "traces").iterdir()) == first_traces
    assert (att / "logs" / "controller-0.jsonl").exists() and (att / "job.json").exists()
    assert [json.loads(x)["rollout_id"] for x in (att / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert any((run / "traces").iterdir()) and not (run / "attempts" / "2").exists()
    # --save-hf: loadable HF directories holding the weights of the checkpoint taken at the same rollout
    for k, it in ((1, "iter_0000002"), (2, "iter_0000003")):
        hf = run / "hf" / f"iter_{k:07d}"
        marker = json.loads((hf / ".slime-actors-export").read_text())
        assert marker["rollout_id"] == k and marker["backend"] == "torch"
        model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
        assert len(AutoTokenizer.from_pretrained(hf)) == 36
        want = load_file(ckpt / it / "trainer" / "model.safetensors")
        got = {n: t for n, t in model.state_dict().items() if n in want}
        assert sorted(got) == sorted(want) and all(torch.equal(got[n], want[n]) for n in want), k
    assert json.loads((run / "result.json").read_text())["steps"] == 1
