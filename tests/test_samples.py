"""Samples in front of the user: the buffer picks the best and the worst of one group per rollout, the reward worker
reports grading timeouts, and `slime-actors samples` prints saved rollouts, evaluations and a markdown report --
reading the buffer's trace where no rollout was saved."""

import json

import msgpack
import pytest

from slime_actors.actors.base import Actor
from slime_actors.actors.buffer import Buffer
from slime_actors.actors.reward import RewardWorker
from slime_actors.cli import main as cli
from slime_actors.config import debug_rollout_path, parse_config
from slime_actors.log import console_write
from slime_actors.models.tiny import make_tiny_model
from slime_actors.runtime import RuntimeConfig
from slime_actors.sample_display import format_examples, pick_examples, prompt_text
from slime_actors.samples import load_from_traces, report_markdown
from slime_actors.types import Sample


class Worker(Actor):
    role = "rollout"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "m"))


def S(index, group, reward, response, label="7", rollout_id=0, prompt="a b c first ="):
    return Sample(index=index, group_index=group, prompt=prompt, response=response, reward=reward, label=label,
                  rollout_id=rollout_id, response_tokens=[1, 2], loss_mask=[1, 1], rollout_log_probs=[-1.0, -1.0],
                  status="completed", weight_version=0, weight_versions=[0])


# ------------------------------------------------------------------------------------------------ picking
def test_pick_examples_takes_the_group_with_the_widest_spread():
    samples = [S(0, 0, 0.5, "a"), S(1, 0, 0.5, "b"),                   # no spread
               S(2, 1, 0.0, "wrong"), S(3, 1, 1.0, "right"), S(4, 1, 0.3, "partly"),
               S(5, 2, 0.2, "x"), S(6, 2, 0.9, "y")]                    # spread 0.7 < 1.0
    best, worst = pick_examples(samples)
    assert (best["which"], best["response"], best["reward"], best["group_index"]) == ("best", "right", 1.0, 1)
    assert (worst["which"], worst["response"], worst["reward"]) == ("worst", "wrong", 0.0)
    assert best["group_size"] == 3
    # equal rewards everywhere: the first group, two of its samples
    picks = pick_examples([S(0, 4, 1.0, "p"), S(1, 4, 1.0, "q"), S(2, 3, 1.0, "r"), S(3, 3, 1.0, "s")])
    assert [p["response"] for p in picks] == ["r", "s"]
    assert pick_examples([S(0, 0, None, "unscored")]) == []


def test_format_examples_is_readable():
    prompt = ("<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n<|im_start|>user\nWhat is 12 * 8? "
              "Put your final answer in \\boxed{}.<|im_end|>\n<|im_start|>assistant\n")
    assert prompt_text(prompt) == "What is 12 * 8? Put your final answer in \\boxed{}."
    ex = pick_examples([S(0, 0, 1.0, "12 * 8 = 96.\n\\boxed{96}", prompt=prompt, label="96"),
                        S(1, 0, 0.0, "To calculate 12 * 8, you simply multiply", prompt=prompt, label="96")])
    text = format_examples(5, ex, width=60)
    lines = text.splitlines()
    assert lines[0].startswith("rollout 5 samples (group 0, 2 samples; best 1.000, worst 0.000; label 96)")
    assert lines[1] == "  prompt   What is 12 * 8? Put your final answer in \\boxed{}."
    assert lines[2] == "  best   1.000  12 * 8 = 96. ⏎ \\boxed{96}"
    assert lines[3] == "  worst  0.000  To calculate 12 * 8, you simply multiply"
    assert all(len(line) < 100 for line in lines)


def test_console_lines_leave_a_progress_bar_intact(capsys):
    tqdm = pytest.importorskip("tqdm")
    import io
    out = io.StringIO()
    bar = tqdm.tqdm(total=3, file=out, desc="rl steps", dynamic_ncols=False, ncols=60)
    bar.update(1)
    console_write("rollout 1 samples ...", stream=out)
    bar.update(1)
    bar.close()
    text = out.getvalue()
    # the line stands on a line of its own, not glued to the bar's last drawing
    assert "\nrollout 1 samples ...\n" in text.replace("\r", "\n")
    assert not any(line.startswith("rl steps") and "rollout 1 samples" in line for line in text.split("\r"))


