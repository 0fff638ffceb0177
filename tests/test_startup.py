"""Start-up failures end the job in seconds with their cause, never loop (issue 18): a cause no restart can change
stops the job at once, the same cause twice before the actor was ever ready stops it too; the cause is printed
once, last, without tracebacks; status.json says it; nothing is left running. Restarts after an actor was ready
keep the restart intensity rule (tests/test_launch.py)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_launch_support import FAST_FLAGS, ROOT, SLIME, Job, job_processes, job_processes_kill, topology

from slime_actors.launch.startup import Cause, cause_from_output, cause_of, permanent

ENGINE_TRACEBACK = """\
[2026-12-02 02:03:11] INFO loading the model
Traceback (most recent call last):
  File "/x/transformers/configuration_utils.py", line 745, in _get_config_dict
    config_dict = cls._dict_from_json_file(resolved_config_file)
json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: line 2 column 1 (char 24)

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/x/transformers/configuration_utils.py", line 749, in _get_config_dict
    raise OSError(f"It looks like the config file at '{resolved_config_file}' is not a valid JSON file.")
OSError: It looks like the config file at '/m/config.json' is not a valid JSON file.
"""


# -- what is the cause, and can a restart change it --------------------------------------------------------------

def test_the_root_cause_is_the_last_exception_line_and_its_kind_decides():
    c = cause_from_output(ENGINE_TRACEBACK.splitlines())
    assert c == Cause("OSError: It looks like the config file at '/m/config.json' is not a valid JSON file.", True)
    c = cause_from_output(["Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
                           "torch.AcceleratorError: CUDA error: invalid device ordinal",
                           "CUDA kernel errors might be asynchronously reported at some other API call"])
    assert c.text == "torch.AcceleratorError: CUDA error: invalid device ordinal" and c.permanent
    c = cause_from_output(["usage: python -m slime_actors.backends.local_engine [-h] --model-path MODEL_PATH",
                           "python -m slime_actors.backends.local_engine: error: unrecognized arguments: --bogus 1"])
    assert c.permanent and c.text.endswith("unrecognized arguments: --bogus 1")
    assert cause_from_output(["2026-12-02T02:07:01 [info     ] loading", "all fine"]) is None
    # what a restart may change: out of memory (another process may free it), a port taken, a timeout
    for text in ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                 "OSError: [Errno 98] Address already in use", "TimeoutError: the store did not answer"):
        assert not permanent(text), text
    for text in ("ModuleNotFoundError: No module named 'my_reward'", "--device cuda given but CUDA is not available",
                 "RuntimeError: Found no NVIDIA driver on your system.",
                 "OSError: /m does not appear to have a file named config.json",
                 "FileNotFoundError: --hf-checkpoint /m: no such directory"):
        assert permanent(text), text
    # the same cause, numbers aside (a port, a pid)
    assert Cause("RuntimeError: grader at port 4711 refused", False).key == \
        Cause("RuntimeError: grader at port 4712 refused", False).key


def test_exceptions_an_actor_start_raises():
    from slime_actors.backends.engine_process import EngineStartError
    from slime_actors.config import ConfigError
    from slime_actors.launch.startup import StartupError
    exc = EngineStartError("engine process exited while starting: python -m ...", 1, ENGINE_TRACEBACK.splitlines())
    assert cause_of(exc) == Cause("engine: OSError: It looks like the config file at '/m/config.json' is not a valid "
                                  "JSON file.", True)
    # an engine that prints its refusal alone (an uncaught SystemExit("...")), and one that never answered
    assert cause_of(EngineStartError("exited", 1, ["--device cuda given but CUDA is not available"])) == \
        Cause("engine: --device cuda given but CUDA is not available", True)
    slow = EngineStartError("engine not healthy after 600 s: python -m ...", -15, ["loading"], timed_out=True)
    assert cause_of(slow) == Cause("EngineStartError: engine not healthy after 600 s: python -m ... (exit code -15)",
                                   False)
    assert cause_of(ConfigError("--rm-type mth: unknown")).permanent
    assert cause_of(StartupError("--device cuda but trainer/0 sees no GPU")).permanent
    assert cause_of(ModuleNotFoundError("No module named 'x'")).text == "ModuleNotFoundError: No module named 'x'"
    assert not cause_of(RuntimeError("connection reset by peer")).permanent


def test_a_local_engine_whose_model_has_a_broken_config_json_fails_with_that_cause(tmp_path):
    """The engine's own start (a real process): EngineStartError, and its cause is the config.json, permanent."""
    from slime_actors.backends.engine_process import LOCAL_ENGINE_MODULE, EngineStartError, launch_engine
    from slime_actors.models.tiny import make_tiny_model
    model = make_tiny_model(tmp_path / "m")
    (model / "config.json").write_text('{"model_type": "llama", ')
    t0 = time.monotonic()
    with pytest.raises(EngineStartError) as info:
        launch_engine(LOCAL_ENGINE_MODULE, {"model-path": str(model)}, log_path=tmp_path / "engine.log",
                      startup_timeout=120)
    assert time.monotonic() - t0 < 60
    c = cause_of(info.value)
    assert c.permanent and "config.json" in c.text and "not a valid JSON" in c.text, c


