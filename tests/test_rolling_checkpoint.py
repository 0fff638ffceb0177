"""A job without --save keeps a rolling checkpoint in RUN_DIR/ckpt (issue 27, item 7): every --save-interval rollouts
(else every 5) and after the last, only the newest kept. Killing the trainer mid-run then costs the steps since that
checkpoint, not the run: the training group restarts from it (not from the initial weights), and the summary says
that the run was rolled back and how far."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import pytest

from slime_actors.checkpoints import (ROLLING_INTERVAL, ROLLING_MARKER, commit_checkpoint, continue_hint, prune,
                                      rolling, rolling_conflict, save_interval, save_root)
from slime_actors.config import JobConfig
from slime_actors.run_dir import prepare_run_dir, unfinished_run

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="needs Linux /proc")


def _cfg(run_dir: Path, **ck) -> JobConfig:
    cfg = JobConfig()
    cfg.run.run_dir = str(run_dir)
    for k, v in ck.items():
        setattr(cfg.checkpoint, k, v)
    return cfg


def _iter(root: Path, n: int) -> Path:
    return commit_checkpoint(root, n, {"next_rollout_id": n, "weight_version": n, "controller_rng": random.getstate(),
                                       "evals": []})


def test_where_and_how_often(tmp_path):
    cfg = _cfg(tmp_path / "run")
    assert rolling(cfg) and save_root(cfg) == tmp_path / "run" / "ckpt" and save_interval(cfg) == ROLLING_INTERVAL
    cfg.checkpoint.save_interval = 3
    assert save_interval(cfg) == 3
    cfg = _cfg(tmp_path / "run", save=str(tmp_path / "mine"))
    assert not rolling(cfg) and save_root(cfg) == tmp_path / "mine" and save_interval(cfg) is None  # as before
    cfg = _cfg(tmp_path / "run", no_rolling_save=True)
    assert save_root(cfg) is None


def test_prune_keeps_the_newest_and_nothing_else_is_touched(tmp_path):
    root = tmp_path / "ckpt"
    for n in (5, 10):
        _iter(root, n)
    (root / "iter_0000012").mkdir()   # an interrupted save (no meta.json)
    (root / "notes.txt").write_text("mine")
    _iter(root, 15)
    gone = prune(root, 15, keep=1)
    assert sorted(p.name for p in gone) == ["iter_0000005", "iter_0000010", "iter_0000012"]
    assert sorted(p.name for p in root.iterdir()) == ["iter_0000015", "latest_checkpointed_iteration.txt", "notes.txt"]
    # a job resumed from an older checkpoint leaves the newer ones alone
    _iter(root, 20)
    _iter(root, 16)
    prune(root, 16, keep=1)
    assert sorted(p.name for p in root.glob("iter_*")) == ["iter_0000016", "iter_0000020"]
    _iter(root, 21)
    prune(root, 21, keep=2)
    assert sorted(p.name for p in root.glob("iter_*")) == ["iter_0000020", "iter_0000021"]


def test_a_new_run_clears_the_rolling_checkpoint_only_when_it_is_one(tmp_path):
    run = tmp_path / "run"
    prepare_run_dir(run)
    roll = run / "ckpt"
    _iter(roll, 5)
    (roll / ROLLING_MARKER).touch()
    it = _iter(roll, 10)
    prepare_run_dir(run, resume=True, resume_from=it)   # resumed from it: kept
    assert (roll / "iter_0000010" / "meta.json").exists()
    prepare_run_dir(run)                                 # a new run: the previous run's rolling checkpoint goes
    assert not roll.exists()
    # a ckpt/ that is not a rolling one (an earlier --save RUN/ckpt, your files) is never touched nor written to
    _iter(roll, 3)
    prepare_run_dir(run)
    assert (roll / "iter_0000003" / "meta.json").exists()
    assert "not a rolling checkpoint" in rolling_conflict(_cfg(run))


def test_a_run_that_did_not_finish_is_named_not_cleared(tmp_path):
    """Re-running the same command after a Ctrl-C, a crash or a preemption deleted the run's rolling checkpoint
    without a word; now `unfinished_run` says why a new run would lose it, and the head refuses (nothing changed)."""
    run = tmp_path / "run"
    prepare_run_dir(run)
    assert unfinished_run(run) is None                       # no checkpoint
    roll = run / "ckpt"
    roll.mkdir()
    (roll / ROLLING_MARKER).touch()
    _iter(roll, 0)
    assert unfinished_run(run) is None                       # nothing trained yet
    _iter(roll, 75)

    def status(**st):
        (run / "status.json").write_text(json.dumps(st))
    status(state="stopped", failure="stopped by SIGINT", controller={"num_rollout": 400})
    assert unfinished_run(run) == (
        f"--run-dir {run} holds a run that did not finish -- stopped by SIGINT -- and its rolling checkpoint "
        f"{roll / 'iter_0000075'} (rollout 75 of 400) would be deleted by a new run. Nothing was changed. To continue "
        f"that run: add --load {roll}. To start over: delete {roll} (a new run clears the rest of the old one), or "
        "give another --run-dir")
    status(state="failed", cause="trainer/0 died 6 times within 60s")
    assert "-- failed: trainer/0 died 6 times within 60s -- " in unfinished_run(run)
    status(state="running")                                  # its head killed before it could say
    assert "ended without saying how" in unfinished_run(run)
    (run / "status.json").write_text("{not json")
    assert "ended without saying how" in unfinished_run(run)
    for hostile in ("[1]", '{"state": "stopped", "controller": [1]}'):   # not what a job writes: never trusted
        (run / "status.json").write_text(hostile)
        assert "(rollout 75)" in unfinished_run(run)
    (run / "status.json").write_text(json.dumps({"state": "finished", "pad": "x" * (9 << 20)}))   # 9 MiB: not read
    assert "ended without saying how" in unfinished_run(run)
    status(state="finished")
    assert unfinished_run(run) is None                       # a finished run is replaced, as before
    (roll / ROLLING_MARKER).unlink()
    status(state="stopped")
    assert unfinished_run(run) is None                       # not a rolling checkpoint: never cleared anyway
    (roll / ROLLING_MARKER).touch()

    # what a job that stopped prints before its cause: how to continue it
    assert continue_hint(_cfg(run)) == (f"to continue from its checkpoint {roll / 'iter_0000075'} (rollout 75): the "
                                        f"same command with --load {roll}")
    mine = tmp_path / "mine"
    assert continue_hint(_cfg(run, save=str(mine))) is None       # --save: its own directory, empty
    _iter(mine, 0)
    assert continue_hint(_cfg(run, save=str(mine))) is None       # nothing trained yet
    _iter(mine, 3)
    assert continue_hint(_cfg(run, save=str(mine))).endswith(f"(rollout 3): the same command with --load {mine}")
    assert continue_hint(_cfg(run, no_rolling_save=True)) is None
    # the head: refused before anything is written, and with --load it continues
    from slime_actors.launch.prepare import prepare_head
    from slime_actors.run_dir import RunDirError
    cfg = _cfg(run)
    cfg.model.hf_checkpoint = "tiny:digits"
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    with pytest.raises(RunDirError, match="did not finish -- stopped -- "):
        prepare_head(cfg)
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == before
    prepare_head(cfg, fresh=False)                           # a restarted head (torchrun's) continues the run
    assert (roll / "iter_0000075" / "meta.json").exists()


@pytest.mark.slow
def test_killed_trainer_resumes_from_the_rolling_checkpoint(tmp_path):
    """No --save: the trainer killed mid-run (after the rolling checkpoint of rollout 5) resumes from it, not from
    the initial weights; at the end RUN_DIR/ckpt holds one checkpoint (the last rollout's) and the summary reports
    the rollback."""
    from test_fault_tolerance import finish
    from test_launch_support import FAST_FLAGS, Job, topology
    steps = 8
    job = Job(tmp_path, topology(tmp_path, trainers=1), [*FAST_FLAGS, "--num-rollout", str(steps)]).start()
    try:
        roll = job.run_dir / "ckpt"
        job.wait_for(lambda: (roll / "iter_0000005" / "meta.json").exists(), 300, "the rolling checkpoint of step 5")
        st = job.wait_step(6, phase="train", timeout=300)  # mid-step 7, after the checkpoint of step 5
        os.kill(job.pid("trainer/0"), signal.SIGKILL)
        res = finish(job, steps=steps, timeout=400)
        rec = res["recoveries"]
        assert len(rec) == 1, rec
        assert rec[0]["checkpoint"] == str(roll / "iter_0000005") and rec[0]["resumed_from"] == 5, rec
        assert rec[0]["failed_at_rollout"] >= st["steps"]
        log = (job.run_dir / "logs" / "trainer-0.jsonl").read_text()
        assert '"resumed from checkpoint"' in log
        # bounded: the last rollout's checkpoint alone
        assert sorted(p.name for p in roll.glob("iter_*")) == [f"iter_{steps:07d}"]
        assert json.loads((roll / f"iter_{steps:07d}" / "meta.json").read_text())["next_rollout_id"] == steps
        out = job.log()
        line = next((x for x in out.splitlines() if x.startswith("rolled back:")), None)
        assert line is not None, out[-3000:]
        assert "iter_0000005 (rollout 5)" in line and f"{rec[0]['failed_at_rollout'] - 5} step(s) redone" in line
        assert f"checkpoint: {roll / f'iter_{steps:07d}'}" in out
    finally:
        job.close()


def test_the_summary_says_how_far_a_run_was_rolled_back(tmp_path, capsys):
    from slime_actors.launch.summary import print_summary
    roll = tmp_path / "ckpt"
    res = {"steps": 8, "seconds": 10.0, "weight_version": 8, "metrics": "m", "rolling_checkpoint": True,
           "checkpoint": str(roll / "iter_0000008"),
           "started_from": {"checkpoint": str(roll / "iter_0000003"), "rollout": 3, "retrained": 2},
           "recoveries": [{"failed_at_rollout": 7, "resumed_from": 5, "checkpoint": str(roll / "iter_0000005"),
                           "reason": "trainer/0 down", "buffer": {"trained_rollouts_discarded": [5, 6]}},
                          {"failed_at_rollout": 2, "resumed_from": 0, "checkpoint": None, "reason": "x",
                           "buffer": {"rolled_back": False}}]}
    print_summary(res, tmp_path)
    out = capsys.readouterr().out
    assert f"resumed: from {roll / 'iter_0000003'} (rollout 3); 2 rollout(s)" in out
    assert ("rolled back: at rollout 7, the training group restarted from iter_0000005 (rollout 5): 2 step(s) "
            "redone, 2 trained rollout(s) discarded and trained again -- trainer/0 down") in out
    assert "restarted from the initial weights (no checkpoint) (rollout 0): 2 step(s) redone, 0 trained" in out
    assert f"checkpoint: {roll / 'iter_0000008'}   (rolling" in out and f"convert {roll} OUT_DIR" in out