# ------------------------------------------------------------------------------------------------ the actors
def make_args(tmp_path, tiny, *extra):
    data = tmp_path / "p.jsonl"
    with open(data, "w") as f:
        for i in range(8):
            f.write(json.dumps({"input": f"{i} 1 2 first =", "label": str(i)}) + "\n")
    return parse_config(["--prompt-data", str(data), "--hf-checkpoint", tiny, "--rm-type", "math",
                         "--rollout-batch-size", "2", "--n-samples-per-prompt", "3", "--input-key",
                         "input", "--label-key", "label", *extra]).to_dict()


def test_rollout_stats_carry_examples_and_timeouts_and_the_trace_has_the_samples(loop_thread, run_dir, tmp_path,
                                                                                   tiny, capsys):
    args = make_args(tmp_path, tiny)
    b = Buffer(0, args=args)
    ep = loop_thread.call(b.start(RuntimeConfig(run_dir=run_dir, curve=False)))
    w = Worker(1)
    loop_thread.call(w.start(RuntimeConfig(run_dir=run_dir, curve=False, static_peers={"buffer/0": ep})))
    ask = lambda m, body: loop_thread.call(w.ask("buffer/0", m, body, timeout=10))  # noqa: E731
    ask("start_rollout", {"rollout_id": 0})
    groups = ask("get_work", {"worker": "rollout/1", "max_groups": 2})["groups"]
    answers = [["0", "zero", "7"], ["1", "1", "1"]]
    for g, resp in zip(groups, answers):
        samples = []
        for s, r in zip(g["samples"], resp):
            s = dict(s)
            s.update(response_tokens=[5], loss_mask=[1], rollout_log_probs=[-0.5], response=r,
                     reward=float(r == s["label"]), status="completed", weight_version=0, weight_versions=[0])
            if r == "zero":
                s["metadata"] = {**s["metadata"], "reward_timed_out": True}
            samples.append(s)
        assert ask("submit", {"worker": "rollout/1", "work_id": g["work_id"], "samples": samples})["accepted"]
    st = ask("wait_rollout", {"rollout_id": 0, "timeout": 5.0})
    assert st["complete"] and st["reward_timeouts"] == 1
    best, worst = st["examples"]
    assert best["response"] == "0" and best["reward"] == 1.0 and worst["reward"] == 0.0
    assert best["group_index"] == worst["group_index"] == groups[0]["samples"][0]["group_index"]
    loop_thread.call(w.stop())
    loop_thread.call(b.stop())
    # no rollout was saved: `slime-actors samples` reads the buffer's trace
    rollouts, evals, notes = load_from_traces(tmp_path / "run")
    assert sorted(rollouts) == [0] and len(rollouts[0]) == 6 and not evals and not notes
    assert cli(["samples", run_dir, "--worst", "--n", "2"]) == 0
    out = capsys.readouterr().out
    assert "rollout 0: 6 samples, reward mean 0.667 (the buffer's trace)" in out
    assert out.count("--- reward 0.000") == 2 and "--- reward 1.000" not in out


def test_the_reward_worker_reports_grading_timeouts(loop_thread, run_dir, tmp_path, tiny):
    args = make_args(tmp_path, tiny, "--math-grading-timeout", "2", "--math-grading-processes", "1")
    r = RewardWorker(0, args=args)
    ep = loop_thread.call(r.start(RuntimeConfig(run_dir=run_dir, curve=False)), timeout=180)
    w = Worker(1)
    loop_thread.call(w.start(RuntimeConfig(run_dir=run_dir, curve=False, static_peers={"reward/0": ep})))
    samples = [S(0, 0, None, r"so \boxed{9^{9^{9^{9}}}}", label=r"12\pi").to_wire(),
               S(1, 0, None, r"\boxed{12\pi}", label=r"12\pi").to_wire(),
               S(2, 0, None, "12 * 8", label="96").to_wire()]
    rep = loop_thread.call(w.ask("reward/0", "score", {"samples": samples}, timeout=120), timeout=180)
    assert rep["rewards"] == [0.0, 1.0, 0.0] and rep["errors"] == [None, None, None]
    assert rep["timed_out"] == [True, False, False]
    assert r.counters["reward_timeouts"] == 1 and r.counters["scored"] == 3
    loop_thread.call(w.stop())
    loop_thread.call(r.stop())