# -- the job ends, with the cause, in seconds ----------------------------------------------------------------------

def _run(cmd: list[str], tmp_path: Path, limit: float = 180.0, env: dict | None = None) -> tuple[int, str, float]:
    """Run a job command; (exit code, its output, seconds). A job still running after `limit` (it loops) is killed
    and the test fails. (`limit` guards against a hang; what shows that nothing looped is the restart count: on an
    idle machine these jobs end in 10-20 s.)"""
    out = tmp_path / "job.log"
    t0 = time.monotonic()
    with open(out, "wb") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=str(ROOT), start_new_session=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        try:
            rc = p.wait(limit)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait(10)
            job_processes_kill(tmp_path / "run")   # (actors and engines run in sessions of their own)
            pytest.fail(f"still running after {limit:.0f} s (a start-up failure that loops):\n"
                        + out.read_text(errors="replace")[-4000:])
    return rc, out.read_text(errors="replace"), time.monotonic() - t0


def _no_process_left(run_dir: Path) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < 10 and job_processes(run_dir):
        time.sleep(0.2)
    assert not job_processes(run_dir), job_processes(run_dir)


def test_a_model_with_a_broken_config_json_ends_the_job_with_its_cause(tmp_path):
    """Today's main restarted the actors for 105 s (16 restarts) and ended on `the training group failed 6 times`.
    A config.json that is not JSON is now refused by the head before anything starts (json_files.py); one that is
    JSON but names a model transformers does not know still fails the trainer's start, once."""
    from slime_actors.models.tiny import make_tiny_model
    model = make_tiny_model(tmp_path / "model")
    (model / "config.json").write_text('{"model_type": "llama", ')
    run_dir = tmp_path / "run"
    cmd = [SLIME, "train", *FAST_FLAGS, "--hf-checkpoint", str(model), "--run-dir", str(run_dir), "--num-rollout", "2"]
    rc, out, _ = _run(cmd, tmp_path)
    assert rc == 2, out[-3000:]
    assert f"error: --hf-checkpoint {model}: {model / 'config.json'}: not valid JSON (" in out, out[-3000:]
    assert "Traceback" not in out and not run_dir.exists(), out[-3000:]
    (model / "config.json").write_text('{"model_type": "no-such-model"}')
    rc, out, _ = _run(cmd, tmp_path)
    assert rc != 0, out[-3000:]
    lines = out.strip().splitlines()
    assert lines[-1].startswith("cause: ") and "no-such-model" in lines[-1] and \
        "does not recognize this architecture" in lines[-1], out[-3000:]
    assert "could not start, and starting it again cannot change the cause (its log: " in lines[-2]
    assert out.count("does not recognize this architecture") == 1, out[-6000:]   # printed once
    assert "Traceback" not in out and "restarts" not in out, out[-6000:]
    st = json.loads((run_dir / "status.json").read_text())
    assert st["state"] == "failed" and "no-such-model" in st["cause"] and st["restarts"] == 0
    _no_process_left(run_dir)


def test_a_bad_user_function_ends_the_job_with_its_error_and_no_engine_is_left(tmp_path):
    """The rollout worker launches its engine first and loads the user's functions while it boots
    (actors/rollout.py): a function that cannot be used -- found at config time, refused when loaded -- still fails
    the start with its own error, and the engine already launched is stopped (tests/test_rollout_start.py checks the
    stop itself, in-process)."""
    gen = tmp_path / "gen.py"
    gen.write_text("async def generate(args, sample):\n    return sample\n")
    run_dir = tmp_path / "run"
    rc, out, _ = _run([SLIME, "train", *FAST_FLAGS, "--run-dir", str(run_dir), "--num-rollout", "2",
                       "--custom-generate-function-path", f"{gen}:generate"], tmp_path)
    assert rc != 0, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("cause: ") and f"--custom-generate-function-path {gen}:generate: expected async " \
        "generate(args, sample, sampling_params)" in last, out[-3000:]
    assert (run_dir / "logs" / "engine-0.log").exists()   # the engine was launched before the function was refused
    _no_process_left(run_dir)


