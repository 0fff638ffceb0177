"""The RL loop end to end on CPU (local engine, tiny model): it learns, and the flags around it work."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "digits" / "config.toml"
BIN = Path(sys.executable).parent / "slime-actors"


def train(run_dir, *flags, timeout=420, check=True):
    cmd = [str(BIN), "train", "--config", str(CONFIG), "--run-dir", str(run_dir), "--progress", "false", *flags]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if check and p.returncode != 0:
        raise AssertionError(f"train failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")
    return p


def metrics(run_dir):
    return [json.loads(line) for line in open(Path(run_dir) / "metrics.jsonl")]


@pytest.mark.slow
def test_main_job_learns_and_logprobs_match(tmp_path):
    run = tmp_path / "run"
    train(run, "--num-rollout", "40", "--eval-interval", "40")
    result = json.loads((run / "result.json").read_text())
    before, after = result["eval_before"]["heldout"], result["eval_after"]["heldout"]
    assert after - before >= 0.3, f"held-out reward {before} -> {after}"
    steps = metrics(run)
    assert len(steps) == 40 and steps[-1]["weight_version_after"] == 40
    # the trainer's log-probs of the sampled tokens equal the engine's (fp32, CPU) at every step
    diffs = [s["train/train_rollout_logprob_abs_diff_max"] for s in steps]
    assert max(diffs) <= 1e-5, max(diffs)
    # an honest run: the reward-hacking monitor reports on every rollout and no alarm trips (docs/debugging.md)
    assert all(s["hack/scored"] == 128 for s in steps)
    assert all(s["hack/answer_present"] == 1.0 for s in steps if s["hack/rewarded_share"] > 0)
    assert all(s[f"hack/alarm/{a}"] == 0.0 for s in steps for a in ("rewarded_truncated", "collapse",
                                                                       "answer_absent", "prompt_blind", "jump"))
    # prompts that share a first digit share their answer, but exact_match pays an answer for its label alone
    assert all(s.get("hack/blind_share", 0.0) == 0.0 for s in steps)
    assert not (run / "alarms.jsonl").exists()
    assert (run / "curves.png").stat().st_size > 10_000
    assert any((run / "tensorboard").iterdir())
    assert len(list((run / "traces").glob("*.trace"))) >= 6
    # where the time to the first step went (slime_actors/startup_timeline.py): every actor's start-up phases, the controller's
    st = json.loads((run / "startup.json").read_text())
    assert set(st["actors"]) == {"buffer/0", "reward/0", "rollout/0", "trainer/0"}
    phases = {a: [p[0] for p in v["phases"]] for a, v in st["actors"].items()}
    assert {"engine start", "tokenizer"} <= set(phases["rollout/0"])
    assert {"import torch", "model load"} <= set(phases["trainer/0"])
    steps = [p[0] for p in st["steps"]]
    assert steps[:2] == ["actors up", "trainers ready"] and steps[-3:] == ["rollout 0", "train 0", "weight sync 0"]
    assert 0 < st["actors"]["trainer/0"]["ready"] < st["total_s"] and st["steps"][-1][2] <= st["total_s"]
    # every actor process and the local engine's froze what their start-up built (slime_actors/gc_watch.py)
    for a in ("buffer-0", "reward-0", "rollout-0", "trainer-0"):
        assert '"event": "garbage collector settled"' in (run / "logs" / f"{a}.jsonl").read_text(), a
    ready = [ln for ln in (run / "logs" / "engine-0.log").read_text().splitlines() if "local engine ready" in ln]
    assert len(ready) == 1 and "gc_frozen=" in ready[0] and "gc_frozen=None" not in ready[0], ready


@pytest.mark.slow
def test_samples_are_shown_and_evaluations_saved(tmp_path):
    run = tmp_path / "run"
    p = train(run, "--num-rollout", "3", "--eval-interval", "2", "--log-samples-interval", "2")
    # the best and the worst sample of one group: rollouts 0 and 2 (the interval, and the last) on the console ...
    assert "rollout 0 samples (group" in p.stderr and "rollout 2 samples (group" in p.stderr
    assert "rollout 1 samples (group" not in p.stderr
    assert "  prompt   " in p.stderr and "first =" in p.stderr
    # ... the last one again in the summary, and every one as TensorBoard text
    assert "last rollout 2 samples (group" in p.stdout
    events = b"".join(f.read_bytes() for f in (run / "tensorboard").iterdir())
    assert events.count(b"rollout/samples") >= 3
    # every evaluation's responses (before training, after step 2, after the last step), in prompt order
    files = sorted(f.name for f in (run / "evals").iterdir())
    assert files == ["heldout_step000000.jsonl", "heldout_step000002.jsonl", "heldout_step000003.jsonl"]
    rows = [json.loads(line) for line in (run / "evals" / "heldout_step000003.jsonl").read_text().splitlines()]
    assert len(rows) == 100 and all(r["response"] is not None and r["reward"] in (0.0, 1.0) for r in rows)
    result = json.loads((run / "result.json").read_text())
    assert abs(sum(r["reward"] for r in rows) / 100 - result["eval_after"]["heldout"]) < 1e-9
    # no rollout was saved: the samples command reads the buffer's trace
    out = subprocess.run([str(BIN), "samples", str(run), "--worst", "--n", "3"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("rollout 2: 128 samples") and out.stdout.count("--- reward") == 3


@pytest.mark.slow
def test_own_reward_actor(tmp_path):
    run = tmp_path / "run"
    train(run, "--num-rollout", "2", "--eval-interval", "0", "--reward-actor-class",
          "examples/reward_actor/judge.py:DigitJudge", "--rm-type", "exact_match")
    from slime_actors.traces.reader import TraceRun
    tr = TraceRun(run)
    assert tr.meta("reward/0")["actor_class"].endswith("DigitJudge")
    handled = [e for e in tr.events("reward/0") if e.ev == "handled" and e.method == "score"]
    assert handled and all(e.extra["outcome"] == "ok" for e in handled)
    assert metrics(run)[-1]["rollout/reward_mean"] is not None


@pytest.mark.slow
def test_a_reward_function_that_raises_loses_nothing(tmp_path):
    rm = tmp_path / "flaky_rm.py"
    rm.write_text("def reward(args, sample):\n"
                  "    if sample.label == '3':\n"
                  "        raise RuntimeError('judge crashed on a 3')\n"
                  "    return float(sample.response.strip() == sample.label)\n")
    run = tmp_path / "run"
    train(run, "--num-rollout", "3", "--eval-interval", "0", "--custom-rm-path", f"{rm}:reward")
    steps = metrics(run)
    assert len(steps) == 3
    assert sum(s["rollout/failed"] for s in steps) > 0, "no group hit the failing reward"
    log = (run / "logs" / "reward-0.jsonl").read_text()
    assert "judge crashed on a 3" in log


@pytest.mark.parametrize("broken", ["reward", "generate"])
def test_a_reward_or_generate_function_that_always_raises_stops_the_job_with_its_error(tmp_path, broken):
    """A user's reward that raises for every sample, or a generate function that does: the groups fail (a group whose
    generation raised is made again twice, then failed), and once twice --rollout-batch-size of them failed, the job
    stops with the last error as its last line -- before, it made groups for ever and wrote errors by the million."""
    fn = tmp_path / "mine.py"
    fn.write_text("async def reward(args, sample):\n"
                  "    raise ValueError('no answer field in ' + sample.prompt)\n"
                  "async def generate(args, sample, sampling_params):\n"
                  "    raise KeyError('answer')\n")
    flag = "--custom-rm-path" if broken == "reward" else "--custom-generate-function-path"
    p = train(tmp_path / "run", "--num-rollout", "2", "--eval-interval", "0", flag, f"{fn}:{broken}",
              timeout=180, check=False)
    assert p.returncode == 1, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("slime-actors train: training loop failed: buffer/0.wait_rollout failed: RuntimeError: "
                           "rollout 0 failed: "), last
    assert "of its groups failed (the limit is 32: twice --rollout-batch-size" in last
    if broken == "reward":
        assert "reward failed: " in last and "ValueError: no answer field in" in last
    else:
        assert "failed 3 times; the last: error: KeyError('answer')" in last
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not metrics(tmp_path / "run")   # no step trained


@pytest.mark.slow
def test_async_mode_and_disk_weight_sync(tmp_path):
    run = tmp_path / "run"
    train(run, "--num-rollout", "4", "--eval-interval", "0", "--async-train", "--update-weight-transport", "disk")
    steps = metrics(run)
    assert [s["weight_version_after"] for s in steps] == [1, 2, 3, 4]
    for s in steps:
        # one-step-off: samples are at most --max-staleness (1) versions older than the weights trained on them
        assert s["weight_version"] - s["rollout/weight_version_min"] <= 1
    assert any(s["weight_version"] - s["rollout/weight_version_min"] == 1 for s in steps[1:]), \
        "generation never overlapped training"


@pytest.mark.slow
def test_checkpoint_resume_continues_exactly(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    train(a, "--num-rollout", "4", "--eval-interval", "0", "--save", str(a / "ckpt"), "--save-interval", "2")
    assert (a / "ckpt" / "iter_0000002" / "meta.json").exists()
    # a second run picks up from the step-2 checkpoint of the first and must reproduce its steps 3 and 4
    (b / "ckpt").mkdir(parents=True)
    os.symlink(a / "ckpt" / "iter_0000002", b / "ckpt" / "iter_0000002")
    (b / "ckpt" / "latest_checkpointed_iteration.txt").write_text("2")
    train(b, "--num-rollout", "4", "--eval-interval", "0", "--load", str(b / "ckpt"))
    ma, mb = metrics(a), metrics(b)
    assert [m["rollout_id"] for m in mb] == [2, 3]
    for x, y in zip(ma[2:], mb):
        for key in ("rollout/reward_mean", "train/loss", "train/grad_norm", "train/entropy"):
            assert abs(x[key] - y[key]) <= 1e-6, (key, x[key], y[key])


def _files_holding(root: Path, *secrets: str) -> list[str]:
    found = []
    for f in root.rglob("*"):
        if f.is_file() and f.parent.name != "keys":
            data = f.read_bytes()
            found += [f"{f.relative_to(root)}" for s in secrets if s.encode() in data]
    return found


@pytest.mark.slow
def test_trains_with_engine_keys_that_stay_secret(tmp_path):
    """The job's engines take keys by default; the run trains as before, and no key -- neither the job's nor one the
    user gave on the command line -- is in job.json, the traces, the logs or the engine's command line."""
    run = tmp_path / "run"
    given = "user-given-api-key-" + "7" * 20
    train(run, "--num-rollout", "2", "--eval-interval", "0", "--skip-eval-before-train", "--engine-api-key", given)
    assert [s["weight_version_after"] for s in metrics(run)] == [1, 2]
    keys = run / "keys"
    assert keys.stat().st_mode & 0o777 == 0o700
    assert {f.name: f.stat().st_mode & 0o777 for f in keys.iterdir()} == {
        "job.public": 0o600, "job.secret": 0o600, "engine.api_key": 0o600, "engine.admin_key": 0o600,
        "engine-0.yaml": 0o600}
    assert (keys / "engine.api_key").read_text().strip() == given
    admin = (keys / "engine.admin_key").read_text().strip()
    assert len(admin) == 64 and admin != given
    assert _files_holding(run, given, admin) == []
    started = [json.loads(line) for line in open(run / "logs" / "rollout-0.jsonl")
               if '"starting engine"' in line and '"module"' in line][0]
    assert f"--config {keys / 'engine-0.yaml'}" in started["flags"] and "--api-key" not in started["flags"]
    job = json.loads((run / "job.json").read_text())
    assert job["engine_api_key"] is None and job["engine_auth"] is True


