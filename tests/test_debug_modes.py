"""slime's debugging paths, end to end on CPU (tiny model, 2 steps each):

  --debug-rollout-only --save-debug-rollout-data DIR    rollouts only (no training step, weights stay at version 0),
                                                        each rollout saved as DIR/rollout_00000K.msgpack
  --debug-train-only --load-debug-rollout-data DIR      training on exactly those samples, with no rollout worker,
                                                        no reward worker and no engine at all
"""

import json
import subprocess
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest

from slime_actors.config import ConfigError, debug_rollout_path, parse_config
from slime_actors.traces.query import trained_batches
from slime_actors.traces.reader import TraceRun
from slime_actors.types import batch_as_lists

pytestmark = pytest.mark.slow  # two short training jobs (~1 min each on 2 CPU cores)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent / "slime-actors"
FLAGS = ["--hf-checkpoint", "tiny:digits", "--input-key", "input", "--label-key", "label",
         "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--global-batch-size", "16",
         "--micro-batch-size", "16", "--rollout-max-response-len", "1", "--lr", "3e-3", "--num-rollout", "2",
         "--custom-rm-path", "examples/debugging/rewards.py:partial_credit", "--heartbeat-interval", "2",
         "--use-tensorboard", "false", "--progress", "false"]


def train(run_dir, *flags):
    res = subprocess.run([str(BIN), "train", "--run-dir", str(run_dir), *FLAGS, *flags], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    return res


def metrics(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("debug")
    train(d / "rollout-only", "--prompt-data", "examples/digits/train.jsonl", "--debug-rollout-only",
          "--save-debug-rollout-data", str(d / "data"))
    return d


def test_rollout_only_generates_and_saves_without_training(saved):
    files = sorted((saved / "data").iterdir())
    assert [f.name for f in files] == ["rollout_000000.msgpack", "rollout_000001.msgpack"]
    for k, f in enumerate(files):
        data = msgpack.unpackb(f.read_bytes(), raw=False)
        assert data["rollout_id"] == k and len(data["samples"]) == 16
        assert all(s["reward"] is not None and len(s["response_tokens"]) == 1 for s in data["samples"])
        assert len({s["group_index"] for s in data["samples"]}) == 4
    steps = metrics(saved / "rollout-only")
    assert [s["rollout_id"] for s in steps] == [0, 1]
    assert all(s["weight_version_after"] == 0 for s in steps)  # nothing was trained, no weights were pushed
    assert not any(k.startswith("train/") for s in steps for k in s)
    run = TraceRun(saved / "rollout-only")
    sent = [m for m in run.messages().values() if m.header["from"] == "controller/0"]
    assert not [m for m in sent if m.method in ("train", "sync_weights")]
    assert sorted(m.send.body()["rollout_id"] for m in sent if m.method == "mark_trained") == [0, 1]


def test_train_only_trains_on_the_saved_rollouts_with_no_engine(saved):
    run_dir = saved / "train-only"
    train(run_dir, "--debug-train-only", "--load-debug-rollout-data", str(saved / "data"))
    run = TraceRun(run_dir)
    assert not [a for a in run.actors() if a.startswith(("rollout/", "reward/"))], run.actors()
    assert not list((run_dir / "logs").glob("engine-*")) and not list((run_dir / "logs").glob("rollout-*"))
    steps = metrics(run_dir)
    assert [s["rollout_id"] for s in steps] == [0, 1] and steps[-1]["weight_version_after"] == 2
    assert all("train/loss" in s and "train/grad_norm" in s for s in steps)
    # each step trained on exactly the samples saved for it: rollout 0's shard pulled (get_batch), rollout 1's asked
    # for ahead (wait_batch, after training on rollout 0) -- the batch the controller's train named
    pulled = sorted(m.send.body()["rollout_id"] for m in run.messages().values() if m.method == "get_batch")
    ahead = sorted(m.send.body()["rollout_id"] for m in run.messages().values() if m.method == "wait_batch")
    assert pulled == [0] and ahead == [1]       # (none asked for past the last rollout)
    batches = {k: batch_as_lists(b) for k, b in trained_batches(run).items()}   # (it comes packed)
    assert sorted(batches) == [0, 1]
    for k, batch in batches.items():
        saved_samples = msgpack.unpackb(debug_rollout_path(str(saved / "data"), k).read_bytes(),
                                        raw=False)["samples"]
        # (the batch came packed: log-probs as float32, what the RL update takes them as)
        want = {s["index"]: (s["prompt_tokens"] + s["response_tokens"], s["reward"], s["loss_mask"],
                             np.asarray(s["rollout_log_probs"], dtype=np.float32).tolist()) for s in saved_samples}
        got = {i: (t, r, m, lp) for i, t, r, m, lp in zip(batch["sample_index"], batch["tokens"], batch["rewards"],
                                                        batch["loss_masks"], batch["rollout_log_probs"])}
        assert got == want
    assert steps[0]["rollout/reward_mean"] == pytest.approx(
        sum(s["reward"] for s in msgpack.unpackb(debug_rollout_path(str(saved / "data"), 0).read_bytes(),
                                                 raw=False)["samples"]) / 16)


def test_bad_debug_flags_are_clear_errors(saved, tmp_path):
    base = FLAGS[:FLAGS.index("--custom-rm-path")] + ["--rm-type", "exact_match"]

    def err(*flags):
        with pytest.raises(ConfigError) as exc:
            parse_config(base + list(flags))
        return str(exc.value)

    assert "needs --load-debug-rollout-data" in err("--debug-train-only")
    assert "exclude each other" in err("--debug-train-only", "--debug-rollout-only", "--load-debug-rollout-data",
                                       str(saved / "data"))
    assert "no saved rollout 0 at" in err("--debug-train-only", "--load-debug-rollout-data", str(tmp_path / "none"))
    assert "no saved rollout 5 at" in err("--debug-train-only", "--load-debug-rollout-data", str(saved / "data"),
                                          "--start-rollout-id", "5")
    # slime's template form and a file name form name the same files as a directory
    data = saved / "data"
    assert debug_rollout_path(str(data / "rollout_{rollout_id:06d}.msgpack"), 1) == data / "rollout_000001.msgpack"
    assert debug_rollout_path(str(data), 1) == data / "rollout_000001.msgpack"
    assert debug_rollout_path(str(tmp_path / "r.msgpack"), 3) == tmp_path / "r_000003.msgpack"
    cfg = parse_config(base + ["--debug-train-only", "--load-debug-rollout-data", str(data)])
    assert cfg.data.prompt_data is None and cfg.debug.debug_train_only


def test_a_saved_rollout_that_is_not_one_is_named(saved, tmp_path):
    """A later rollout missing or corrupt stops the job with the file's name (checked by the controller)."""
    import asyncio

    from slime_actors.actors.controller import Controller

    (tmp_path / "rollout_000000.msgpack").write_bytes(b"not msgpack at all")
    cfg = parse_config(FLAGS + ["--debug-train-only", "--load-debug-rollout-data", str(saved / "data")])
    cfg.debug.load_debug_rollout_data = str(tmp_path)
    ctl = Controller(0, args=cfg.to_dict())

    async def no_buffer(*a, **kw):
        raise AssertionError("the buffer is not asked for a bad file")
    ctl.ask = no_buffer
    with pytest.raises(ValueError, match="rollout_000000.msgpack is not a saved rollout"):
        asyncio.run(ctl.debug_data.load(0))
    with pytest.raises(FileNotFoundError, match="no saved rollout 1 at .*rollout_000001.msgpack"):
        asyncio.run(ctl.debug_data.load(1))
