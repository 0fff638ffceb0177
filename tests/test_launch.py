"""Topology files (placement, validation with key and line) and the launcher: status, clean shutdown with no orphan
processes (engines included) on SIGTERM / SIGINT -- and when the launcher itself is SIGKILLed --, and the restart
intensity limit that stops a job whose actor keeps dying."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from test_launch_support import DIGITS, FAST_FLAGS, ROOT, SLIME, Job, job_processes, topology

from slime_actors.config import parse_config
from slime_actors.launch.topology import TopologyError, default_topology, from_dict, load_topology, toml_key_lines


def load_text(tmp_path, text: str, name: str = "t.toml"):
    p = tmp_path / name
    p.write_text(text)
    return load_topology(p)


# ------------------------------------------------------------------------------------------------ topology files
def test_examples_load_and_plan():
    for path in sorted((ROOT / "examples" / "launch").glob("*.toml")):
        topo = load_topology(path)
        plan = topo.plan()
        assert plan, path
        names = [p.name for p in plan]
        assert len(names) == len(set(names)), path


def test_placement_gpus_cpus_colocation(tmp_path):
    topo = load_topology(ROOT / "examples" / "launch" / "colocated-1node.toml")
    plan = {p.name: p for p in topo.plan()}
    assert [plan[f"trainer/{i}"].gpus for i in range(8)] == [[i] for i in range(8)]
    assert [plan[f"rollout/{i}"].gpus for i in range(8)] == [[i] for i in range(8)]   # shares trainer i's GPU
    assert plan["buffer/0"].cpus == [0]
    assert plan["reward/0"].cpus == [1, 2] and plan["reward/1"].cpus == [3, 4]         # the pool skips CPU 0
    env = plan["rollout/3"].process_env()
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["SGLANG_LOG_LEVEL"] == "warning"
    assert plan["reward/1"].process_env()["SLIME_ACTORS_CPUS"] == "3,4"
    assert plan["trainer/2"].policy.group and plan["trainer/2"].policy.max_restarts == 3
    assert plan["rollout/0"].policy.max_restarts == 10 and not plan["rollout/0"].policy.group

    topo = load_topology(ROOT / "examples" / "launch" / "separate-1node.toml")
    plan = {p.name: p for p in topo.plan()}
    assert plan["trainer/3"].gpus == [3] and plan["rollout/1"].gpus == [6, 7]

    topo = load_topology(ROOT / "examples" / "launch" / "slurm-hetero.toml")
    plan = {p.name: p for p in topo.plan()}
    assert (plan["rollout/1"].node_group, plan["rollout/1"].node_index, plan["rollout/1"].gpus) == ("gen", 0, [4, 5, 6, 7])
    assert (plan["rollout/2"].node_index, plan["rollout/2"].gpus) == (1, [0, 1, 2, 3])
    assert plan["trainer/7"].process_env()["LOCAL_RANK"] == "7"


@pytest.mark.parametrize("text,where,msg", [
    ("[roles.buffer]\n[roles.rollout]\ncount = 'two'\n", "t.toml:3: roles.rollout.count",
     "must be an integer >= 0, got str 'two'"),
    ("[roles.rollout]\ncount = 1\n\n[roles.trainer]\ncuont = 2\n", "t.toml:5: roles.trainer.cuont",
     "unknown key (did you mean 'count'?)"),
    ("[nodes.gpu]\ngpus = 2\n[roles.trainer]\nnodes = \"gpu\"\ncount = 3\ngpus_per_actor = 1\n",
     "t.toml:6: roles.trainer.gpus_per_actor", "trainer/2 needs 1 GPU(s) but node 0 of node group 'gpu' has 0 left"),
    ("[roles.rollout]\nnodes = \"gen\"\n", "t.toml:2: roles.rollout.nodes", "no node group 'gen'"),
    ("[roles.rollout]\ncolocate = \"trainer\"\n", "t.toml:2: roles.rollout.colocate", "no other role"),
    ("[roles.judge]\ncount = 1\n", "t.toml:1: roles.judge", "unknown role"),
    ("[supervisor]\nwindow = -1\n[roles.buffer]\n", "t.toml:2: supervisor.window", "must be a number > 0"),
    ("[roles.rollout]\nenv = { OK = \"1\", \"bad name\" = \"x\" }\n", "t.toml:2: roles.rollout.env.bad name",
     "not a valid environment variable name"),
    ("[roles.rollout]\ngpus = [[0], [1]]\n", "t.toml:2: roles.rollout.gpus", "has 2 lists but the role has 1"),
    ("[roles.buffer]\n[roles.controller]\n", "t.toml:2: roles.controller", "runs in the head process"),
    ("[job]\nconfig = 3\n[roles.buffer]\n", "t.toml:2: job.config", "must be a non-empty string"),
    ("[slurm]\nlayout = \"ring\"\n[roles.buffer]\n", "t.toml:2: slurm.layout", "must be auto, heterogeneous"),
    ("head = \"x\"\n[roles.buffer]\n", "t.toml:1: head", "no node group 'x'"),
])
def test_errors_name_key_and_line(tmp_path, text, where, msg):
    with pytest.raises(TopologyError) as ei:
        load_text(tmp_path, text)
    s = str(ei.value)
    assert s.startswith(str(tmp_path / "t.toml").rsplit("/", 1)[0]) and where in s and msg in s, s


def test_toml_syntax_error_and_missing_file(tmp_path):
    with pytest.raises(TopologyError, match="not valid TOML"):
        load_text(tmp_path, "[roles.buffer\n")
    with pytest.raises(TopologyError, match="does not exist"):
        load_topology(tmp_path / "nope.toml")


def test_key_lines_of_tables_arrays_inline_and_multiline():
    text = ('# c\n[a]\nx = 1  # note\nlist = [\n  1,\n  2,\n]\n[a.b]\n"q.k" = { y = 2, z = "#" }\n'
            '[[arr]]\nv = 1\n[[arr]]\nv = 2\nafter = 3\n')
    lines = toml_key_lines(text)
    assert lines["a"] == 2 and lines["a.x"] == 3 and lines["a.list"] == 4 and lines["a.b"] == 8
    assert lines["a.b.q.k"] == 9 and lines["a.b.q.k.y"] == 9 and lines["a.b.q.k.z"] == 9
    assert lines["arr.0.v"] == 11 and lines["arr.1.v"] == 13 and lines["arr.1.after"] == 14


def test_lines_are_found_by_the_toml_parser_itself(tmp_path):
    """A multi-line string whose lines look like tables and keys (an environment variable holding a snippet) does
    not move a key: the error names the line the key is really on."""
    text = ('[env]\nNOTE = """\n[roles.trainer]\ncount = 1\n"""\n\n[roles.buffer]\n\n'
            '[roles.trainer]  # the ranks\ncount = "two"\n')
    with pytest.raises(TopologyError, match=r"t.toml:10: roles.trainer.count: must be an integer >= 0, got str 'two'"):
        load_text(tmp_path, text)
    lines = toml_key_lines(text)
    assert lines["env.NOTE"] == 2 and lines["roles.buffer"] == 7 and lines["roles.trainer"] == 9


def test_yaml_topology_lines(tmp_path):
    pytest.importorskip("yaml")
    topo = load_text(tmp_path, "roles:\n  buffer: {}\n  trainer:\n    count: 2\n", "t.yaml")
    assert topo.count("trainer") == 2
    with pytest.raises(TopologyError, match=r"t.yaml:4: roles.trainer.count: must be an integer"):
        load_text(tmp_path, "roles:\n  buffer: {}\n  trainer:\n    count: x\n", "t.yaml")


def test_default_topology_matches_the_flags():
    cfg = parse_config(["--config", DIGITS, "--rollout-num-engines", "2", "--actor-num-gpus-per-node", "2",
                        "--num-reward-workers", "3"])
    topo = default_topology(cfg)
    assert [p.name for p in topo.plan()] == ["buffer/0", "reward/0", "reward/1", "reward/2", "rollout/0",
                                             "rollout/1", "trainer/0", "trainer/1"]
    assert topo.roles["trainer"].policy.group and not topo.roles["rollout"].policy.group


def test_topology_counts_override_flags_and_are_checked():
    topo = from_dict({"roles": {"buffer": {}, "reward": {}, "rollout": {"count": 3}, "trainer": {"count": 4}}})
    cfg = parse_config(["--config", DIGITS])
    changed = topo.apply_to_config(cfg)
    assert cfg.engine.rollout_num_engines == 3 and cfg.train.n_ranks == 4
    assert any("--rollout-num-engines" in c for c in changed)
    topo = from_dict({"roles": {"buffer": {}, "reward": {}, "rollout": {}, "trainer": {"count": 3}}})
    with pytest.raises(TopologyError, match="multiple of the trainer ranks"):
        topo.apply_to_config(parse_config(["--config", DIGITS]))
    topo = from_dict({"roles": {"buffer": {"count": 2}, "reward": {}, "rollout": {}, "trainer": {}}})
    with pytest.raises(TopologyError, match="exactly one buffer"):
        topo.apply_to_config(parse_config(["--config", DIGITS]))


def test_cli_dry_run_and_errors(tmp_path):
    p = subprocess.run([SLIME, "launch", str(ROOT / "examples" / "launch" / "separate-1node.toml"), "--config", DIGITS,
                        "--dry-run"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "rollout/1      gpu[0]       6,7" in p.stdout and "topology sets --actor-num-gpus-per-node 1 -> 4" in p.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[roles.buffer]\n[roles.trainer]\ncount = -1\n")
    p = subprocess.run([SLIME, "launch", str(bad), "--config", DIGITS], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "bad.toml:3: roles.trainer.count: must be an integer >= 0" in p.stderr
    p = subprocess.run([SLIME, "launch", str(ROOT / "examples" / "launch" / "local.toml"), "--roles", "judge", "--dry-run"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "no role 'judge'" in p.stderr
    p = subprocess.run([SLIME, "launch", str(ROOT / "examples" / "launch" / "local.toml"), "--num-rollout", "0"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--num-rollout must be >= 1" in p.stderr


# ------------------------------------------------------------------------------------------------ the launcher
def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_stopping_the_launcher_leaves_no_process(tmp_path, how):
    topo = topology(tmp_path, trainers=1)
    job = Job(tmp_path, topo, [*FAST_FLAGS, "--num-rollout", "1000"]).start()
    try:
        job.wait_step(1, timeout=150)
        st = job.status()
        assert st["actors"]["rollout/0"]["up"] and st["controller"]["phase"]
        engine = job.ask("rollout/0", "engine_info")["pid"]
        pids = [a["pid"] for a in st["actors"].values() if a.get("pid") and a["pid"] != os.getpid()]
        before = job_processes(job.run_dir)
        assert engine in [p for p, _ in before] and len(before) >= 5, before
        job.probe.close()
        job.probe_ = None
        os.kill(job.proc.pid, getattr(signal, how))
        rc = job.proc.wait(60)
        if how == "SIGTERM":
            assert rc == 143, job.log()[-3000:]
        elif how == "SIGINT":
            assert rc == 130, job.log()[-3000:]
        # SIGKILL: the actors get SIGTERM from the kernel (PR_SET_PDEATHSIG) and stop their engines themselves
        # (an exiting process drops its command line before it is gone: wait for both, within the same minute)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60 and (job_processes(job.run_dir) or any(_alive(p) for p in pids + [engine])):
            time.sleep(0.2)
        left = job_processes(job.run_dir)
        assert not left, f"left running after {how} to the launcher: {left}"
        assert not any(_alive(p) for p in pids + [engine])
        if how != "SIGKILL":
            assert f"stopped by {how}" in job.log()
    finally:
        job.close()


DIES_AFTER_START = """
import asyncio
import os
from slime_actors.actors.reward import RewardWorker