@pytest.mark.slow
def test_external_engine_with_the_users_keys_and_one_without(tmp_path):
    """An engine someone else started: the job uses the keys the user gives (files), every request it sends carries
    the right one (the engine refused none); an engine without keys, used without keys, gets a warning."""
    from slime_actors.backends.engine_auth import EngineKeys
    from slime_actors.backends.engine_process import LOCAL_ENGINE_MODULE, launch_engine
    from slime_actors.models import resolve_checkpoint
    model = resolve_checkpoint("tiny:digits", tmp_path / "models")
    keys = EngineKeys.create()
    files = {}
    for name, key in (("api", keys.api_key), ("admin", keys.admin_key)):
        files[name] = tmp_path / f"{name}.key"
        files[name].write_text(key + "\n")
        files[name].chmod(0o600)
    keyed = launch_engine(LOCAL_ENGINE_MODULE, ["--model-path", str(model), "--weight-version", "0", "--config",
                                                str(keys.write_engine_config(tmp_path / "k" / "e.yaml"))],
                          log_path=tmp_path / "keyed.log", startup_timeout=120)
    open_engine = launch_engine(LOCAL_ENGINE_MODULE, ["--model-path", str(model), "--weight-version", "0"],
                                log_path=tmp_path / "open.log", startup_timeout=120)
    try:
        common = ["--hf-checkpoint", str(model), "--num-rollout", "2", "--eval-interval", "0",
                  "--skip-eval-before-train"]
        train(tmp_path / "a", *common, "--rollout-external-engine-addrs", keyed.base_url,
              "--engine-api-key-file", str(files["api"]), "--engine-admin-api-key-file", str(files["admin"]))
        p = train(tmp_path / "b", *common, "--rollout-external-engine-addrs", open_engine.base_url)

        import asyncio
        from slime_actors.backends.engine_client import EngineClient

        async def info():
            async with EngineClient(keyed.base_url, keys=keys) as c:
                return await c.get_server_info(), await c.get_weight_version()
        server, version = asyncio.run(info())
    finally:
        keyed.stop()
        open_engine.stop()
    assert [s["weight_version_after"] for s in metrics(tmp_path / "a")] == [1, 2] and version == "2"
    assert server["refused_requests"] == 0
    assert _files_holding(tmp_path / "a", keys.api_key, keys.admin_key) == []
    assert [s["weight_version_after"] for s in metrics(tmp_path / "b")] == [1, 2]
    assert "warning: --rollout-external-engine-addrs: no engine keys given" in p.stderr
    warned = (tmp_path / "b" / "logs" / "rollout-0.jsonl").read_text()
    assert f"engine {open_engine.base_url} runs without an API key" in warned
    # the run replays as it ran, actor by actor, with the engine gone: the rollout worker's calls to the external
    # engine (its key check, its weight version, every generate) are recorded inputs (issue 22)
    from slime_actors.traces.reader import TraceRun
    from slime_actors.traces.replay import replay
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        for actor in TraceRun(tmp_path / "a").actors():
            rep = replay(str(tmp_path / "a"), actor)
            assert rep.identical, rep.render()
    finally:
        os.chdir(cwd)


def test_bad_config_is_a_clear_error(tmp_path):
    p = subprocess.run([str(BIN), "train", "--config", str(CONFIG), "--rollout-batch-size", "0"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--rollout-batch-size must be >= 1" in p.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("rollout_batch_sise = 4\n")
    p = subprocess.run([str(BIN), "train", "--config", str(bad)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "unknown key 'rollout_batch_sise'" in p.stderr
