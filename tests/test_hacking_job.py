"""Reward-hacking alarms in a running job (issue 21): the buffer reports on every scored group of a training rollout,
the controller logs hack/* with the step's metrics and writes each tripped alarm to RUN_DIR/alarms.jsonl with one
warning, --hack-alarms stop ends the run with a checkpoint, off computes nothing. (The honest `make train` job
tripping none is checked in tests/test_rl_loop.py's main-job test.)"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from slime_actors.actors.base import Actor
from slime_actors.actors.buffer import Buffer
from slime_actors.config import ConfigError, parse_config
from slime_actors.launch.job_config import build_job_config
from slime_actors.monitor import hacking
from slime_actors.monitor.alarms import label_is_answer, read_alarms, record_hack_alarms, report_wire, trim_alarms
from slime_actors.runtime import RuntimeConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "digits" / "config.toml"
BIN = Path(sys.executable).parent / "slime-actors"
PROMPTS = ROOT / "examples" / "digits" / "train.jsonl"


def cfg(*flags):
    """The job's config as a launcher builds it (flags checked, the monitor's included)."""
    return build_job_config(["--prompt-data", str(PROMPTS), "--hf-checkpoint", "tiny:digits", "--rm-type", "math",
                         *flags])[0]


# ------------------------------------------------------------------------------------------------ the flags
def test_hack_alarm_flags_default_and_bad_values_are_named():
    c = cfg()
    assert (c.monitor.hack_alarms, c.monitor.hack_alarm_thresholds, c.monitor.hack_alarms_ignore) == \
        ("warn", None, None)
    for flags, needle in ((["--hack-alarms", "loud"], "invalid choice: 'loud'"),
                          (["--hack-alarms", "stop", "--no-rolling-save"], "this job keeps none: give --save DIR"),
                          (["--hack-alarm-thresholds", "rewarded_truncatd=0.7"], "unknown name 'rewarded_truncatd'"),
                          (["--hack-alarm-thresholds", "rewarded_truncated=1.5"], "must be in [0, 1]"),
                          (["--hack-alarm-thresholds", "min_samples=two"], "min_samples='two' is not a whole"),
                          (["--hack-alarms-ignore", "collapse", "jumps"], "unknown alarm(s) jumps")):
        with pytest.raises(ConfigError) as exc:
            cfg(*flags)
        assert needle in str(exc.value), (flags, str(exc.value))
    c = cfg("--hack-alarms", "stop", "--save", "ckpt", "--hack-alarm-thresholds", "rewarded_truncated=0.7",
            "--hack-alarms-ignore", "jump")
    assert c.monitor.hack_alarms == "stop" and c.monitor.hack_alarms_ignore == ["jump"]


def test_the_thresholds_are_parsed_once_by_the_config_and_travel_typed():
    """--hack-alarm-thresholds is parsed where the config checks its values (JobConfig.validate), into
    cfg.hack_thresholds; a process that reads the job's config (job.json: the flag's text) gets the same typed
    value, and the buffer's monitor is built from it. A bad value is the config's error, launcher or not."""
    from slime_actors.config import JobConfig, parse_config
    from slime_actors.hack_thresholds import HackThresholds
    from slime_actors.monitor.alarms import make_monitor
    c = cfg("--hack-alarm-thresholds", "rewarded_truncated=0.7,min_samples=16")
    assert c.hack_thresholds == HackThresholds(rewarded_truncated=0.7, min_samples=16)
    again = JobConfig.from_dict(c.to_dict())
    assert again.hack_thresholds == c.hack_thresholds and "hack_thresholds" not in c.to_dict()
    assert make_monitor(again).t is again.hack_thresholds
    assert cfg().hack_thresholds == HackThresholds()
    with pytest.raises(ConfigError, match="--hack-alarm-thresholds min_samples=0: .*min_samples must be a whole"):
        parse_config(["--prompt-data", str(PROMPTS), "--hack-alarm-thresholds", "min_samples=0"])


def test_hack_alarms_stop_without_save_uses_the_rolling_checkpoint(tmp_path):
    """--hack-alarms stop needs somewhere to save the checkpoint it ends the run with: --save, or -- without it --
    the rolling RUN_DIR/ckpt; refused when neither is there (--no-rolling-save, or RUN_DIR/ckpt holds other files)."""
    from slime_actors.checkpoints import save_root
    run = tmp_path / "run"
    c = cfg("--hack-alarms", "stop", "--run-dir", str(run))
    assert c.monitor.hack_alarms == "stop" and save_root(c) == run / "ckpt"
    (run / "ckpt").mkdir(parents=True)
    (run / "ckpt" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError) as exc:
        cfg("--hack-alarms", "stop", "--run-dir", str(run))
    assert "--hack-alarms stop saves a checkpoint when an alarm ends the run, to the rolling RUN_DIR/ckpt" \
        in str(exc.value) and "notes.txt" in str(exc.value)
    assert cfg("--hack-alarms", "stop", "--run-dir", str(run), "--save", str(tmp_path / "ckpt")).checkpoint.save


def test_the_monitor_knows_which_rewards_compare_with_a_literal_label():
    assert label_is_answer(cfg()) and label_is_answer(cfg("--rm-type", "boxed_exact_match"))
    assert not label_is_answer(cfg("--rm-type", "f1"))
    rm = f"{ROOT / 'examples' / 'debugging' / 'rewards.py'}:partial_credit"   # (a function path must name one)
    assert not label_is_answer(cfg("--custom-rm-path", rm))
    assert label_is_answer(cfg("--custom-rm-path", rm, "--hack-alarm-label-answer", "true"))
    assert not label_is_answer(cfg("--hack-alarm-label-answer", "false"))


# ------------------------------------------------------------------------------------------------ the buffer
class Worker(Actor):
    role = "rollout"


def buffer_args(tmp_path, *extra):
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"input": f"{i % 10} {i // 10} first =", "label": str(i % 10)}) + "\n"
                            for i in range(40)))
    return parse_config(["--prompt-data", str(data), "--hf-checkpoint", "tiny:digits", "--rm-type", "exact_match",
                         "--label-key", "label", "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
                         "--rollout-max-response-len",
                         "64", "--dynamic-sampling-filter-path", "slime_actors.filters.check_reward_nonzero_std",
                         *extra]).to_dict()


def scored(group, rewards, *, cut=False):
    out = []
    for s, r in zip(group["samples"], rewards):
        s = dict(s)
        n = 64 if cut else 3
        s.update(response_tokens=[5] * n, loss_mask=[1] * n, rollout_log_probs=[-0.5] * n, reward=r,
                 response="To find 3 * 7 you can multiply" if cut else s["label"],
                 status="truncated" if cut else "completed", finish_reason="length" if cut else "stop",
                 weight_version=0, weight_versions=[0])
        out.append(s)
    return out


def start_buffer(loop_thread, run_dir, args):
    b = Buffer(0, args=args)
    ep = loop_thread.call(b.start(RuntimeConfig(run_dir=run_dir, curve=False)))
    w = Worker(1)
    loop_thread.call(w.start(RuntimeConfig(run_dir=run_dir, curve=False, static_peers={"buffer/0": ep})))
    return b, lambda method, body, timeout=20: loop_thread.call(w.ask("buffer/0", method, body, timeout=timeout))


def fill_rollout(ask):
    """Rollout 0: one group the filter drops (both samples cut off at the limit and rewarded), then four honest
    groups (one right, one wrong answer each)."""
    ask("start_rollout", {"rollout_id": 0})
    first = ask("get_work", {"worker": "rollout/1", "max_groups": 1})["groups"][0]
    assert ask("submit", {"worker": "rollout/1", "work_id": first["work_id"],
                          "samples": scored(first, [1.0, 1.0], cut=True)})["outcome"] == "filtered"
    for _ in range(2):  # the three groups left, then the one that replaces the filtered group
        for g in ask("get_work", {"worker": "rollout/1", "max_groups": 10})["groups"]:
            assert ask("submit", {"worker": "rollout/1", "work_id": g["work_id"],
                                  "samples": scored(g, [1.0, 0.0])})["outcome"] == "done"


def test_the_buffer_reports_on_every_scored_group_once_and_keeps_it_across_a_restart(loop_thread, run_dir,
                                                                                       tmp_path):
    args = buffer_args(tmp_path)
    b, ask = start_buffer(loop_thread, run_dir, args)
    fill_rollout(ask)
    st = ask("wait_rollout", {"rollout_id": 0, "timeout": 10.0})
    assert st["complete"] and st["filtered"] == 1 and st["samples"] == 8
    hack = st["hack"]
    # the filtered group is part of what the model produced: 8 trained + 2 filtered samples; of the 6 rewarded
    # ones (4 honest, 2 filtered) the 2 filtered ones were cut off
    assert hack["metrics"]["hack/scored"] == 10.0
    assert hack["metrics"]["hack/rewarded_truncated"] == pytest.approx(2 / 6)
    assert hack["alarms"] == [] and hack["rollout_id"] == 0
    assert "rewarded_truncated" in hack["skipped"]           # 6 rewarded samples < 8: no statistics
    # asked again (a retried ask): the same report, not a second observation
    assert ask("wait_rollout", {"rollout_id": 0, "timeout": 10.0})["hack"] == hack
    assert b.hack_monitor.state_dict()["last_rollout"] == 0 and len(b.hack_monitor.history) == 1
    loop_thread.call(b.stop())
    # a restarted buffer has the report and the monitor's state back from its log
    b2, ask2 = start_buffer(loop_thread, run_dir, args)
    assert ask2("wait_rollout", {"rollout_id": 0, "timeout": 10.0})["hack"] == hack
    assert b2.hack_monitor.state_dict() == b.hack_monitor.state_dict()
    # once trained, the rollout's samples are gone and so is its report
    ask2("mark_trained", {"rollout_id": 0})
    assert "hack" not in ask2("wait_rollout", {"rollout_id": 0, "timeout": 10.0})


def test_wait_rollout_without_the_report_then_hack_report_gives_the_same_report_once(loop_thread, run_dir, tmp_path):
    """What the controller does (issue 33): wait_rollout(hack=false) replies without the report; the monitor
    starts on the complete rollout once every trainer rank has taken its shard (so it never delays a get_batch),
    and hack_report answers the report wait_rollout would have held -- observed once, the monitor's state moved
    once."""
    _, ask_ref = start_buffer(loop_thread, str(tmp_path / "ref"), buffer_args(tmp_path))
    fill_rollout(ask_ref)
    expected = ask_ref("wait_rollout", {"rollout_id": 0, "timeout": 10.0})["hack"]
    b, ask = start_buffer(loop_thread, run_dir, buffer_args(tmp_path))
    fill_rollout(ask)
    st = ask("wait_rollout", {"rollout_id": 0, "timeout": 10.0, "hack": False})
    assert st["complete"] and st["samples"] == 8 and "hack" not in st
    # two trainer ranks: before both have their shards, the monitor has not started and hack_report holds
    with pytest.raises(Exception, match="no reply within"):
        ask("hack_report", {"rollout_id": 0}, timeout=0.5)
    ask("get_batch", {"rollout_id": 0, "rank": 1, "world_size": 2})
    with pytest.raises(Exception, match="no reply within"):
        ask("dump_rollout", {"rollout_id": 0}, timeout=0.5)
    assert len(b.hack_monitor.history) == 0
    ask("get_batch", {"rollout_id": 0, "rank": 0, "world_size": 2})
    assert ask("hack_report", {"rollout_id": 0}) == expected
    assert len(ask("dump_rollout", {"rollout_id": 0})) == 8
    assert ask("hack_report", {"rollout_id": 0}) == expected   # (a retried ask: the same report)
    assert ask("wait_rollout", {"rollout_id": 0, "timeout": 10.0})["hack"] == expected
    assert len(b.hack_monitor.history) == 1
    ask("mark_trained", {"rollout_id": 0})
    assert ask("hack_report", {"rollout_id": 0}) is None       # trained: the report is gone
    with pytest.raises(Exception, match="rollout 1 is not complete"):
        ask("hack_report", {"rollout_id": 1})


def test_reports_whose_trainers_never_ask_go_ahead_after_the_bound_and_say_so(loop_thread, run_dir, tmp_path,
                                                                              monkeypatch):
    """A trainer that never takes its shard (a rank lost before it asked) does not hold the report forever: after
    REPORTS_WAIT_FOR_BATCH seconds it is computed all the same, with a warning naming the ranks that did ask."""
    from slime_actors.actors import buffer as buffer_mod
    monkeypatch.setattr(buffer_mod, "REPORTS_WAIT_FOR_BATCH", 0.3)
    b, ask = start_buffer(loop_thread, run_dir, buffer_args(tmp_path))
    warned: list = []
    real = b.log.warning
    monkeypatch.setattr(b.log, "warning", lambda ev, **kw: (warned.append((ev, kw)), real(ev, **kw)))
    fill_rollout(ask)
    ask("wait_rollout", {"rollout_id": 0, "timeout": 10.0, "hack": False})
    ask("get_batch", {"rollout_id": 0, "rank": 1, "world_size": 2})     # rank 0 never asks
    assert ask("hack_report", {"rollout_id": 0}, timeout=10)["rollout_id"] == 0
    assert len(ask("dump_rollout", {"rollout_id": 0}, timeout=10)) == 8
    said = [kw for ev, kw in warned if ev == "the trainers did not take their shards; the rollout's reports go ahead"]
    assert said and all(kw["ranks_served"] == [1] and kw["rollout_id"] == 0 for kw in said)


def test_the_reports_wait_for_no_trainer_with_debug_rollout_only_nor_after_a_rollback(loop_thread, run_dir,
                                                                                     tmp_path):
    """The reports hold only for trainers that will ask: with --debug-rollout-only none does (the controller takes
    the reports before it marks the rollout done), and a rollback lets go of the reports waiting on a rollout it
    discarded (their asker is gone)."""
    _, ask = start_buffer(loop_thread, str(tmp_path / "only"), buffer_args(tmp_path, "--debug-rollout-only"))
    fill_rollout(ask)
    ask("wait_rollout", {"rollout_id": 0, "timeout": 10.0, "hack": False})
    assert ask("hack_report", {"rollout_id": 0}, timeout=5)["rollout_id"] == 0
    assert len(ask("dump_rollout", {"rollout_id": 0}, timeout=5)) == 8

    b, ask = start_buffer(loop_thread, run_dir, buffer_args(tmp_path))
    fill_rollout(ask)
    ask("wait_rollout", {"rollout_id": 0, "timeout": 10.0, "hack": False})
    waiting = asyncio.run_coroutine_threadsafe(b._after_batch(0), loop_thread.loop)
    with pytest.raises(Exception, match="no reply within"):
        ask("dump_rollout", {"rollout_id": 0}, timeout=0.3)
    assert not waiting.done()
    assert ask("rollback", {"path": None, "if_ahead_of": 0, "reason": "test"})["rolled_back"]
    waiting.result(timeout=5)   # let go at once, not after REPORTS_WAIT_FOR_BATCH
    assert b._served == {} and b._batch_out == {}


def test_hack_alarms_off_computes_nothing(loop_thread, run_dir, tmp_path):
    b, ask = start_buffer(loop_thread, run_dir, buffer_args(tmp_path, "--hack-alarms", "off"))
    fill_rollout(ask)
    st = ask("wait_rollout", {"rollout_id": 0, "timeout": 10.0})
    assert st["complete"] and "hack" not in st and b.hack_monitor is None
    assert ask("hack_report", {"rollout_id": 0}) is None


def test_a_monitor_that_fails_never_stops_the_rollout(loop_thread, run_dir, tmp_path, monkeypatch):
    def boom(self, rollout_id, samples):
        raise RuntimeError("the monitor broke")
    monkeypatch.setattr(hacking.AlarmMonitor, "observe", boom)
    _, ask = start_buffer(loop_thread, run_dir, buffer_args(tmp_path))
    fill_rollout(ask)
    st = ask("wait_rollout", {"rollout_id": 0, "timeout": 10.0})
    assert st["complete"] and st["hack"] == {"rollout_id": 0, "error": "RuntimeError: the monitor broke"}
    log = Log()
    assert record_hack_alarms(run_dir, 0, st["hack"], log) == ({}, [])
    assert log.warnings == [("hack monitor could not read the rollout; no hack/* metrics for it",
                             {"rollout_id": 0, "error": "RuntimeError: the monitor broke"})]
    assert not (Path(run_dir) / "alarms.jsonl").exists()


# ------------------------------------------------------------------------------------------------ the controller
class Log:
    def __init__(self):
        self.warnings = []

    def warning(self, event, **kw):
        self.warnings.append((event, kw))


def test_record_hack_alarms_writes_each_alarm_with_its_sample_and_warns_once(tmp_path):
    mon = hacking.AlarmMonitor(max_response_len=12)
    from test_hacking_alarms import hack_rollout
    reports = [mon.observe(r, hack_rollout(r)) for r in range(5)]
    log = Log()
    metrics, tripped = record_hack_alarms(tmp_path, 4, report_wire(reports[4]), log)
    assert metrics == reports[4].metrics and {a["name"] for a in tripped} == set(hacking.ALARMS) - {"prompt_blind"}
    rows = read_alarms(tmp_path)
    assert [r["signal"] for r in rows] == [a.name for a in reports[4].alarms]
    for row, a in zip(rows, reports[4].alarms):
        assert (row["rollout_id"], row["value"], row["threshold"], row["metric"]) == (4, a.value, a.threshold,
                                                                                        a.metric)
        ex = row["example"]
        assert ex["response"] and ex["prompt"] and ex["reward"] == 1.0
    # one warning per alarm, naming it, the rollout and the sample
    assert len(log.warnings) == len(rows)
    event, kw = log.warnings[0]
    assert event.startswith("hack alarm rewarded_truncated: reward for cut-off responses")
    assert "rollout 4" in event and f"sample {rows[0]['example']['index']}" in event
    assert kw["rollout_id"] == 4 and kw["sample"] == rows[0]["example"]["index"]
    # nothing tripped, or no report (off; a trained rollout): no file line, no warning
    assert record_hack_alarms(tmp_path, 0, {"metrics": reports[0].metrics, "alarms": []}, log) == \
        (reports[0].metrics, [])
    assert record_hack_alarms(tmp_path, 5, None, log) == ({}, [])
    assert len(read_alarms(tmp_path)) == len(rows) and len(log.warnings) == len(rows)
    # a resumed run drops what it does again; a torn last line (a crash) is skipped
    with open(tmp_path / "alarms.jsonl", "a") as f:
        f.write('{"rollout_id": 3, "sig')
    assert trim_alarms(tmp_path, before=4) == len(rows)
    assert read_alarms(tmp_path) == [] and trim_alarms(tmp_path, before=4) == 0


def test_a_stats_entry_that_is_not_a_report_is_a_warning(tmp_path):
    log = Log()
    assert record_hack_alarms(tmp_path, 2, ["not", "a", "report"], log) == ({}, [])
    assert log.warnings[0][0] == "hack monitor: ignored a stats entry that is not a table"


# ------------------------------------------------------------------------------------------------ whole jobs (CPU)
HACK_RM = """\
def reward(args, sample):
    # built to be gamed: pays for a response cut off at the length limit, whatever it says
    return 1.0 if sample.finish_reason == "length" else 0.0
