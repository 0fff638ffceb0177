"""The multi-agent example (examples/multi_agent) in real jobs on CPU with the tiny model: solvers, rewriters and a
selector per task, every agent's turn a sample of its own. Its per-role samples reach the trainer -- each with its
role, its episode's prompt group, its own loss mask and log-probs, numbered by the buffer --, advantages are formed
per (prompt group, role), the per-role metrics are logged; with --frozen-engine-checkpoint a second engine plays the
selector (its turns are not trained), and the rollout worker replays identically from its trace in both cases."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(1200)   # (a job in a fixture: its time counts in the first test using it)
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent / "slime-actors"
PROMPTS, N = 4, 2
PER_EPISODE = {"solver": 2, "rewriter": 2, "selector": 1}      # examples/multi_agent/agents.py
FLAGS = ["--config", "examples/multi_agent/config.toml", "--num-rollout", "2", "--rollout-batch-size", str(PROMPTS),
         "--n-samples-per-prompt", str(N), "--global-batch-size", "8", "--eval-interval", "0",
         "--skip-eval-before-train", "--progress", "false", "--use-tensorboard", "false", "--heartbeat-interval", "2"]


def train(run: Path, *extra: str) -> Path:
    res = subprocess.run([str(BIN), "train", "--run-dir", str(run), *FLAGS, *extra], cwd=ROOT, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    return run


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return train(tmp_path_factory.mktemp("ma") / "shared")


@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    return train(tmp_path_factory.mktemp("ma") / "frozen", "--frozen-engine-checkpoint", "tiny:digits")


def batches(run: Path) -> dict[int, dict]:
    """What trainer/0 trained on in each step (pulled, or asked for ahead), as lists."""
    from slime_actors.traces.query import trained_batches
    from slime_actors.traces.reader import TraceRun
    from slime_actors.types import batch_as_lists
    return {k: batch_as_lists(b) for k, b in trained_batches(TraceRun(run)).items()}   # (it comes packed)


def submitted(run: Path) -> list[dict]:
    """The training groups as rollout/0 handed them in (before the buffer numbered the samples episodes added)."""
    from slime_actors.traces.reader import TraceRun
    return [b for e in TraceRun(run).events("buffer/0") if e.ev == "recv" and e.method == "submit"
            and (b := e.body())["work_id"].startswith("train")]


def metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def check_batches(run: Path, roles: dict[str, int]) -> None:
    per_episode = sum(roles.values())
    got = batches(run)
    assert sorted(got) == [0, 1]
    for k, b in got.items():
        n = len(b["tokens"])
        assert n == PROMPTS * N * per_episode
        assert Counter(b["roles"]) == {r: PROMPTS * N * c for r, c in roles.items()}
        assert len(set(b["sample_index"])) == n                      # every sample numbered, once
        # each (prompt group, role) is an advantage group of its own: N episodes' turns of that role
        pairs = Counter(zip(b["group_index"], b["roles"]))
        assert len(pairs) == PROMPTS * len(roles) and set(pairs.values()) == {N * c for c in roles.values()}
        for toks, p, r, mask, lp in zip(b["tokens"], b["prompt_lengths"], b["response_lengths"], b["loss_masks"],
                                        b["rollout_log_probs"]):
            assert len(toks) == p + r and len(mask) == r == len(lp) == 1
            assert mask == [1] and lp[0] < 0                       # the agent's own token, with the engine's log-prob
    # the trainer normalized per (prompt group, role)
    for row in metrics(run):
        assert row["train/advantage_groups"] == PROMPTS * len(roles)


@pytest.mark.slow   # two short jobs (~1 min each)
def test_every_agents_turns_reach_the_trainer_as_samples_of_their_role(shared):
    check_batches(shared, PER_EPISODE)
    # the samples as handed in: the episode's first sample stands for the issued one; the others name it
    for g in submitted(shared):
        own = [s for s in g["samples"] if "episode_of" not in s["metadata"]]
        added = [s for s in g["samples"] if "episode_of" in s["metadata"]]
        assert len(own) == N and len(added) == N * (sum(PER_EPISODE.values()) - 1)
        assert {s["metadata"]["episode_of"] for s in added} == {s["index"] for s in own}
        assert all(s["index"] == -1 for s in added)                   # numbered by the buffer, not the worker
    row = metrics(shared)[-1]
    for role, c in PER_EPISODE.items():
        assert row[f"rollout/role/{role}/samples"] == PROMPTS * N * c
        assert f"rollout/role/{role}/reward_mean" in row and row[f"rollout/role/{role}/response_len_mean"] == 1.0
    assert "rollout/env/final_correct" in row


@pytest.mark.slow
def test_a_frozen_engine_plays_the_selector(frozen):
    from slime_actors.traces.reader import TraceRun
    check_batches(frozen, {"solver": 2, "rewriter": 2})
    names = Counter(e.name for e in TraceRun(frozen).events("rollout/0") if e.ev == "input")
    # a selector turn per episode: two training rollouts, and the final evaluation's (the digits' held-out set)
    assert names["frozen.generate"] >= 2 * PROMPTS * N
    assert names["frozen.launch"] == 1
    assert "rollout/role/selector/samples" not in metrics(frozen)[-1]
    assert (frozen / "logs" / "engine-0-frozen.log").exists()


@pytest.mark.slow
@pytest.mark.parametrize("which", ["shared", "frozen"])
def test_the_multi_agent_rollout_worker_replays_identically(which, request):
    from slime_actors.traces.replay import replay
    run = request.getfixturevalue(which)
    for actor in ("rollout/0", "buffer/0"):
        rep = replay(str(run), actor)
        assert rep.identical, rep.render()


@pytest.mark.parametrize("config", ["examples/multi_agent/config.toml", "examples/multi_agent/smollm2.toml"])
def test_the_multi_agent_recipes_parse_and_name_a_loadable_function(config):
    """The CPU example and the one-GPU SmolLM2 recipe (scripts/agents_gpu_run.sh multi_agent)."""
    from slime_actors.actors.rollout_generate import generate_style
    from slime_actors.config import parse_config
    from slime_actors.plugins import load_function
    cfg = parse_config(["--config", config])
    path = cfg.rollout.custom_generate_function_path
    assert generate_style(load_function(path), path) == "engine"
    frozen = parse_config(["--config", config, "--frozen-engine-checkpoint", "tiny:digits"])
    assert frozen.engine.frozen_engine_checkpoint == "tiny:digits"


def test_a_frozen_checkpoint_that_is_not_there_is_named_before_anything_starts(tmp_path):
    res = subprocess.run([str(BIN), "train", "--run-dir", str(tmp_path / "run"), *FLAGS, "--frozen-engine-checkpoint",
                          str(tmp_path / "nowhere")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    assert f"--frozen-engine-checkpoint {tmp_path / 'nowhere'}: no such directory" in res.stderr, res.stderr[-2000:]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
