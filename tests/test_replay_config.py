"""Replay edits the recorded job config through JobConfig (traces/replay.py, Harness._build_config): the flags a
recording predates, --set (checked as the flag's type), W&B off, the paths mapped to the replay's directory; a
malformed recorded config or --set is a ReplayError naming the flag. (Replaying the recordings themselves:
tests/test_replay.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from slime_actors.config import JobConfig
from slime_actors.traces.replay import Harness, ReplayError


def _harness(tmp_path, args: dict | None, role: str = "buffer", overrides: dict | None = None) -> Harness:
    h = Harness.__new__(Harness)   # (the config step alone: no recording on disk)
    config = {"args": args} if args is not None else {"index": 0}
    h.rec = SimpleNamespace(meta={"config": config}, file=SimpleNamespace(path="rec/buffer-0.trace"))
    h.role, h.overrides, h.user_map, h.fwd_map, h.notes = role, dict(overrides or {}), [], [], []
    h.workdir = tmp_path
    return h


def _recorded(**flags) -> dict:
    """A job's flat config as an actor's trace records it."""
    return {**JobConfig().to_dict(), "hf_checkpoint": "tiny:digits", "prompt_data": "prompts.jsonl",
            "rm_type": "exact_match", **flags}


def test_the_recorded_config_is_read_and_edited_as_a_job_config(tmp_path):
    args = _recorded(run_dir="/old/run", save="/old/ckpt", use_wandb=True, lr=1e-5)
    cfg = _harness(tmp_path, args, overrides={"lr": 0.003})._build_config()
    job = cfg["args"]
    assert isinstance(job, JobConfig)
    flat = job.to_dict()
    assert flat["lr"] == 0.003                                   # --set
    assert flat["use_wandb"] is False                             # a replay logs to no W&B run
    assert flat["run_dir"] == str(tmp_path / "run")               # paths mapped into the replay's directory
    assert flat["save"] == str(tmp_path / "out-save")
    assert args["run_dir"] == "/old/run", "the recording's own config is not changed"


def test_a_flag_the_recording_predates_takes_the_value_it_had_then(tmp_path):
    old = _recorded()
    del old["no_rolling_save"]
    assert _harness(tmp_path, old)._build_config()["args"].to_dict()["no_rolling_save"] is True
    new = _recorded(no_rolling_save=False)
    assert _harness(tmp_path, new)._build_config()["args"].to_dict()["no_rolling_save"] is False


def test_set_is_checked_as_the_flag(tmp_path):
    with pytest.raises(ReplayError, match="no_such_flag"):
        _harness(tmp_path, _recorded(), overrides={"no_such_flag": 1})._build_config()
    with pytest.raises(ReplayError, match="lr"):
        _harness(tmp_path, _recorded(), overrides={"lr": "fast"})._build_config()


def test_a_malformed_recorded_config_names_the_field(tmp_path):
    with pytest.raises(ReplayError, match="rollout_batch_size"):
        _harness(tmp_path, _recorded(rollout_batch_size="many"))._build_config()


def test_an_actor_without_job_flags_takes_no_set(tmp_path):
    assert _harness(tmp_path, None)._build_config() == {"index": 0}
    with pytest.raises(ReplayError, match="no job flags"):
        _harness(tmp_path, None, overrides={"lr": 0.1})._build_config()


def test_one_rank_of_a_multi_rank_trainer_group_is_refused(tmp_path):
    args = _recorded(actor_num_gpus_per_node=2, global_batch_size=64, rollout_batch_size=16)
    with pytest.raises(ReplayError, match="multi-rank"):
        _harness(tmp_path, args, role="trainer")._build_config()
    assert isinstance(_harness(tmp_path, args, role="buffer")._build_config()["args"], JobConfig)
