"""slime-actors sbatch: the generated batch script (heterogeneous and homogeneous layouts), and a real Slurm run.

The real run needs a Slurm that `sinfo` shows up (scripts/start_slurm.sh brings a single-node one up from Debian's
packages; `make test` runs it first when root). It submits the generated script with sbatch, waits for it, and
checks that the RL loop ran to completion: metrics, a checkpoint, traces.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from test_launch_support import DIGITS, ROOT, SLIME

HETERO = ROOT / "examples" / "launch" / "slurm-hetero.toml"


def sbatch_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([SLIME, "sbatch", *args], capture_output=True, text=True, timeout=120, cwd=str(ROOT))


def test_heterogeneous_script_has_a_component_per_node_group_and_a_step_per_role(tmp_path):
    p = sbatch_script(str(HETERO), "--config", DIGITS, "--run-dir", str(tmp_path / "run"))
    assert p.returncode == 0, p.stderr
    s = p.stdout
    assert s.startswith("#!/bin/bash")
    assert s.count("#SBATCH hetjob") == 1
    assert "#SBATCH --nodes=1 --ntasks-per-node=1 --gpus-per-node=8" in s      # trainer nodes
    assert "#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8" in s      # rollout nodes
    assert 'scontrol show hostnames "${SLURM_JOB_NODELIST_HET_GROUP_0}"' in s
    assert 'scontrol show hostnames "${SLURM_JOB_NODELIST_HET_GROUP_1}"' in s
    assert "head=${nodes_train[0]}" in s
    for role in ("buffer", "reward", "rollout", "trainer"):
        assert f"--job-name={role}" in s and f"--roles {role}" in s
    assert "--het-group=1" in s and "--node gen:$SLURM_PROCID" in s
    assert "--head-port \"$port\" --roles none" in s
    assert "slime_actors.launch.slurm keys" in s
    # bash accepts it
    f = tmp_path / "job.sbatch"
    f.write_text(s)
    assert subprocess.run(["bash", "-n", str(f)]).returncode == 0


def test_sbatch_bad_input_is_reported(tmp_path):
    bad = tmp_path / "t.toml"
    bad.write_text("[roles.rollout]\ncount = 1\ngpus_per_actr = 1\n")
    p = sbatch_script(str(bad), "--config", DIGITS)
    assert p.returncode == 2
    assert "t.toml:3: roles.rollout.gpus_per_actr: unknown key (did you mean 'gpus_per_actor'?)" in p.stderr
    p = sbatch_script(str(HETERO), "--config", DIGITS, "--rollout-batch-size", "12", "--global-batch-size", "96")
    assert p.returncode == 2 and "multiple of the trainer ranks" in p.stderr


def test_engine_keys_in_the_batch_script(tmp_path):
    """The script makes the engines' HTTP keys once, with the CURVE keys (none for external engines: only the user's
    fit them), keeps keys the user exported, and never holds a key given in the flags."""
    import os
    import sys
    p = sbatch_script(str(HETERO), "--config", DIGITS)
    assert p.returncode == 0 and 'slime_actors.launch.slurm keys --engine)"' in p.stdout
    p = sbatch_script(str(HETERO), "--config", DIGITS, "--rollout-external-engine-addrs", "h:1")
    assert p.returncode == 0 and 'slime_actors.launch.slurm keys)"' in p.stdout
    p = sbatch_script(str(HETERO), "--config", DIGITS, "--engine-api-key", "s3cret")
    assert p.returncode == 2 and "--engine-api-key would be written into the batch script" in p.stderr
    assert "s3cret" not in p.stdout

    def keys(*args, **env):
        base = {k: v for k, v in os.environ.items() if not k.startswith("SLIME_ACTORS_")}
        out = subprocess.run([sys.executable, "-m", "slime_actors.launch.slurm", "keys", *args], capture_output=True,
                             text=True, timeout=60, env={**base, **env}, cwd=str(ROOT))
        assert out.returncode == 0, out.stderr
        return dict(line.removeprefix("export ").split("=", 1) for line in out.stdout.splitlines())
    made = keys("--engine")
    assert set(made) == {"SLIME_ACTORS_CURVE_PUBLIC", "SLIME_ACTORS_CURVE_SECRET", "SLIME_ACTORS_ENGINE_API_KEY",
                         "SLIME_ACTORS_ENGINE_ADMIN_KEY"}
    assert set(keys()) == {"SLIME_ACTORS_CURVE_PUBLIC", "SLIME_ACTORS_CURVE_SECRET"}
    kept = keys("--engine", SLIME_ACTORS_ENGINE_API_KEY="mine")
    assert "SLIME_ACTORS_ENGINE_API_KEY" not in kept and "SLIME_ACTORS_ENGINE_ADMIN_KEY" in kept


def _slurm_up() -> str | None:
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return "no Slurm here (scripts/start_slurm.sh installs one; `make test` runs it as root)"
    p = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=20)
    state = p.stdout.strip().splitlines()[0] if p.stdout.strip() else ""
    if p.returncode != 0 or not state.startswith(("idle", "mix", "alloc")):
        return f"Slurm is not up (sinfo: {p.stdout.strip() or p.stderr.strip()})"
    return None


@pytest.mark.skipif(_slurm_up() is not None, reason=str(_slurm_up()))
def test_sbatch_runs_the_rl_loop_on_slurm(tmp_path):
    topo = tmp_path / "topo.toml"
    topo.write_text('[slurm]\ntime = "00:15:00"\njob_name = "slime-actors-test"\n\n[nodes.main]\ncount = 1\n\n'
                    "[roles.buffer]\n[roles.reward]\n[roles.rollout]\n[roles.trainer]\n")
    run_dir, save = tmp_path / "run", tmp_path / "ckpt"
    p = sbatch_script(str(topo), "--output", str(tmp_path / "slurm-%j.out"), "--config", DIGITS,
                      "--num-rollout", "3", "--rollout-batch-size", "8", "--n-samples-per-prompt", "4",
                      "--global-batch-size", "32", "--micro-batch-size", "32", "--run-dir", str(run_dir),
                      "--save", str(save), "--save-interval", "3", "--progress", "false",
                      "--skip-eval-before-train")
    assert p.returncode == 0, p.stderr
    script = tmp_path / "job.sbatch"
    script.write_text(p.stdout)
    sub = subprocess.run(["sbatch", "--wait", "--parsable", str(script)], capture_output=True, text=True,
                         timeout=600, cwd=str(tmp_path))
    outs = sorted(tmp_path.glob("slurm-*.out"))
    log = outs[-1].read_text(errors="replace") if outs else "(no output file)"
    assert sub.returncode == 0, f"sbatch --wait: {sub.returncode} {sub.stderr}\n{log[-5000:]}"
    res = json.loads((run_dir / "result.json").read_text())
    assert res["steps"] == 3
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["rollout_id"] for m in metrics] == [0, 1, 2]
    assert (save / "iter_0000003" / "meta.json").exists() and (save / "iter_0000003" / "trainer").is_dir()
    traces = {f.name.split(".")[0] for f in (run_dir / "traces").iterdir()}
    for actor in ("controller-0", "buffer-0", "rollout-0", "reward-0", "trainer-0"):
        assert any(t.startswith(actor) for t in traces), (actor, traces)
    assert res["accounting"]["trained_more"] == 0 and res["accounting"]["lost"] == 0
    # every actor ran under Slurm: one step per role, on the node Slurm gave
    assert "done: 3 steps" in log


def test_run_dir_from_the_topology_or_the_option(tmp_path):
    topo = tmp_path / "t.toml"
    topo.write_text(f'[slurm]\nrun_dir = "{tmp_path}/shared/run"\n[roles.buffer]\n[roles.reward]\n[roles.rollout]\n'
                    '[roles.trainer]\n')
    p = sbatch_script(str(topo), "--config", DIGITS)
    assert p.returncode == 0, p.stderr
    line = next(x for x in p.stdout.splitlines() if x.startswith("JOB_ARGS=("))
    assert f"--run-dir {tmp_path}/shared/run" in line
    p = sbatch_script(str(topo), "--config", DIGITS, "--run-dir", str(tmp_path / "flag"), "--run-dir", str(tmp_path / "opt"))
    assert p.returncode == 0, p.stderr
    line = next(x for x in p.stdout.splitlines() if x.startswith("JOB_ARGS=("))
    assert f"--run-dir {tmp_path}/opt" in line and "flag" not in line and "shared" not in line