class DiesAfterStart(RewardWorker):
    async def on_start(self):
        await super().on_start()
        asyncio.get_running_loop().call_later(0.5, os._exit, 3)   # ready, then gone
"""


def test_restart_intensity_stops_the_job_with_a_report(tmp_path):
    """An actor that was ready and died is restarted under the intensity rule (one that never became ready: the
    start-up rule, tests/test_startup.py)."""
    (tmp_path / "dies.py").write_text(DIES_AFTER_START)
    topo = topology(tmp_path, f"""
[roles.buffer]
[roles.rollout]
[roles.trainer]
[roles.reward]
class = "{tmp_path / 'dies.py'}:DiesAfterStart"
max_restarts = 2
window = 120
""")
    job = Job(tmp_path, topo, [*FAST_FLAGS, "--num-rollout", "3"]).start()
    try:
        rc = job.wait(150)
        out = job.log()
        assert rc == 1, out[-3000:]
        assert "reward/0 died 3 times within 120s (limit 2); last: exited with code 3" in out, out[-3000:]
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30 and job_processes(job.run_dir):
            time.sleep(0.2)
        assert not job_processes(job.run_dir)
        st = json.loads((job.run_dir / "status.json").read_text())
        assert st["processes"]["reward/0"]["restarts"] == 2
    finally:
        job.close()


# ------------------------------------------------------------------------------------------------ role classes, GPUs
JUDGE = "examples/reward_actor/judge.py:DigitJudge"


def test_role_class_and_placed_gpus_reach_the_actor_process(tmp_path):
    from slime_actors.backends.sglang_launch import base_gpu_id
    topo = load_text(tmp_path, f"""
