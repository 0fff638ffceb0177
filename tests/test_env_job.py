"""An environment in a real job (the digits task, CPU, local engine): every episode multi-turn, a tool called through
the API, some episodes raising. The run goes on (those samples fail, their groups are recorded as failed, counted
and replaced), the samples that reach the buffer line up (observations masked, the model's tokens with the
engine's log-probs), and `slime-actors replay` of the rollout worker reproduces every episode identically from the
recorded environment answers. With --env-error stop, the first failure ends the job with the environment's error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent / "slime-actors"
FLAGS = ["--hf-checkpoint", "tiny:digits", "--prompt-data", "examples/digits/train.jsonl", "--input-key", "input",
         "--label-key", "label", "--rm-type", "exact_match", "--rollout-batch-size", "4", "--n-samples-per-prompt",
         "4", "--global-batch-size", "16", "--micro-batch-size", "16", "--rollout-max-response-len", "16",
         "--advantage-estimator", "grpo", "--lr", "3e-3", "--num-rollout", "2", "--heartbeat-interval", "2",
         "--use-tensorboard", "false", "--progress", "false", "--max-turns", "3",
         # a turn ends at the first digit the model writes (the random model seldom ends one by itself)
         "--rollout-stop-token-ids", *[str(i) for i in range(3, 13)]]

ENV = '''
from slime_actors.environments import Env, Step


def lookup(prompt):
    return str(sum(int(c) for c in prompt if c.isdigit()) % 10)


class Flaky(Env):
    """Every episode: two observations, then done; sample indices in `fail_every` raise in their second turn; even
    samples are rewarded here (0.25 or 0.75), odd ones by the job's reward function (0 or 1)."""

    async def reset(self, sample):
        self.episode.state["turns"] = 0
        return None

    async def step(self, sample, turn):
        every = self.kwargs["fail_every"]
        if turn.index == 1 and sample.index % every == 2 % every:
            raise ValueError("the lookup service is down")
        sample.metadata["seen"] = sample.metadata.get("seen", 0) + 1
        result = await self.call_tool("lookup", lookup, str(sample.prompt))
        reward = 0.25 + 0.5 * (str(sample.label) in turn.text) if sample.index % 2 == 0 else None
        return Step(f"result : {result}", done=turn.index >= 2, reward=reward if turn.index >= 2 else None)
'''


def train(run: Path, env_file: Path, *extra: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN), "train", "--run-dir", str(run), *FLAGS, "--rollout-interaction-env-path",
                           f"{env_file}:Flaky", *extra], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    d = tmp_path_factory.mktemp("envjob")
    env_file = d / "flaky_env.py"
    env_file.write_text(ENV)
    run = d / "run"
    res = train(run, env_file, "--env-kwargs", '{"fail_every": 7}')
    assert res.returncode == 0, res.stderr[-4000:]
    return run, env_file, res


def _submitted(run: Path) -> list[dict]:
    """The groups rollout/0 handed in, as the buffer received them."""
    from slime_actors.traces.reader import TraceRun
    return [e.body() for e in TraceRun(run).events("buffer/0") if e.ev == "recv" and e.method == "submit"]


@pytest.mark.slow  # the module's recorded run (~1 min)
def test_a_failing_environment_fails_its_samples_and_the_run_goes_on(recorded):
    run, _, res = recorded
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [0, 1]
    assert sum(r["rollout/failed"] for r in rows) >= 1      # counted, and replaced (both steps completed)
    assert "environment Flaky.step (sample " in res.stderr and ", turn 1) raised ValueError: the lookup service is " \
           "down" in res.stderr
    failed = [s for g in _submitted(run) for s in g["samples"] if s["status"] == "failed"]
    assert failed and all(s["index"] % 7 == 2 for s in failed)
    assert all(s["error"] == f"environment Flaky.step (sample {s['index']}, turn 1) raised ValueError: the lookup "
               "service is down" for s in failed)


@pytest.mark.slow
def test_the_samples_that_reach_the_buffer_line_up(recorded):
    from transformers import AutoTokenizer

    from slime_actors.models.resolve import resolve_checkpoint
    run, _, _ = recorded
    tok = AutoTokenizer.from_pretrained(resolve_checkpoint("tiny:digits", run.parent / ".models"))
    samples = [s for g in _submitted(run) for s in g["samples"] if s["status"] != "failed"]
    assert len(samples) >= 32
    multi = 0
    for s in samples:
        n = len(s["response_tokens"])
        assert len(s["loss_mask"]) == n == len(s["rollout_log_probs"]), s["index"]
        assert s["metadata"]["turns"] >= 1 and s["metadata"]["seen"] == s["metadata"]["turns"]
        masked = [t for t, m in zip(s["response_tokens"], s["loss_mask"]) if m == 0]
        trained_lp = [lp for lp, m in zip(s["rollout_log_probs"], s["loss_mask"]) if m == 1]
        assert all(lp < 0 for lp in trained_lp)
        assert all(lp == 0.0 for lp, m in zip(s["rollout_log_probs"], s["loss_mask"]) if m == 0)
        if s["metadata"]["turns"] > 1:
            multi += 1
            assert tok.decode(masked).startswith("result : ")   # the observation, not trained
        if s["index"] % 2 == 0 and s["metadata"]["turns"] == 3:
            assert s["reward"] in (0.25, 0.75), s          # the environment's reward stands
        else:
            assert s["reward"] in (0.0, 1.0), s            # exact_match scored the rest
        assert len(s["weight_versions"]) == s["metadata"]["turns"]
    assert multi >= len(samples) // 2


@pytest.mark.slow
def test_the_multi_turn_rollout_worker_replays_identically(recorded):
    from slime_actors.traces.reader import TraceRun
    from slime_actors.traces.replay import replay
    run, env_file, _ = recorded
    inputs = [e for e in TraceRun(run).events("rollout/0") if e.ev == "input"]
    names = {e.name for e in inputs}
    assert {"env.setup", "env.reset", "env.step", "env.close", "env.tool", "env.teardown"} <= names
    # the replay does not run the environment (its answers are recorded): one that would answer otherwise changes
    # nothing
    kept = env_file.read_text()
    env_file.write_text(kept + BROKEN)
    try:
        for actor in ("rollout/0", "buffer/0"):
            rep = replay(str(run), actor)
            assert rep.identical, rep.render()
            assert rep.counts["compared"] >= 8
    finally:
        env_file.write_text(kept)


BROKEN = """
class Flaky(Env):
    async def setup(self):
        raise RuntimeError("a replay must not set me up")

    async def step(self, sample, turn):
        return Step("something else", done=True, reward=-1.0)
"""


@pytest.mark.slow
def test_env_error_stop_ends_the_job_with_the_environments_error(tmp_path):
    env_file = tmp_path / "flaky_env.py"
    env_file.write_text(ENV)
    res = train(tmp_path / "run", env_file, "--env-kwargs", '{"fail_every": 1}', "--env-error", "stop")
    assert res.returncode != 0
    assert "environment Flaky.step (sample " in res.stderr and "raised ValueError: the lookup service is down" in \
        res.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not (tmp_path / "run" / "metrics.jsonl").read_text()
