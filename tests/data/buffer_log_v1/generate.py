"""Writes this directory's buffer log fixture: a run directory's buffer/ files (initial and snapshot files, the
event log) and a checkpoint's buffer.msgpack, as the buffer of commit b80bb96 (before the buffer was split into a
state machine and an event log) wrote them, plus the state that buffer held (`live.msgpack`) and the state it
restored from them (`restored.msgpack`). tests/test_buffer_state.py restores the files with today's code and
compares.

It drives the buffer only through its messages (leases, submissions, a partial return, a failed group, a released
worker, a carried-over group, a trained rollout, an evaluation, a checkpoint), so it runs against any version:

    PYTHONPATH=<a checkout of that commit> python tests/data/buffer_log_v1/generate.py OUT_DIR
"""

import asyncio
import json
import shutil
import sys
import tempfile
from pathlib import Path

import msgpack

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/, for helpers

from helpers import LoopThread  # noqa: E402
from slime_actors.actors.base import Actor  # noqa: E402
from slime_actors.actors.buffer import Buffer  # noqa: E402
from slime_actors.config import parse_config  # noqa: E402
from slime_actors.models.tiny import make_tiny_model  # noqa: E402
from slime_actors.runtime import RuntimeConfig  # noqa: E402


class Worker(Actor):
    role = "rollout"


def finish(group, rewards=None, version=0, status="completed"):
    out = []
    for j, s in enumerate(group["samples"]):
        s = dict(s)
        s.update(response_tokens=s["response_tokens"] + [5], loss_mask=s["loss_mask"] + [1],
                 rollout_log_probs=s["rollout_log_probs"] + [-0.5], response=s["response"] + "3",
                 reward=1.0 if rewards is None else rewards[j], status=status, weight_version=version,
                 weight_versions=s["weight_versions"] + [version])
        out.append(s)
    return out


def main(out: Path) -> None:
    work = Path(tempfile.mkdtemp())
    data = work / "prompts.jsonl"
    shutil.copy(HERE / "prompts.jsonl", data)
    ev = work / "eval.jsonl"
    shutil.copy(HERE / "eval.jsonl", ev)
    tiny = str(make_tiny_model(work / "tiny"))
    args = parse_config(["--prompt-data", str(data), "--hf-checkpoint", tiny, "--rm-type", "exact_match",
                         "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--input-key", "input",
                         "--label-key", "label", "--over-sampling-batch-size", "6", "--partial-rollout",
                         "--eval-prompt-data", "ev", str(ev), "--n-samples-per-eval-prompt", "1"]).to_dict()
    run_dir = work / "run"
    run_dir.mkdir()
    lt = LoopThread()
    b = Buffer(0, args=args)
    ep = lt.call(b.start(RuntimeConfig(run_dir=str(run_dir), curve=False)))
    w1, w2 = Worker(1), Worker(2)
    for w in (w1, w2):
        lt.call(w.start(RuntimeConfig(run_dir=str(run_dir), curve=False, static_peers={"buffer/0": ep})))

    def ask(w, method, body):
        return lt.call(w.ask("buffer/0", method, body, timeout=10))

    def submit(w, g, **kw):
        return ask(w, "submit", {"worker": w.name, "work_id": g["work_id"], "samples": finish(g, **kw)})

    assert ask(w1, "start_rollout", {"rollout_id": 0})["new_groups"] == 6
    g0, g1, g2 = ask(w1, "get_work", {"worker": "rollout/1", "max_groups": 3})["groups"]
    g3, g4 = ask(w2, "get_work", {"worker": "rollout/2", "max_groups": 2})["groups"]
    assert submit(w1, g0)["accepted"]
    assert submit(w1, g1, rewards=[0.0, 1.0])["accepted"]
    assert not submit(w2, g0)["accepted"]                          # refused: done already
    partial = finish(g2, status="aborted")
    for s in partial:
        s["reward"] = None
    assert ask(w1, "return_work", {"worker": "rollout/1", "work_id": g2["work_id"], "samples": partial,
                                   "reason": "aborted"})["partial"]
    assert submit(w2, g3, status="failed")["outcome"] == "failed"
    assert ask(w1, "release_worker", {"worker": "rollout/2"})["requeued"] == 1          # g4
    more = ask(w1, "get_work", {"worker": "rollout/1", "max_groups": 10})["groups"]
    assert [g["work_id"] for g in more] == [g4["work_id"], g2["work_id"], "train-5"]
    assert len(more[1]["samples"][0]["response_tokens"]) == 1                           # the partial response
    g4b, g2b, g5 = more
    assert submit(w1, g2b)["accepted"] and submit(w1, g4b)["accepted"]
    st = ask(w1, "wait_rollout", {"rollout_id": 0, "timeout": 5.0})
    assert st["complete"] and st["groups"] == 4
    assert submit(w1, g5, rewards=[1.0, 0.0])["accepted"]                               # carried over
    ask(w1, "get_batch", {"rollout_id": 0, "rank": 0, "world_size": 1})
    ask(w1, "mark_trained", {"rollout_id": 0})
    assert ask(w1, "start_rollout", {"rollout_id": 1, "weight_version": 1})["new_groups"] == 5
    assert ask(w1, "start_rollout", {"rollout_id": 0, "kind": "eval", "name": "ev"})["new_groups"] == 3
    evals = ask(w2, "get_work", {"worker": "rollout/2", "max_groups": 2})["groups"]
    assert [g["kind"] for g in evals] == ["eval", "eval"]
    assert submit(w2, evals[0], version=1)["accepted"]
    ask(w1, "save", {"path": str(work / "ckpt")})
    train = ask(w1, "get_work", {"worker": "rollout/1", "max_groups": 3})["groups"]
    assert [g["kind"] for g in train] == ["eval", "train", "train"]
    assert submit(w1, train[1], version=1)["accepted"]
    live = b._snapshot_state()
    lt.call(b.stop())

    out.mkdir(parents=True, exist_ok=True)
    (out / "buffer").mkdir(exist_ok=True)
    (out / "ckpt").mkdir(exist_ok=True)
    for name in ("initial.msgpack", "snapshot.msgpack", "log.msgpack"):
        shutil.copy(run_dir / "buffer" / name, out / "buffer" / name)
    shutil.copy(work / "ckpt" / "buffer.msgpack", out / "ckpt" / "buffer.msgpack")
    (out / "live.msgpack").write_bytes(msgpack.packb(live, use_bin_type=True))

    b2 = Buffer(0, args=args)   # what that version restores from its files
    lt.call(b2.start(RuntimeConfig(run_dir=str(run_dir), curve=False)))
    restored = b2._snapshot_state()
    lt.call(b2.stop())
    (out / "restored.msgpack").write_bytes(msgpack.packb(restored, use_bin_type=True))
    (out / "settings.json").write_text(json.dumps({"partial_rollout": True, "rollout_batch_size": 4,
                                                   "n_samples_per_prompt": 2, "over_sampling_batch_size": 6,
                                                   "n_samples_per_eval_prompt": 1}, indent=1) + "\n")
    for w in (w1, w2):
        lt.call(w.stop())
    lt.close()
    shutil.rmtree(work, ignore_errors=True)
    asyncio.set_event_loop(None)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