[nodes.gpu]
gpus = 4
[roles.reward]
class = "{JUDGE}"
[roles.rollout]
nodes = "gpu"
count = 2
gpus_per_actor = 2
""")
    plan = {p.name: p for p in topo.plan()}
    env = plan["reward/0"].process_env()
    assert env["SLIME_ACTORS_ACTOR_CLASS"] == JUDGE
    e1 = plan["rollout/1"].process_env()
    assert e1["CUDA_VISIBLE_DEVICES"] == "2,3" and e1["SLIME_ACTORS_GPUS"] == "2,3"
    # the engine of rollout/1 sees GPUs 2,3 as 0,1: it starts at 0, not at the node-wide 2
    # (without a placement, slime's node-wide rule: after the trainers' 2 GPUs, 2 per engine)
    cfg = parse_config(["--config", DIGITS, "--device", "cuda", "--rollout-num-gpus-per-engine", "2",
                        "--num-gpus-per-node", "8", "--actor-num-gpus-per-node", "2", "--rollout-engine", "sglang"])
    assert base_gpu_id(cfg, 1, placed="") == 4
    assert base_gpu_id(cfg, 1, placed="2,3") == 0


def test_a_class_for_another_role_is_refused_naming_both():
    from slime_actors.launch.roles import class_for
    assert class_for("reward", JUDGE).__name__ == "DigitJudge"
    with pytest.raises(TypeError, match=r"plays role 'reward' .*not 'buffer'"):
        class_for("buffer", JUDGE)


@pytest.mark.slow
def test_topology_class_plays_the_role(tmp_path):
    topo = topology(tmp_path, f"""
