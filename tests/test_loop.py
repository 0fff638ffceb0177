"""The schedules of slime_actors/loop.py, run against a fake of every other actor (no processes): the messages the
controller sends for each step, in order -- what the wire and the traces of a run show."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from slime_actors import loop
from slime_actors.actors.controller import Controller
from slime_actors.config import parse_config

FLAGS = ["--hf-checkpoint", "tiny:digits", "--input-key", "input", "--label-key", "label",
         "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--global-batch-size", "16",
         "--micro-batch-size", "16", "--num-rollout", "3", "--actor-num-gpus-per-node", "2",
         "--rm-type", "exact_match", "--use-tensorboard", "false", "--progress", "false"]


def _stats(rollout_id, kind="train"):
    return {"complete": True, "rollout_id": rollout_id, "kind": kind, "groups": 4, "target": 4, "samples": 16,
            "filtered": 0, "failed": 0, "reward_mean": 0.25, "examples": None, "seconds": 0.1}


def _controller(tmp_path, *flags) -> Controller:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"input": "1+1", "label": "2"}\n')
    ctl = Controller(0, args=parse_config(FLAGS + ["--prompt-data", str(prompts), *flags]).to_dict())
    ctl.runtime = SimpleNamespace(run_dir=str(tmp_path / "run"), down_after=1.0)
    ctl.sent = []

    async def ask(to, method, body=None, *, timeout=None):
        ctl.sent.append((to, method, body))
        await asyncio.sleep(0)
        if method == "wait_rollout":
            return _stats(body["rollout_id"], body.get("kind", "train"))
        if method == "train":
            return {"loss": 0.5}
        if method == "sync_weights":
            return {"bytes": 10}
        return {}

    async def tell(to, method, body=None):
        ctl.sent.append((to, method, body))

    ctl.ask, ctl.tell = ask, tell
    ctl.engines.versions = {"rollout/0": 0}
    ctl.metrics.open(resume_at=None)
    return ctl


def _step(k: int, v: int) -> list[tuple]:
    return [("buffer/0", "start_rollout", {"rollout_id": k, "weight_version": v}),
            ("rollout/0", "resume", {"weight_version": v}),
            ("buffer/0", "wait_rollout", {"rollout_id": k, "timeout": 86400.0}),
            ("rollout/0", "end_rollout", {"rollout_id": k}),
            ("trainer/0", "train", {"rollout_id": k}), ("trainer/1", "train", {"rollout_id": k}),
            ("buffer/0", "mark_trained", {"rollout_id": k})] + [
            (f"trainer/{r}", "sync_weights", {"weight_version": v + 1, "workers": ["rollout/0"], "rebuild": False})
            for r in (0, 1)]


def test_the_synchronous_schedule_sends_each_step_in_order(tmp_path):
    ctl = _controller(tmp_path)
    asyncio.run(loop.train_sync(ctl, 0))
    assert ctl.sent == _step(0, 0) + _step(1, 1) + _step(2, 2)
    assert ctl.version == 3 and [h["rollout_id"] for h in ctl.metrics.history] == [0, 1, 2]
    row = ctl.metrics.history[0]
    assert row["rollout/reward_mean"] == 0.25 and row["train/loss"] == 0.5 and row["weight_sync/bytes"] == 10
    assert row["weight_version"] == 0 and row["weight_version_after"] == 1


def test_the_asynchronous_schedule_generates_the_next_rollout_while_training(tmp_path):
    ctl = _controller(tmp_path, "--async-train")
    asyncio.run(loop.train_async(ctl, 0))
    sent = [(to, m, (b or {}).get("rollout_id")) for to, m, b in ctl.sent]
    # rollout k+1 is asked for before the trainers are done with k; rollouts are not ended while one follows
    for k in (0, 1):
        assert sent.index(("buffer/0", "start_rollout", k + 1)) < sent.index(("buffer/0", "mark_trained", k))
        assert ("rollout/0", "end_rollout", k) not in sent
    assert ("rollout/0", "end_rollout", 2) in sent, "the last rollout is ended"
    # the engines pause for each weight update (they generate meanwhile) and resume after it
    syncs = [i for i, s in enumerate(sent) if s[1] == "sync_weights"]
    assert len(syncs) == 6 and all(sent[i - 1][1] == "pause" or sent[i - 1][1] == "sync_weights" for i in syncs)
    assert [h["rollout_id"] for h in ctl.metrics.history] == [0, 1, 2] and ctl.version == 3


def test_debug_rollout_only_marks_rollouts_trained_without_training(tmp_path):
    ctl = _controller(tmp_path, "--debug-rollout-only")
    asyncio.run(loop.train_sync(ctl, 1))
    methods = [m for _, m, _ in ctl.sent]
    assert methods == ["start_rollout", "resume", "wait_rollout", "mark_trained"] * 2
    assert ctl.version == 0