# ------------------------------------------------------------------------------------------------ the command
def _run_with_saved_rollouts(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    spec = str(tmp_path / "saved")
    (run / "job.json").write_text(json.dumps({"save_debug_rollout_data": spec, "num_rollout": 3}))
    for k in range(3):
        samples = [S(10 * k + j, k, float(j == k), f"response {k}.{j}", rollout_id=k).to_wire() for j in range(4)]
        p = debug_rollout_path(spec, k)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(msgpack.packb({"rollout_id": k, "samples": samples}, use_bin_type=True))
    return run


def test_samples_command_prints_saved_rollouts(tmp_path, capsys):
    run = _run_with_saved_rollouts(tmp_path)
    assert cli(["samples", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("rollout 2: 4 samples, reward mean 0.250 (saved rollouts")
    assert out.count("--- reward") == 4 and "response 2.0" in out
    assert cli(["samples", str(run), "--rollout", "1", "--best", "--n", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("--- reward") == 1 and "--- reward 1.000" in out and "response 1.1" in out
    assert cli(["samples", str(run), "--rollout", "1", "--worst", "--n", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("--- reward 0.000") == 3 and "response 1.1" not in out


def test_samples_command_errors(tmp_path, capsys):
    run = _run_with_saved_rollouts(tmp_path)
    assert cli(["samples", str(run), "--rollout", "7"]) == 2
    assert "no rollout 7 in saved rollouts" in capsys.readouterr().err and True
    assert cli(["samples", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli(["samples", str(empty)]) == 2
    err = capsys.readouterr().err
    assert "no saved rollout" in err and "no buffer trace" in err
    assert cli(["samples", str(run), "--n", "0"]) == 2
    assert "--n must be >= 1" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "job.json").write_text(json.dumps({"save_debug_rollout_data": str(tmp_path / "junk"), "num_rollout": 1}))
    debug_rollout_path(str(tmp_path / "junk"), 0).parent.mkdir(parents=True, exist_ok=True)
    debug_rollout_path(str(tmp_path / "junk"), 0).write_bytes(b"\x00not msgpack")
    assert cli(["samples", str(bad)]) == 2
    assert "is not a saved rollout" in capsys.readouterr().err
    assert cli(["samples", str(run), "--eval"]) == 2
    assert "no held-out evaluation" in capsys.readouterr().err


def _evals(run, step, rewards, responses):
    d = run / "evals"
    d.mkdir(exist_ok=True)
    rows = [{"index": i, "prompt": f"<|im_start|>user\nWhat is {i} + {i}?<|im_end|>\n<|im_start|>assistant\n",
             "label": str(2 * i), "reward": r, "response": resp} for i, (r, resp) in enumerate(zip(rewards, responses))]
    (d / f"heldout_step{step:06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_report_and_eval_listing(tmp_path, capsys):
    run = _run_with_saved_rollouts(tmp_path)
    _evals(run, 0, [0.0, 1.0, 0.0, 0.0], ["I think 1", "1 + 1 = 2", "2 + 2 = 5", "3 | 3"])
    _evals(run, 5, [1.0, 1.0, 0.0, 1.0], ["0 + 0 = 0", "1 + 1 = 2", "2 + 2 = 5", "3 + 3 = 6"])
    _evals(run, 10, [1.0, 0.0, 1.0, 1.0], ["\\boxed{0}", "1 + 1 = 3", "2 + 2 = 4", "3 + 3 = 6"])
    md = report_markdown(run, n_table=3, n_samples=2, seed=1)
    assert "| 0 | 0.250 |" in md and "| 5 | 0.750 |" in md and "| 10 | 0.750 |" in md
    assert "Step 0 -> step 10: 3 prompts went from wrong to right, 1 from right to wrong, of 4." in md
    assert "| 1 | What is 0 + 0? | 0 | I think 1 | 0.000 | \\boxed{0} | 1.000 |" in md
    assert md.count("\n| ") - md.count("\n| step") - md.count("\n| #") == 3 + 3   # 3 accuracy + 3 table rows
    assert "3 \\| 3" not in md       # (row 4 is past --n 3)
    assert "2 held-out responses at step 10 (picked with seed 1)" in md
    assert cli(["samples", str(run), "--report", "--n", "4"]) == 0
    out = capsys.readouterr().out
    assert "| 4 | What is 3 + 3? | 6 | 3 \\| 3 | 0.000 | 3 + 3 = 6 | 1.000 |" in out
    assert cli(["samples", str(run), "--eval", "--step", "5", "--worst", "--n", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("held-out [heldout] at step 5: accuracy 0.750 over 4 prompts")
    assert "2 + 2 = 5" in out and out.count("--- reward") == 1
    assert cli(["samples", str(run), "--eval", "--step", "3"]) == 2
    assert "no evaluation at step 3 (steps: 0, 5, 10)" in capsys.readouterr().err
    assert cli(["samples", str(run), "--report", "--set", "other"]) == 2
    assert "no evaluation set 'other'" in capsys.readouterr().err
