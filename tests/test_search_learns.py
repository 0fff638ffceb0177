"""The search example learns (examples/search/config.toml, CPU, the tiny model, the job's retriever): from a random
model that almost never searches, GRPO alone brings it to search before answering on the held-out questions --
facts no training question holds, so only a search answers them -- and to answer them right more often than a
guess; the numbers and ten episodes read are in examples/search/README.md. The run is then replayed: the rollout
worker's episodes come back identically from the recorded environment answers (a retrieval inside a step is not
recorded a second time)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(1800)   # (a job in a fixture: its time counts in the first test using it)
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent / "slime-actors"
STEPS = 100


def held_out(run: Path, step: int) -> list[dict]:
    return [json.loads(x) for x in (run / "evals" / f"heldout_step{step:06d}.jsonl").read_text().splitlines()]


def searched(rows: list[dict]) -> float:
    return sum("<search>" in r["response"] for r in rows) / len(rows)


def correct(rows: list[dict]) -> float:
    """Right answers: the answer's digit is the label (the reward 1; the shaping pays 0.2 at most)."""
    return sum(r["reward"] >= 1.0 for r in rows) / len(rows)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = tmp_path_factory.mktemp("search") / "run"
    res = subprocess.run([str(BIN), "train", "--config", "examples/search/config.toml", "--run-dir", str(run),
                          "--num-rollout", str(STEPS), "--progress", "false", "--use-tensorboard", "false"],
                         cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stderr[-4000:]
    return run


@pytest.mark.slow   # ~4 min on two cores
def test_the_tiny_model_learns_to_search_before_answering(run):
    before, after = held_out(run, 0), held_out(run, STEPS)
    assert len(before) == len(after) == 26
    # before: the random model does not search, and gets nothing
    assert searched(before) <= 0.2 and sum(r["reward"] for r in before) / 26 <= 0.05
    # after: it searches first on (nearly) every held-out question, and answers right well above a guess (1 in 10;
    # 10 and 11 of the 26 in the runs examples/search/README.md reports)
    assert searched(after) >= 0.8
    assert correct(after) >= 0.25
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    first, last = rows[:10], rows[-10:]

    def mean(rs, k):
        return sum(r[f"rollout/env/{k}"] for r in rs) / len(rs)
    assert mean(last, "searched") > mean(first, "searched") + 0.5     # the share of training episodes that search
    assert mean(last, "correct") > mean(first, "correct") + 0.15      # and of those answered right, rising
    assert all(r["rollout/env/recall"] <= r["rollout/env/searched"] for r in rows)


@pytest.mark.slow
def test_the_search_runs_rollout_worker_replays_identically(run):
    from slime_actors.traces.reader import TraceRun
    from slime_actors.traces.replay import replay
    names = {e.name for e in TraceRun(run).events("rollout/0") if e.ev == "input"}
    assert {"env.step", "env.tool"} <= names
    assert "retriever.retrieve" not in names      # the searches ran inside recorded steps: recorded as those
    rep = replay(str(run), "rollout/0")
    assert rep.identical, rep.render()