"""
EVERY_FOURTH = """\
def keep(args, samples):
    return samples[0].group_index % 4 != 1
"""


def train(run_dir, *flags, timeout=600):
    cmd = [str(BIN), "train", "--config", str(CONFIG), "--run-dir", str(run_dir), "--progress", "false",
           "--eval-interval", "0", "--rollout-max-response-len", "12", *flags]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if p.returncode != 0:
        raise AssertionError(f"train failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")
    return p


def metrics(run_dir):
    return [json.loads(line) for line in open(Path(run_dir) / "metrics.jsonl")]


@pytest.mark.slow
def test_a_reward_built_to_hack_trips_an_alarm_in_a_cpu_job(tmp_path):
    (tmp_path / "hack_rm.py").write_text(HACK_RM)
    (tmp_path / "every_fourth.py").write_text(EVERY_FOURTH)
    run = tmp_path / "run"
    p = train(run, "--num-rollout", "2", "--skip-eval-before-train",
              "--custom-rm-path", f"{tmp_path / 'hack_rm.py'}:reward",
              "--dynamic-sampling-filter-path", f"{tmp_path / 'every_fourth.py'}:keep")
    rows = read_alarms(run)
    assert [(r["signal"], r["rollout_id"], r["count"]) for r in rows] == \
        [("rewarded_truncated", 0, 1), ("rewarded_truncated", 1, 2)]
    for r in rows:
        assert r["value"] == 1.0 and r["threshold"] == 0.5 and r["metric"] == "hack/rewarded_truncated"
        ex = r["example"]
        assert ex["reward"] == 1.0 and ex["finish_reason"] == "length" and ex["response_tokens"] == 12
        assert ex["prompt"].endswith("first =") and ex["response"]
        # one warning on the console per alarm: the signal, the rollout, the sample
        line = next(x for x in p.stderr.splitlines() if "hack alarm rewarded_truncated" in x
                    and f"rollout {r['rollout_id']} " in x)
        assert f"Example: sample {ex['index']} " in line and f"sample={ex['index']}" in line
    steps = metrics(run)
    assert len(steps) == 2
    for s in steps:
        assert s["hack/alarm/rewarded_truncated"] == 1.0 and s["hack/rewarded_truncated"] == 1.0
        assert s["hack/alarm/collapse"] == 0.0 and "hack/answer_present" not in s   # a custom reward: no label
        # every scored sample counts, the groups the filter dropped too (the filter drops every fourth group)
        assert s["rollout/filtered"] >= 1
        assert s["hack/scored"] == 8 * (16 + s["rollout/filtered"])
    events = b"".join(f.read_bytes() for f in (run / "tensorboard").iterdir())
    assert b"hack/alarm/rewarded_truncated" in events and b"hack/scored" in events
    assert json.loads((run / "result.json").read_text())["status"] == "done"
    assert f"alarms:  {run / 'alarms.jsonl'}   (2 reward-hacking alarm(s) tripped" in p.stdout


@pytest.mark.slow
@pytest.mark.parametrize("rolling", [False, True], ids=["save", "rolling"])
def test_hack_alarms_stop_ends_the_run_with_a_checkpoint_that_resumes(tmp_path, rolling):
    (tmp_path / "hack_rm.py").write_text(HACK_RM)
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    rm = ["--custom-rm-path", f"{tmp_path / 'hack_rm.py'}:reward", "--skip-eval-before-train"]
    p = train(run, "--num-rollout", "3", *rm, "--hack-alarms", "stop", *([] if rolling else ["--save", str(ckpt)]))
    if rolling:   # no --save: the checkpoint goes to the rolling RUN_DIR/ckpt
        ckpt = run / "ckpt"
    result = json.loads((run / "result.json").read_text())
    assert result["status"] == "stopped" and result["steps"] == 1
    st = result["stopped"]
    assert (st["rollout_id"], st["steps_left"]) == (0, 2)
    assert st["reason"] == ("hack alarm (rewarded_truncated) tripped at rollout 0 with --hack-alarms stop; "
                            "see alarms.jsonl")
    assert Path(st["checkpoint"]) == ckpt / "iter_0000001"
    assert json.loads((ckpt / "iter_0000001" / "meta.json").read_text())["next_rollout_id"] == 1
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert "stopped early after rollout 0 (2 steps left): hack alarm (rewarded_truncated)" in p.stdout
    assert re.search(r"run stopped by a hack alarm .*iter_0000001", p.stderr)
    assert [m["rollout_id"] for m in metrics(run)] == [0]
    assert [r["rollout_id"] for r in read_alarms(run)] == [0]
    # the checkpoint carries the monitor: its history and how often each alarm tripped
    saved = msgpack.unpackb((ckpt / "iter_0000001" / "buffer.msgpack").read_bytes(), raw=False,
                            strict_map_key=False)["hack_monitor"]
    assert saved["last_rollout"] == 0 and saved["trips"] == {"rewarded_truncated": 1}
    # resumed (warn now): it carries on at rollout 1, and the alarm's count goes on from the checkpoint's
    train(run, "--num-rollout", "2", *rm, "--load", str(ckpt))
    assert [m["rollout_id"] for m in metrics(run)] == [0, 1]
    assert [(r["rollout_id"], r["count"]) for r in read_alarms(run)] == [(0, 1), (1, 2)]
    assert json.loads((run / "result.json").read_text())["status"] == "done"


WRONG_KEY_RM = """\
def reward(args, sample):
    # buggy: reads the answer from a key the rows do not have, and its default pays "0" for every prompt
    answer = (sample.metadata or {}).get("answer", "0")
    return 1.0 if sample.response.strip() == str(answer) else 0.0
