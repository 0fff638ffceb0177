"""scripts/compare_trl: our GRPO job against TRL's GRPOTrainer (issue 19).

Always: the report from small fixture runs (our metrics and traces, TRL's step log, utilisation samples) -- the
step split from synthetic traces with known intervals, the per-framework table and its ratios, equal-steps and
equal-wall-clock accuracy, the plots -- and the driver's checks and our command's flags (parsed by our own CLI).
Only where trl is importable (a venv at .venv-trl, $TRL_PYTHON, or this Python): both frameworks for 2 steps with a
tiny model on CPU through scripts/compare_trl.sh, and every column of the report filled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.compare_trl import report, run, split, trl_job  # noqa: E402
from scripts.compare_trl.sampler import Sampler, keep_other_runs, read_samples  # noqa: E402

T0 = 1_800_000_000.0


# ------------------------------------------------------------------------------------------------ fixtures
def _ns(t: float) -> int:
    return int(round((T0 + t) * 1e9))


class TraceFiles:
    """Trace files written by hand (docs/trace-format.md), with times in seconds after T0."""

    def __init__(self, root: Path):
        self.dir = root / "traces"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.records: dict[str, list] = {}
        self.n = 0

    def _header(self, kind, frm, to, method, mid=None, re=None) -> tuple[bytes, str]:
        if mid is None:
            self.n += 1
            mid = f"m{self.n:04d}"
        h = {"id": mid if re is None else f"{mid}r", "kind": kind, "from": frm, "to": to, "method": method}
        if re is not None:
            h["re"] = re
        return msgpack.packb(h), mid

    def _add(self, actor, rec):
        self.records.setdefault(actor, []).append(rec)

    def ask(self, frm, to, method, t_send, t_recv, t_done, t_reply, body=None):
        """An ask: sent, received and handled (returned at t_done), answered back at t_reply."""
        raw = msgpack.packb(body or {})
        h, mid = self._header("ask", frm, to, method)
        self._add(frm, ["send", _ns(t_send), h, raw, len(raw), None, None, None])
        self._add(to, ["recv", _ns(t_recv), h, raw, len(raw), None, None, None, _ns(t_done) - _ns(t_recv)])
        rh, _ = self._header("reply", to, frm, method, mid=mid, re=mid)
        self._add(to, ["send", _ns(t_done), rh, b"\xc0", 1, None, None, None])
        self._add(frm, ["recv", _ns(t_reply), rh, b"\xc0", 1, None, None, None])

    def send_only(self, frm, to, method, t, body):
        raw = msgpack.packb(body)
        h, _ = self._header("ask", frm, to, method)
        self._add(frm, ["send", _ns(t), h, raw, len(raw), None, None, None])

    def generate(self, actor, started, answered):
        body = msgpack.packb({"output_ids": [1], "started": T0 + started})
        self._add(actor, ["input", _ns(answered), None, body, len(body), None, None, {"name": "engine.generate"}])

    def write(self):
        for actor, recs in self.records.items():
            role, idx = actor.split("/")
            head = {"format": "slime-actors-trace", "version": 4, "actor": actor, "pid": 1, "host": "h",
                    "started_ns": _ns(-100), "body_limit": 65536, "keep_arrays": False, "digest": "xxh3_64",
                    "role": role, "index": int(idx)}
            recs = sorted(recs, key=lambda r: r[1])
            data = msgpack.packb(head) + b"".join(msgpack.packb(r, use_bin_type=True) for r in recs)
            (self.dir / f"{role}-{idx}.1.trace").write_bytes(data)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def eval_file(run_dir: Path, step: int, rewards: list[float]) -> None:
    write_jsonl(run_dir / "evals" / f"heldout_step{step:06d}.jsonl",
                [{"index": i, "prompt": f"q{i}", "label": str(i), "response": f"r{step}-{i}", "reward": r}
                 for i, r in enumerate(rewards)])


def traced_run(d: Path) -> Path:
    """One step (window 0..8 s: 10 s with a 2 s evaluation after it) with known intervals, and the evaluation before
    it (5 s)."""
    write_jsonl(d / "metrics.jsonl", [{"rollout_id": 0, "time/step": 10.0, "time/eval": 2.0, "time": T0 + 10.0,
                                       "time/rollout": 4.0, "time/weight_sync": 0.5,
                                       "train/time/train_compute": 2.0, "rollout/samples": 8,
                                       "rollout/response_len_mean": 5.0}])
    tf = TraceFiles(d)
    tf.send_only("controller/0", "buffer/0", "start_rollout", -5.0, {"rollout_id": 0, "kind": "eval"})
    tf.generate("rollout/0", 0.5, 3.0)
    tf.generate("rollout/0", 1.0, 3.5)                                       # generation: 0.5..3.5
    tf.ask("rollout/0", "reward/0", "score", 3.2, 3.2, 4.0, 4.0)             # reward beyond generation: 3.5..4.0
    tf.ask("controller/0", "trainer/0", "train", 4.4, 4.5, 7.0, 7.0)         # transit 4.4..4.5; compute 5..7
    tf.ask("trainer/0", "buffer/0", "get_batch", 4.6, 4.62, 4.7, 4.8)        # messaging 4.6..4.8
    tf.ask("controller/0", "buffer/0", "mark_trained", 7.0, 7.01, 7.02, 7.05)  # messaging 7.0..7.05
    tf.ask("controller/0", "trainer/0", "sync_weights", 7.1, 7.1, 7.6, 7.6)  # weight update 7.1..7.6
    tf.generate("rollout/0", 8.5, 9.5)                                       # the evaluation's: outside the step
    tf.write()
    return d


# ------------------------------------------------------------------------------------------------ the step split
def test_step_split_from_traces_matches_the_known_intervals(tmp_path):
    d = traced_run(tmp_path / "ours-local")
    rows, notes = split.step_split(d)
    assert notes == []
    (r,) = rows
    assert r["source"] == "traces"
    want = {"wall": 8.0, "generation": 3.0, "reward": 0.5, "training": 2.0, "weight_update": 0.5,
            "messaging": 0.35, "idle": 1.65, "orchestration": 2.5}
    for k, v in want.items():
        assert r[k] == pytest.approx(v, abs=1e-6), k
    assert sum(r[k] for k in split.PARTS) == pytest.approx(r["wall"], abs=1e-6)
    assert split.eval_before_first_step(d, split.read_metrics(d)) == pytest.approx(5.0, abs=1e-6)


def test_orchestration_by_message_adds_up_to_the_splits_and_names_each_moment(tmp_path):
    """The step's 2.5 s of orchestration, moment by moment: the scoring beyond generation, the train ask in transit,
    the trainer from its arrival to its update (its get_batch inside), mark_trained, and nothing (idle)."""
    d = traced_run(tmp_path / "ours-local")
    got = split.orchestration_by_message(d)
    want = {"idle": 1.35, split.REWARD_LABEL: 0.5, split.TRAIN_WAIT_LABEL: 0.5, "trainer.train (ask in transit)": 0.1,
            "buffer.mark_trained": 0.05}
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=1e-6), k
    (r,), _ = split.step_split(d)
    assert sum(got.values()) == pytest.approx(r["orchestration"], abs=1e-6)


def test_rollout_tail_times_the_end_of_a_rollout_from_its_last_generation(tmp_path):
    """From the last generation's end (3.5 s): the last score handled at 3.9, the last submit at 4.1, wait_rollout's
    reply at the controller at 4.2, train at the trainer at 4.3, its update (2 s of compute, handled at 7.0) at 5.0.
    A step without the milestones (the plain traced run: no submit, no wait_rollout) gives {}."""
    d = tmp_path / "ours-local"
    write_jsonl(d / "metrics.jsonl", [{"rollout_id": 0, "time/step": 10.0, "time/eval": 2.0, "time": T0 + 10.0,
                                       "time/rollout": 4.0, "time/weight_sync": 0.5,
                                       "train/time/train_compute": 2.0}])
    tf = TraceFiles(d)
    tf.generate("rollout/0", 0.5, 3.0)
    tf.generate("rollout/0", 1.0, 3.5)
    tf.ask("controller/0", "buffer/0", "wait_rollout", 0.1, 0.1, 4.15, 4.2)
    tf.ask("rollout/0", "reward/0", "score", 3.0, 3.0, 3.3, 3.3)
    tf.ask("rollout/0", "reward/0", "score", 3.5, 3.5, 3.9, 3.9)
    tf.ask("rollout/0", "buffer/0", "submit", 3.4, 3.4, 3.45, 3.5)
    tf.ask("rollout/0", "buffer/0", "submit", 3.95, 3.96, 4.1, 4.15)
    tf.ask("controller/0", "trainer/0", "train", 4.25, 4.3, 7.0, 7.0)
    tf.ask("controller/0", "trainer/0", "sync_weights", 7.1, 7.1, 7.6, 7.6)
    tf.write()
    got = split.rollout_tail(d)
    assert list(got) == [k for k, _ in split.TAIL]
    for k, v in {"scored": 0.4, "handed_in": 0.6, "reported": 0.7, "train_arrived": 0.8, "update_started": 1.5}.items():
        assert got[k] == pytest.approx(v, abs=1e-6), k
    assert split.rollout_tail(traced_run(tmp_path / "plain")) == {}


def test_step_split_without_traces_uses_the_metrics_and_says_so(tmp_path):
    d = tmp_path / "ours-local"
    write_jsonl(d / "metrics.jsonl", [{"rollout_id": 0, "time/step": 10.0, "time/eval": 2.0, "time": T0 + 10,
                                       "time/rollout": 4.0, "time/weight_sync": 0.5,
                                       "train/time/train_compute": 2.0}])
    (r,), notes = split.step_split(d)
    assert r["source"] == "metrics" and "no traces" in notes[0]
    assert (r["generation"], r["training"], r["weight_update"]) == (4.0, 2.0, 0.5)
    assert r["messaging+idle"] == pytest.approx(1.5) and r["orchestration"] == pytest.approx(1.5)


def test_step_split_errors_name_the_problem(tmp_path):
    with pytest.raises(split.SplitError, match="metrics.jsonl: no such file"):
        split.step_split(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(split.SplitError, match="no step"):
        split.step_split(tmp_path)


# ------------------------------------------------------------------------------------------------ the report
JOB = {"model": "tiny:digits", "model_dir": "/m", "task": "add2", "train_file": "t", "heldout_file": "h",
       "train_size": 40, "heldout_size": 20, "heldout_n": 4, "data_seed": 19, "steps": 3, "prompts": 2, "group": 4,
       "max_len": 8, "eval_max_len": 8, "temperature": 1.0, "lr": 1e-5, "kl": 0.01, "clip": 0.2, "micro_batch": 8,
       "eval_every": 2, "precision": "fp32", "device": "cuda", "seed": 1}


def fixture_work(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir(parents=True)
    (work / "job.json").write_text(json.dumps(JOB))
    ours = work / "ours-local"
    # steps of 5, 2 (3 less a 1 s evaluation) and 6 s; 8 samples each of 10, 20, 30 tokens on average
    write_jsonl(ours / "metrics.jsonl", [
        {"rollout_id": 0, "time/step": 5.0, "time": T0 + 5, "rollout/samples": 8, "rollout/response_len_mean": 10},
        {"rollout_id": 1, "time/step": 3.0, "time/eval": 1.0, "time": T0 + 8, "rollout/samples": 8,
         "rollout/response_len_mean": 20},
        {"rollout_id": 2, "time/step": 6.0, "time": T0 + 14, "rollout/samples": 8, "rollout/response_len_mean": 30}])
    (ours / "run_info.json").write_text(json.dumps({"t_launch": T0 - 20, "t_end": T0 + 20, "rc": 0,
                                                    "engine": "local", "backend": "torch"}))
    for step, rw in ((0, [1, 0, 0, 0]), (2, [1, 1, 0, 0]), (3, [1, 1, 1, 0])):
        eval_file(ours, step, rw)
    trl = work / "trl"
    T1 = T0 + 100
    write_jsonl(trl / "trl_metrics.jsonl", [
        {"kind": "start", "time": T1 + 1, "t_launch": T1},
        {"kind": "eval", "time": T1 + 8, "step": 0, "accuracy": 0.25, "n": 4, "seconds": 3.0},
        {"kind": "step", "time": T1 + 10, "step": 1, "step_seconds": 2.0, "samples": 8, "gen_tokens": 40,
         "reward_mean": 0.1, "generation_seconds": 1.0, "reward_seconds": 0.1, "prepare_seconds": 1.5},
        {"kind": "step", "time": T1 + 12, "step": 2, "step_seconds": 2.0, "samples": 8, "gen_tokens": 40,
         "reward_mean": 0.2, "generation_seconds": 1.0, "reward_seconds": 0.1, "prepare_seconds": 1.5},
        {"kind": "step", "time": T1 + 17, "step": 3, "step_seconds": 4.0, "samples": 8, "gen_tokens": 80,
         "reward_mean": 0.3, "generation_seconds": 2.0, "reward_seconds": 0.2, "prepare_seconds": 2.6},
        {"kind": "end", "time": T1 + 20, "steps": 3, "max_memory_reserved_gib": 3.5}])
    (trl / "run_info.json").write_text(json.dumps({"t_launch": T1, "t_end": T1 + 20, "rc": 0}))
    for step, rw in ((0, [1, 0, 0, 0]), (2, [1, 0, 0, 0]), (3, [1, 1, 0, 0])):
        eval_file(trl, step, rw)
    with open(work / "util.csv", "w") as f:
        f.write("time,run,util_pct,mem_used_mib,source\n")
        for t, name, u, m in ((T0, "ours-local", 50, 1024), (T0 + 1, "ours-local", 70, 3072), (T0 + 2, "", 0, 9999),
                              (T1, "trl", 90, 2048), (T1 + 1, "trl", 100, 4096)):
            f.write(f"{t},{name},{u},{m},nvml\n")
    return work


def table_row(md: str, label: str) -> list[str]:
    for line in md.splitlines():
        if line.startswith(f"| {label}"):
            return [c.strip() for c in line.strip().strip("|").split("|")]
    raise AssertionError(f"no row {label!r} in:\n{md}")


def test_report_tables_ratios_and_plots_from_fixture_runs(tmp_path):
    work = fixture_work(tmp_path)
    out = tmp_path / "out"
    files = report.build_report(work, out, ["ours-local", "trl"])
    names = {f.name for f in files}
    assert {"report.md", "summary.json", "accuracy_vs_time.png", "gpu_util.png"} <= names
    for png in ("accuracy_vs_time.png", "gpu_util.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "report.md").read_text()
    assert table_row(md, "step time, median") == ["step time, median (s)", "5.00", "2.00", "2.50 (TRL better)"]
    assert table_row(md, "step time, p90") == ["step time, p90 (s)", "5.80", "3.60", "1.61 (TRL better)"]
    assert table_row(md, "samples/s") == ["samples/s", "1.8", "3.0", "0.62 (TRL better)"]
    assert table_row(md, "generated tokens/s") == ["generated tokens/s", "37", "20", "1.85 (ours better)"]
    assert table_row(md, "peak GPU memory") == ["peak GPU memory (GiB, whole device)", "3.00", "4.00",
                                                "0.75 (ours better)"]
    assert table_row(md, "mean GPU utilisation") == ["mean GPU utilisation (%)", "60", "95", "0.63"]
    # ours: 25 s from launch to the end of step 1, its evaluation unknown without traces (*); TRL: 10 - 3
    assert table_row(md, "time to first step") == ["time to first step (s)", "25.0*", "7.0", "3.57 (TRL better)"]
    assert table_row(md, "held-out accuracy at equal steps") == [
        "held-out accuracy at equal steps (step 3)", "0.750", "0.500", "1.50 (ours better)"]
    # the shorter run trained 8 s: ours had evaluated step 2 by then (7 s), TRL step 3 (8 s)
    assert table_row(md, "held-out accuracy at equal wall-clock") == [
        "held-out accuracy at equal wall-clock (8.0 s)", "0.500 (step 2)", "0.500 (step 3)", "1.00"]
    s = json.loads((out / "summary.json").read_text())
    assert s["equal_step"] == 3 and s["equal_time_s"] == 8.0
    assert s["runs"]["trl"]["metrics"]["torch_peak_reserved_gib"] == 3.5
    assert s["runs"]["trl"]["split"][2] == {"step": 3, "wall": 4.0, "generation": 2.0, "reward": 0.2,
                                            "scoring": pytest.approx(0.4), "training": pytest.approx(1.4),
                                            "source": "timers"}
    assert [e["step"] for e in s["runs"]["ours-local"]["evals"]] == [0, 2, 3]
    assert "vLLM" in md and "## Held-out responses" in md


def test_report_bound_row_and_process_memory(tmp_path):
    """Issue 33: the step over its parts measured alone (alone.json from bench/step_split.py --alone; the goal is
    1.3x) and the run's processes' own memory (proctree.json: PSS, so other users of the machine do not count)."""
    work = fixture_work(tmp_path)
    # parts alone of rollouts 1 and 2 (steps 2 and 3: 2 s and 6 s): 2 / (1.0 + 0.5), 6 / (3.0 + 1.0)
    (work / "ours-local" / "alone.json").write_text(json.dumps(
        {"rollout_ids": [1, 2], "generation": [1.0, 3.0], "train": [0.5, 1.0]}))
    (work / "ours-local" / "proctree.json").write_text(json.dumps(
        {"peak_pss_mib": 2048.0, "peak_split_mib": {"trainer/0": 1024.0, "engine": 512.0, "head": 512.0},
         "roles": [{"name": "trainer/0", "cpu_s": 3.0}, {"name": "engine", "cpu_s": 2.0}]}))
    (work / "trl" / "proctree.json").write_text(json.dumps({"peak_pss_mib": 1024.0, "peak_split_mib": {"head": 1024.0},
                                                           "roles": [{"name": "head", "cpu_s": 4.0}]}))
    out = tmp_path / "out"
    report.build_report(work, out, ["ours-local", "trl"])
    md = (out / "report.md").read_text()
    assert table_row(md, "step / its parts alone") == [
        "step / its parts alone (generation + update + weight sync; goal <= 1.3)", "1.42 (2 steps)", "", ""]
    assert table_row(md, "peak memory of the run's processes") == [
        "peak memory of the run's processes (GiB, host PSS)", "2.00", "1.00", "2.00 (TRL better)"]
    assert "ours-local: host memory (PSS, MiB) of its processes at their peak: trainer/0 1024, engine 512, head 512" \
        in md
    # without the measurements the rows say so instead of inventing numbers
    for f in ("alone.json", "proctree.json"):
        (work / "ours-local" / f).unlink()
    report.build_report(work, out, ["ours-local", "trl"])
    md = (out / "report.md").read_text()
    assert table_row(md, "step / its parts alone")[1] == "n/a"
    assert table_row(md, "peak memory of the run's processes")[1:3] == ["n/a", "1.00"]


def test_accuracy_at_time_takes_the_last_evaluation_reached():
    r = report.Run("x", "ours", "x", steps=[{"step": 1, "seconds": 4.0}, {"step": 2, "seconds": 4.0}],
                   evals=[{"step": 0, "accuracy": 0.1}, {"step": 2, "accuracy": 0.6}])
    assert report.accuracy_at_time(r, 0.0) == (0.1, 0)
    assert report.accuracy_at_time(r, 7.9) == (0.1, 0)
    assert report.accuracy_at_time(r, 8.0) == (0.6, 2)


def test_report_error_paths_name_the_file(tmp_path):
    work = fixture_work(tmp_path)
    (work / "job.json").unlink()
    with pytest.raises(report.ReportError, match="job.json"):
        report.build_report(work, tmp_path / "o", ["ours-local", "trl"])
    work = fixture_work(tmp_path / "b")
    path = work / "trl" / "trl_metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    with pytest.raises(report.ReportError, match=r"trl_metrics.jsonl:2: not a JSON line"):
        report.build_report(work, tmp_path / "o", ["ours-local", "trl"])


def test_report_keeps_going_when_a_run_is_missing_or_stopped(tmp_path):
    work = fixture_work(tmp_path)
    info = json.loads((work / "trl" / "run_info.json").read_text())
    (work / "trl" / "run_info.json").write_text(json.dumps({**info, "rc": -15, "timed_out": True}))
    path = work / "trl" / "trl_metrics.jsonl"
    path.write_text(path.read_text() + '{"kind": "step", "ti')          # torn by the stop: skipped
    report.build_report(work, tmp_path / "out", ["ours-sglang", "ours-local", "trl"])
    md = (tmp_path / "out" / "report.md").read_text()
    assert "ours-sglang: " in md and "no such run folder" in md
    assert "3 of 3 (stopped at its time limit)" in table_row(md, "steps finished")
    assert "trl: exit status -15" in md


def test_same_prompts_finds_a_step_whose_prompts_differ(tmp_path, monkeypatch):
    import slime_actors.samples as samples

    class S:
        def __init__(self, q):
            self.prompt = [{"role": "user", "content": q}]

    rollouts = {0: [S("What is 1 + 2?"), S("What is 3 + 4?")], 1: [S("What is 5 + 6?"), S("What is 7 + 8?")]}
    monkeypatch.setattr(samples, "load_from_traces", lambda run: (rollouts, {}, []))
    ours = report.Run("ours-local", "ours", "ours")
    trl = report.Run("trl", "trl", "trl", questions={1: ["What is 3 + 4?", "What is 1 + 2?"],
                                                     2: ["What is 5 + 6?", "What is 9 + 9?"]})
    n, diffs = report.same_prompts(tmp_path, ours, trl)
    assert n == 2 and len(diffs) == 1 and diffs[0].startswith("step 2:") and "What is 9 + 9?" in diffs[0]
    trl.questions[2] = ["What is 7 + 8?", "What is 5 + 6?"]
    assert report.same_prompts(tmp_path, ours, trl) == (2, [])


# ------------------------------------------------------------------------------------------------ the driver
def _args(*extra):
    return run.build_parser().parse_args(list(extra))


@pytest.mark.parametrize("flags, message", [
    (["--ours", "vllm"], "expected ENGINE"),
    (["--ours", "local,local"], "given twice"),
    (["--heldout-n", "600"], "more than --heldout-size"),
    (["--prompts", "3", "--group", "4", "--micro-batch", "8"], "multiple of --micro-batch"),
    (["--ours", "none", "--no-trl"], "nothing to run"),
    (["--group", "1"], "--group must be >= 2"),
])
def test_driver_refuses_bad_flags_naming_them(flags, message):
    with pytest.raises(run.JobError, match=message):
        run.check(_args(*flags))


def test_driver_exits_2_with_the_reason_on_bad_flags(capsys):
    assert run.main(["--ours", "sglang+deepspeed", "--report-only"]) == 2
    assert "sglang+deepspeed" in capsys.readouterr().err


@pytest.mark.parametrize("mode, device, precision", [("local", "cpu", "fp32"), ("local", "cuda", "fp32"),
                                                     ("sglang", "cuda", "bf16"), ("sglang", "cuda", "fp32"),
                                                     ("local+megatron", "cuda", "fp32")])
def test_our_command_is_the_job_and_our_cli_accepts_it(tmp_path, mode, device, precision):
    """Every flag the driver gives `slime-actors train` exists and passes our own validation, with the job's values."""
    from slime_actors.config import parse_config
    prompts = tmp_path / "train.jsonl"
    write_jsonl(prompts, [{"messages": [{"role": "user", "content": "1 + 1?"}], "label": "2"}])
    a = _args("--ours", mode, "--device", device, "--precision", precision)
    (engine, backend), = run.check(a)
    job = run.job_spec(a, "/models/m", prompts, prompts)
    cmd = run.ours_command(a, job, engine, backend, tmp_path / "run")
    assert cmd[1:4] == ["-m", "slime_actors.cli", "train"]
    args = parse_config(cmd[4:]).flat()
    assert (args.num_rollout, args.rollout_batch_size, args.n_samples_per_prompt) == (10, 16, 8)
    assert (args.rollout_max_response_len, args.eval_max_response_len, args.rollout_temperature) == (128, 128, 1.0)
    assert (args.lr, args.kl_loss_coef, args.kl_loss_type, args.eps_clip, args.eps_clip_high) == \
        (1e-5, 0.01, "low_var_kl", 0.2, 0.2)
    assert args.use_kl_loss and args.eval_interval == 5 and args.eval_temperature == 0.0
    assert (args.global_batch_size, args.micro_batch_size, args.num_steps_per_rollout) == (128, 32, 1)
    assert (args.rollout_concurrency, args.engine_max_batch_size) == (200, 200)
    assert not args.rollout_shuffle                       # file order: the same prompts per step as TRL's
    assert (args.rollout_engine, args.train_backend, args.device) == (engine, backend, device)
    assert args.colocate == (device == "cuda")
    assert args.bf16 == (precision == "bf16")
    assert ("--attention-backend" in args.sglang_args) == (engine == "sglang")
    if engine == "sglang":   # SGLang's dtype said, never "auto" (fp32: float16, as SGLang has no float32 rmsnorm)
        assert args.sglang_args[args.sglang_args.index("--dtype") + 1] == \
            {"fp32": "float16", "bf16": "bfloat16"}[precision]