def test_device_cuda_without_cuda_is_refused_before_any_process_starts(tmp_path):
    """The plain command with --device cuda on a machine without a GPU: refused in seconds, nothing written."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    run_dir = tmp_path / "run"
    rc, out, _ = _run([SLIME, "train", *FAST_FLAGS, "--device", "cuda", "--run-dir", str(run_dir)], tmp_path)
    assert rc == 2, out
    assert out.strip().splitlines()[-1].startswith("slime-actors train: error: --device cuda but no GPU is visible "
                                                   "here (torch.cuda.device_count()"), out
    assert out.strip().endswith("use --device cpu, or run where a GPU is visible"), out
    assert not run_dir.exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_device_cuda_without_cuda_ends_the_job_when_the_actors_find_out(tmp_path):
    """The head of a job over several hosts does not count the other hosts' GPUs: its actors find there is no GPU
    when they start, and that ends the job at once (today's main: ZeroDivisionError, restarted until the restart
    limit)."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    topo = topology(tmp_path, "[nodes.local]\n[roles.buffer]\n[roles.reward]\n[roles.rollout]\n[roles.trainer]\n")
    run_dir = tmp_path / "run"
    rc, out, _ = _run([SLIME, "launch", str(topo), "--node", "local:0", "--head-port", str(_free_port()),
                       *FAST_FLAGS, "--device", "cuda", "--run-dir", str(run_dir), "--status", "changes"], tmp_path,
                      env={"SLIME_ACTORS_HOST": "127.0.0.1"})
    assert rc != 0, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("cause: ") and ("sees no GPU" in last or "CUDA is not available" in last), out[-3000:]
    assert "Traceback" not in out, out[-6000:]
    st = json.loads((run_dir / "status.json").read_text())
    assert st["state"] == "failed" and st["cause"] == last[len("cause: "):] and st["restarts"] == 0
    _no_process_left(run_dir)


FLAKY = '''
import os
from slime_actors.actors.reward import RewardWorker


class FlakyReward(RewardWorker):
    """A reward worker whose start fails the same way every time, with a different number in the message."""

    async def on_start(self):
        raise RuntimeError(f"could not reach the grader (connection {os.getpid()} reset)")
'''


def test_the_same_start_up_failure_twice_stops_the_job(tmp_path):
    """A cause a restart might change is given one more start; failing again the same way stops the job (today's
    main: restarted until the restart intensity limit, 6 starts)."""
    (tmp_path / "flaky.py").write_text(FLAKY)
    topo = topology(tmp_path, f"""
[supervisor]
max_restarts = 5
window = 600
[roles.buffer]
[roles.rollout]
[roles.trainer]
[roles.reward]
class = "{tmp_path / 'flaky.py'}:FlakyReward"
""")
    job = Job(tmp_path, topo, [*FAST_FLAGS, "--num-rollout", "2"]).start()
    try:
        rc = job.wait(180)
        out = job.log()
        assert rc == 1, out[-3000:]
        lines = out.strip().splitlines()
        assert lines[-2].startswith("slime-actors launch: job stopped: reward/0 failed to start twice with the same "
                                    "cause"), out[-3000:]
        assert lines[-1].startswith("cause: RuntimeError: could not reach the grader (connection "), out[-3000:]
        assert out.count("reward/0 | failed to start: RuntimeError: could not reach the grader") == 1  # the retry
        assert "Traceback" not in out
        st = job.status()
        assert st["processes"]["reward/0"]["restarts"] == 1 and st["state"] == "failed"
        _no_process_left(job.run_dir)
    finally:
        job.close()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_an_actor_process_reports_its_start(tmp_path):
    """launch/actor.py: a class that cannot be built is a permanent cause (exit 78) and says so in its report."""
    from slime_actors.launch.startup import EXIT_PERMANENT, read_report, report_path
    env = {**os.environ, "SLIME_ACTORS_RUN_DIR": str(tmp_path / "run"),
           "SLIME_ACTORS_ACTOR_CLASS": "no_such_module_here:Nope"}
    env.pop("SLIME_ACTORS_JOB", None)
    p = subprocess.Popen([sys.executable, "-m", "slime_actors.launch.actor", "buffer", "0"], env=env,
                         cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = p.communicate(timeout=120)
    assert p.returncode == EXIT_PERMANENT and "no_such_module_here" in err
    report = read_report(tmp_path / "run", "buffer/0", p.pid)
    assert report["state"] == "failed" and report["permanent"] and "no_such_module_here" in report["cause"]
    assert report_path(tmp_path / "run", "buffer/0").name == "buffer-0.start.json"
    assert read_report(tmp_path / "run", "buffer/0", p.pid + 1) is None   # another process's report is not read