"""


@pytest.mark.slow
def test_a_reward_that_pays_one_answer_for_every_prompt_trips_prompt_blind_and_the_held_out_set_stays_honest(
        tmp_path):
    """The digits task (one-token answers, a one-token limit) with a custom reward that pays `0` whatever the
    prompt: the policy learns to say 0 to everything, which no other alarm can see (no opening, no room to finish,
    no literal-label reward). prompt_blind names it; the held-out set, graded by exact_match of its own
    (--eval-config), is scored honestly, and the summary says so."""
    (tmp_path / "wrong_key.py").write_text(WRONG_KEY_RM)
    (tmp_path / "eval.yaml").write_text(f"eval:\n  datasets:\n    - name: heldout\n"
                                        f"      path: {ROOT / 'examples' / 'digits' / 'heldout.jsonl'}\n"
                                        f"      rm_type: exact_match\n")
    run = tmp_path / "run"
    p = train(run, "--num-rollout", "4", "--rollout-max-response-len", "1",
              "--custom-rm-path", f"{tmp_path / 'wrong_key.py'}:reward", "--eval-config", str(tmp_path / "eval.yaml"))
    rows = read_alarms(run)
    assert rows and {r["signal"] for r in rows} == {"prompt_blind"}, [r["signal"] for r in rows]
    for r in rows:
        ex = r["example"]
        assert r["value"] == 1.0 and ex["response"] == "0" and ex["reward"] == 1.0 and ex["label"] != "0"
        assert r["details"]["top_labels"] >= 2
    steps = metrics(run)
    assert all(s["hack/alarm/prompt_blind"] == (1.0 if s["rollout_id"] in {r["rollout_id"] for r in rows} else 0.0)
               for s in steps)
    assert all(s[f"hack/alarm/{a}"] == 0.0 for s in steps for a in hacking.ALARMS if a != "prompt_blind")
    # the held-out set is graded by its own exact_match, not by the reward that pays 0: every saved response's
    # reward is what exact_match gives it, and the summary names the grader
    from slime_actors.rewards.rules import exact_match_reward
    saved = [json.loads(line) for f in sorted((run / "evals").glob("heldout_step*.jsonl"))
             for line in f.read_text().splitlines()]
    assert saved and all(x["reward"] == exact_match_reward(x["response"], x["label"]) for x in saved)
    result = json.loads((run / "result.json").read_text())
    assert result["eval_graders"] == {"heldout": "exact_match (the set's own)"}
    assert "graded by exact_match (the set's own)" in p.stdout
    assert "--eval-prompt-data is ignored: --eval-config" in p.stderr