def test_trl_job_refuses_incomplete_jobs_and_bad_prompts(tmp_path):
    p = tmp_path / "job.json"
    p.write_text(json.dumps({k: v for k, v in JOB.items() if k not in ("lr", "clip")}))
    with pytest.raises(SystemExit, match="missing lr, clip"):
        trl_job.load_job(p)
    with pytest.raises(SystemExit, match="no such job file"):
        trl_job.load_job(tmp_path / "nope.json")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "x"}], "label": "1"}\n{"prompt": "y"}\n')
    with pytest.raises(SystemExit, match=r"bad.jsonl:2: expected"):
        trl_job.read_rows(bad)
    assert trl_job.completion_text([{"role": "assistant", "content": "12 + 3 = 15"}]) == "12 + 3 = 15"


def test_sampler_without_a_gpu_records_host_numbers(tmp_path, monkeypatch):
    from scripts.compare_trl import sampler as sm
    monkeypatch.setattr(sm, "_nvml", lambda: None)
    monkeypatch.setattr(sm, "source_name", lambda: "host")
    s = Sampler(tmp_path / "u.csv", interval=0.05).start()
    s.label = "r1"
    deadline = time.monotonic() + 30
    while len(read_samples(tmp_path / "u.csv")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    s.stop()
    rows = read_samples(tmp_path / "u.csv")
    assert len(rows) >= 2 and {r["source"] for r in rows} == {"host"}
    assert all(0.0 <= r["util_pct"] <= 100.0 and r["mem_used_mib"] > 0 for r in rows)
    with pytest.raises(ValueError, match="interval"):
        Sampler(tmp_path / "v.csv", interval=0)


# ------------------------------------------------------------------------------------------------ both, on CPU
def _trl_python() -> str | None:
    for cand in (os.environ.get("TRL_PYTHON"), str(ROOT / ".venv-trl" / "bin" / "python"), sys.executable):
        if cand and Path(cand).exists() and subprocess.run([cand, "-c", "import trl"],
                                                           capture_output=True).returncode == 0:
            return cand
    return None


TRL_PYTHON = _trl_python()


@pytest.mark.slow
@pytest.mark.skipif(TRL_PYTHON is None, reason="trl is not importable (no .venv-trl, $TRL_PYTHON or trl here): "
                                               "python3 -m venv .venv-trl && .venv-trl/bin/pip install "
                                               "torch==2.13.0 trl==1.16.0 -e .")
def test_both_frameworks_two_steps_on_cpu_fill_every_column(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    env = {**os.environ, "TRL_PYTHON": TRL_PYTHON, "PYTHON": sys.executable}
    env.pop("OUT", None)
    p = subprocess.run(["bash", "scripts/compare_trl.sh", "--device", "cpu", "--model", "tiny:digits", "--steps", "2",
                        "--prompts", "2", "--group", "4", "--max-len", "8", "--micro-batch", "8", "--train-size", "40",
                        "--heldout-size", "10", "--heldout-n", "6", "--eval-every", "1", "--work", str(work),
                        "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    md = (out / "report.md").read_text()
    for label in ("steps finished", "step time, median", "step time, p90", "samples/s", "generated tokens/s",
                  "peak host memory", "mean host CPU", "time to first step", "training wall-clock",
                  "held-out accuracy before", "held-out accuracy at equal steps",
                  "held-out accuracy at equal wall-clock"):
        cells = table_row(md, label)[1:3]           # ours-local, trl
        assert all(c and c != "n/a" for c in cells), (label, cells)
    assert "2 of 2" in table_row(md, "steps finished")[1] and "2 of 2" in table_row(md, "steps finished")[2]
    s = json.loads((out / "summary.json").read_text())
    for name in ("ours-local", "trl"):
        r = s["runs"][name]
        assert [e["step"] for e in r["evals"]] == [0, 1, 2] and len(r["split"]) == 2, name
        assert r["info"]["rc"] == 0
    assert s["runs"]["ours-local"]["split"][0]["source"] == "traces"
    assert s["same_prompts"]["ours-local"] == {"steps_compared": 2, "differences": []}
    assert "trained on the same prompts in each of the 2 steps" in md
    for f in ("accuracy_vs_time.png", "gpu_util.png", "step_timeline.png", "runs.tar.gz"):
        assert (out / f).stat().st_size > 0, f


def test_differences_say_sglang_generates_in_float16_at_fp32():
    """An fp32 job with an SGLang mode says its generation was float16 (SGLang has no float32 rmsnorm kernel)."""
    with_sglang = " ".join(report.differences({"precision": "fp32", "ours_modes": "local,sglang"}))
    local_only = " ".join(report.differences({"precision": "fp32", "ours_modes": "local"}))
    assert "--sglang-dtype float16" in with_sglang and "float16" not in local_only
    assert "fp32 is the precision both sides share" in local_only


def test_a_second_invocation_keeps_the_utilisation_of_the_runs_it_does_not_make_again(tmp_path):
    """Two invocations into one WORK (ours-local and TRL, then ours-sglang), then --report-only over all three:
    the second invocation's sampler must not wipe the first's runs' samples, only those of the runs it repeats."""
    util = tmp_path / "util.csv"
    util.write_text("time,run,util_pct,mem_used_mib,source\n"
                    "1.0,ours-local,20.0,100.0,nvml\n1.5,,0.0,50.0,nvml\n2.0,trl,25.0,200.0,nvml\n"
                    "3.0,ours-sglang,5.0,300.0,nvml\n3.5,ours-sgl")          # a torn last line
    keep_other_runs(util, ["ours-sglang"])
    assert [(r["time"], r["run"]) for r in read_samples(util)] == [(1.0, "ours-local"), (2.0, "trl")]
    keep_other_runs(util, ["ours-local", "trl"])
    assert read_samples(util) == []
    assert util.read_text().splitlines() == ["time,run,util_pct,mem_used_mib,source"]
    keep_other_runs(tmp_path / "absent.csv", ["trl"])        # nothing sampled yet: nothing to keep
    assert not (tmp_path / "absent.csv").exists()


def test_flag_string_options_take_a_value_that_starts_with_dashes():
    """`--ours-extra "--gradient-checkpointing"` as a user types it (argparse alone refuses it: expected one argument)."""
    argv = ["--ours-extra", "--gradient-checkpointing --lr 2e-5", "--sglang-flags", "--sglang-disable-prefill-cuda-graph",
            "--steps", "3"]
    with pytest.raises(SystemExit):
        run.build_parser().parse_args(argv)
    a = run.build_parser().parse_args(run.join_flag_strings(argv))
    assert (a.ours_extra, a.sglang_flags, a.steps) == ("--gradient-checkpointing --lr 2e-5",
                                                      "--sglang-disable-prefill-cuda-graph", 3)
    assert run.join_flag_strings(["--ours-extra=--x", "--no-trl"]) == ["--ours-extra=--x", "--no-trl"]


def test_gradient_checkpointing_is_asked_of_both_sides_and_said(tmp_path):
    """--gradient-checkpointing turns it on for ours (our flag, which our CLI accepts) and TRL (the job file's field,
    GRPOConfig's gradient_checkpointing), and the report's differences say which it was."""
    from slime_actors.config import parse_config
    for on in (False, True):
        a = _args(*(["--gradient-checkpointing"] if on else []), "--device", "cpu")
        (engine, backend), = run.check(a)
        prompts = tmp_path / "train.jsonl"
        write_jsonl(prompts, [{"messages": [{"role": "user", "content": "1 + 1?"}], "label": "2"}])
        job = run.job_spec(a, "/models/m", prompts, prompts)
        assert job["gradient_checkpointing"] is on
        cmd = run.ours_command(a, job, engine, backend, tmp_path / "run")
        assert ("--gradient-checkpointing" in cmd) is on
        assert parse_config(cmd[4:]).flat().gradient_checkpointing is on
        said = " ".join(report.differences({**job, "precision": "fp32"}))
        assert ("gradient checkpointing on both sides" in said) is on
        assert ("no gradient checkpointing" in said) is not on
        kw = trl_job.grpo_config_kwargs(job, Path("out"))
        assert kw["gradient_checkpointing"] is on and kw["per_device_train_batch_size"] == 32
        assert kw["gradient_accumulation_steps"] == 4 and kw["num_generations"] == 8 and not kw["bf16"]


@pytest.mark.parametrize("flags, graph_bs", [(None, "128"), ("--sglang-disable-cuda-graph", None),
                                             ("--sglang-cuda-graph-max-bs-decode=64", None),
                                             ("--sglang-attention-backend triton", "128")])
def test_sglang_decodes_in_cuda_graphs_sized_for_a_rollout(tmp_path, flags, graph_bs):
    """The sglang mode's default flags decode in CUDA graphs captured up to one rollout's requests (prompts x group);
    flags that say otherwise are left alone. The command is one our CLI accepts, SGLang flags included."""
    from slime_actors.config import parse_config
    a = run.build_parser().parse_args(run.join_flag_strings(
        ["--ours", "sglang", "--device", "cpu", *(["--sglang-flags", flags] if flags is not None else [])]))
    (engine, backend), = run.check(a)
    prompts = tmp_path / "train.jsonl"
    write_jsonl(prompts, [{"messages": [{"role": "user", "content": "1 + 1?"}], "label": "2"}])
    job = run.job_spec(a, "/models/m", prompts, prompts)
    cmd = run.ours_command(a, job, engine, backend, tmp_path / "run")
    if graph_bs is None:
        assert "--sglang-cuda-graph-max-bs-decode" not in cmd
    else:
        assert cmd[cmd.index("--sglang-cuda-graph-max-bs-decode") + 1] == graph_bs == str(job["prompts"] * job["group"])
    if flags is None:
        assert "--sglang-disable-cuda-graph" not in cmd and "--sglang-disable-prefill-cuda-graph" in cmd
    from slime_actors.backends import sglang_launch
    sglang_argv = parse_config(cmd[4:]).engine.sglang_args   # what reaches `sglang.launch_server`
    named = sum(f.startswith("--cuda-graph-max-bs-decode") for f in sglang_argv)
    assert named == (0 if flags == "--sglang-disable-cuda-graph" else 1)   # the job's or the user's, never both
    sglang_launch._check_with_table(["--model-path", "m", *sglang_argv], sglang_launch.sglang_flags.SERVER_FLAGS,
                                    "SGLang's recorded flags")   # every flag is one SGLang 0.5.15 has


def test_tf32_is_asked_of_both_trainers_on_a_gpu_and_said(tmp_path):
    """--precision tf32: ours --tf32 (our flag, which our CLI accepts), TRL tf32=True on a GPU (None on CPU: the
    switch is a GPU one); the report's differences say it and what it does not cover."""
    from slime_actors.config import parse_config
    prompts = tmp_path / "train.jsonl"
    write_jsonl(prompts, [{"messages": [{"role": "user", "content": "1 + 1?"}], "label": "2"}])
    for device in ("cpu", "cuda"):
        a = _args("--precision", "tf32", "--device", device, "--ours", "local")
        (engine, backend), = run.check(a)
        job = run.job_spec(a, "/models/m", prompts, prompts)
        cmd = run.ours_command(a, job, engine, backend, tmp_path / "run")
        assert "--tf32" in cmd and "--bf16" not in cmd
        cfg = parse_config(cmd[4:])
        assert cfg.train.tf32 and not cfg.train.bf16 and "--enable-tf32-matmul" in cfg.engine.sglang_args
        kw = trl_job.grpo_config_kwargs(job, Path("out"))
        assert kw["tf32"] is (True if device == "cuda" else None) and not kw["bf16"]
    said = " ".join(report.differences({**job, "precision": "tf32"}))
    assert "TF32" in said and "fp32 is the precision both sides share" in said
    fp32 = run.ours_command(_args("--device", "cpu"), run.job_spec(_args("--device", "cpu"), "/m", prompts, prompts),
                            "local", "torch", tmp_path / "run")
    assert "--tf32" not in fp32 and "TF32" not in " ".join(report.differences({**job, "precision": "fp32"}))


# ---------------------------------------------------------------------------------------------- speed_gpu_ab.sh's table

def _ab_summary(orch_ms: float, sps: float) -> dict:
    """A report's summary.json, as report.py writes it, for one of our runs (the fields the A/B table reads)."""
    m = {"samples_per_s": sps, "step_median_s": 1.25, "split_mean_s": {"orchestration": orch_ms / 1e3},
         "split_share": {"orchestration": orch_ms / 1250.0}, "orchestration_share_median": orch_ms / 1300.0,
         "rollout_tail_s": {k: 0.001 * (i + 1) for i, (k, _) in enumerate(split.TAIL)},
         "orchestration_by_message_s": {"buffer.submit": 0.003, "idle": 0.002, "reward.score (scoring)": 0.0015,
                                        "buffer.get_batch": 0.0001},
         "acc_equal_steps": 0.555, "time_to_first_step_s": 61.0, "peak_mem_gib": 42.6}
    return {"runs": {"ours-sglang": {"framework": "ours", "metrics": m}, "trl": {"framework": "trl", "metrics": {}}}}


def test_the_ab_table_puts_each_run_in_a_column_with_the_waits_read_from_the_traces(tmp_path):
    from scripts.compare_trl import ab
    from slime_actors.traces.reader import TraceRun
    from slime_actors.traces.summary import reply_waits
    rec = ROOT / "tests" / "data" / "recordings" / "slow-reward"
    p = subprocess.run([sys.executable, "-m", "scripts.compare_trl.ab", "--waits", str(rec), str(tmp_path / "w.json")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    waits = json.loads((tmp_path / "w.json").read_text())
    direct = reply_waits(TraceRun(str(rec)))
    assert set(waits) == {f"{a} {m}" for (a, m), ms in direct.items() if ms}     # every ask `trace summary` lists
    assert waits["rollout/0 buffer.submit"]["n"] == 8 == len(direct[("rollout/0", "buffer.submit")])
    bad = subprocess.run([sys.executable, "-m", "scripts.compare_trl.ab", "--waits", str(tmp_path), "x.json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "no *.trace (or *.trace.gz) files here" in bad.stderr, bad.stderr
    for n, (which, orch) in enumerate((("old", 18.2), ("new", 16.8)), 1):
        d = tmp_path / f"r{n}_{which}"
        (d / "compare").mkdir(parents=True)
        (d / "compare" / "summary.json").write_text(json.dumps(_ab_summary(orch, 80.0 + n)))
        (d / "waits_ours-sglang.json").write_text(json.dumps(waits))
    (tmp_path / "r3_old").mkdir()                              # a run that failed: no summary
    (tmp_path / "r3_old.log").write_text("it failed")
    (tmp_path / "r4_new" / "compare").mkdir(parents=True)      # one killed while writing it
    (tmp_path / "r4_new" / "compare" / "summary.json").write_text('{"runs": {"ours-sgl')
    out = ab.table(tmp_path)
    rows = {ln.split(" | ")[0].lstrip("| "): ln for ln in out.splitlines()}
    assert out.splitlines()[0] == "| | 1: old | 2: new | 3: old | 4: new |"
    assert rows["orchestration, ms a step (mean % / median step %)"].endswith(
        "| 18.2 (1.46 / 1.40) | 16.8 (1.34 / 1.29) | - | - |"), out
    assert rows["samples/s"].endswith("| 81.0 | 82.0 | - | - |"), out
    last = f"after the last generation: {split.TAIL[-1][1]}, ms"
    assert rows[last].endswith(f"| {len(split.TAIL):.2f} | {len(split.TAIL):.2f} | - | - |"), out
    assert "buffer.submit 3.00; idle 2.00; reward.score (scoring) 1.50 |" in \
        rows["largest orchestration parts, ms a step"], out
    w = waits["rollout/0 reward.score"]
    p50, p95, top = w["p50"], w["p95"], w["max"]
    assert rows["rollout/0's reward.score replies waiting for its loop, ms (p50 / p95 / max)"].endswith(
        f"| {p50:.2f} / {p95:.2f} / {top:.2f} | {p50:.2f} / {p95:.2f} / {top:.2f} | - | - |"), out
    empty = tmp_path / "nothing"
    empty.mkdir()
    with pytest.raises(SystemExit, match="no run folders"):
        ab.table(empty)


def test_speed_gpu_ab_refuses_a_missing_or_wrong_other_tree_and_bad_rounds(tmp_path):
    def go(**env) -> subprocess.CompletedProcess:
        e = {k: v for k, v in os.environ.items() if k not in ("OLD", "ROUNDS")}
        return subprocess.run(["bash", "scripts/speed_gpu_ab.sh"], cwd=ROOT, capture_output=True, text=True,
                              env={**e, "OUT": str(tmp_path / "out"), **env}, timeout=60)
    p = go()
    assert p.returncode != 0 and "set OLD" in p.stderr, p.stderr
    p = go(OLD=str(tmp_path))
    assert p.returncode == 2 and "holds no scripts/speed_gpu_run.sh" in p.stderr, p.stderr
    p = go(OLD=str(ROOT), ROUNDS="0")
    assert p.returncode == 2 and "ROUNDS must be a whole number >= 1, got 0" in p.stderr, p.stderr