[roles.buffer]
[roles.reward]
class = "{JUDGE}"
[roles.rollout]
[roles.trainer]
""")
    job = Job(tmp_path, topo, [*FAST_FLAGS, "--num-rollout", "2", "--rm-type", "exact_match"]).start()
    try:
        rc = job.wait(240)
        assert rc == 0, job.log()[-4000:]
        assert job.result()["steps"] == 2
        log = (job.run_dir / "logs" / "reward-0.jsonl").read_text()
        assert '"judge ready"' in log, "reward/0 was not the topology's class"
    finally:
        job.close()


def test_four_gpu_disaggregated_topology_and_script(tmp_path):
    """examples/launch/disagg-4gpu.toml + examples/launch/disagg_4gpu_smollm2.sh (the four-GPU run: Megatron TP 2 on GPUs 0-1, SGLang
    on 2 and 3): the plan, the torchrun rank map, and every flag of the script (CHECK_ONLY=1)."""
    import sys

    from slime_actors.launch.torchrun import role_map
    topo = load_topology(ROOT / "examples" / "launch" / "disagg-4gpu.toml")
    plan = {p.name: p for p in topo.plan()}
    assert [plan[f"trainer/{i}"].gpus for i in (0, 1)] == [[0], [1]]
    assert [plan[f"rollout/{i}"].process_env()["CUDA_VISIBLE_DEVICES"] for i in (0, 1)] == ["2", "3"]
    assert plan["buffer/0"].gpus is None and plan["reward/0"].gpus is None
    assert role_map(topo, 7) == [("head", 0), ("buffer", 0), ("reward", 0), ("rollout", 0), ("rollout", 1),
                                 ("trainer", 0), ("trainer", 1)]   # torchrun --nproc-per-node 7
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    env = {**os.environ, "CHECK_ONLY": "1", "MODEL": str(tmp_path / "m"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    r = subprocess.run(["bash", str(ROOT / "examples" / "launch" / "disagg_4gpu_smollm2.sh")], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok: megatron 2 sglang ['--attention-backend', 'triton'"), r.stdout
    assert "rollout/1      gpu[0]       3" in r.stdout


def test_an_actor_process_with_a_bad_class_exits_naming_it(tmp_path):
    import sys
    env = {**os.environ, "SLIME_ACTORS_RUN_DIR": str(tmp_path / "run"), "SLIME_ACTORS_ACTOR_CLASS": JUDGE}
    env.pop("SLIME_ACTORS_JOB", None)
    r = subprocess.run([sys.executable, "-m", "slime_actors.launch.actor", "buffer", "0"], capture_output=True,
                       text=True, env=env, cwd=str(ROOT), timeout=120)
    assert r.returncode == 78, r.stdout + r.stderr   # a cause no restart changes (launch/startup.py)
    assert "plays role 'reward'" in r.stderr and "not 'buffer'" in r.stderr
    env["SLIME_ACTORS_ACTOR_CLASS"] = "no_such_module_here:Nope"
    r = subprocess.run([sys.executable, "-m", "slime_actors.launch.actor", "buffer", "0"], capture_output=True,
                       text=True, env=env, cwd=str(ROOT), timeout=120)
    assert r.returncode == 78 and "no_such_module_here" in r.stderr, r.stdout + r.stderr
